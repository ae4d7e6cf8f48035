"""A hand-written forward for Gemma 3 text decoders (`Gemma3ForCausalLM`), under `HFCausalLM`'s cache
bookkeeping, as `lean.LeanCausalLM` is for Llama-family models.

What differs from Llama, and is reproduced here: embeddings scaled by sqrt(hidden); RMS norms that scale by
(1 + weight) in float32; per-head RMS norms on queries and keys before the rotary; a local rotary (for
sliding-window layers) and a global one (for full-attention layers) with their own bases; attention
scaled by `query_pre_attn_scalar ** -0.5`; norms after attention and after the MLP as well as before;
a tanh-GELU gated MLP. The mask of each layer is its type's (sliding or full). Softcapping variants
(Gemma 2 style) are refused by `lean_gemma_unsupported`.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from .base import FeatureRequest, Features
from .lean import LeanCausalLM, BufferedCache, dispatched, unsupported_class
from .lm_head import tall_lm_head

GEMMA_MODEL_TYPES = ("gemma3_text",)


def lean_gemma_unsupported(model: object) -> str | None:
    """None if `LeanGemma3CausalLM` computes what `transformers` computes for `model`, else why not."""
    reason = unsupported_class(model, GEMMA_MODEL_TYPES)
    if reason is not None:
        return reason
    if dispatched(model):
        return "dispatched by accelerate (device_map): its own forward moves the offloaded weights in"
    config = model.config
    if getattr(config, "final_logit_softcapping", None) is not None or getattr(config, "attn_logit_softcapping", None):
        return "logit softcapping"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention"
    if getattr(config, "hidden_activation", None) != "gelu_pytorch_tanh":
        return f"hidden_activation {getattr(config, 'hidden_activation', None)!r} (only gelu_pytorch_tanh)"
    rope = getattr(config, "rope_parameters", None) or {}
    if any((rope.get(t) or {}).get("rope_type", "default") != "default" for t in set(config.layer_types)):
        return "a rope_type other than default"
    return None


class LeanGemma3CausalLM(LeanCausalLM):
    """`HFCausalLM` with a direct forward for Gemma 3 decoders (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, name: str = "target", window: int | None = None):
        reason = lean_gemma_unsupported(model)
        if reason is not None:
            raise TypeError(f"{name}: the lean Gemma 3 engine does not support this model: {reason}")
        if window is not None:
            raise ValueError("window: not supported by the lean Gemma 3 engine")
        super(LeanCausalLM, self).__init__(model, name)  # HFCausalLM's bookkeeping; LeanCausalLM's checks differ
        self.window = None
        self._lo = 0
        self._packed = None
        self._packed_key = None
        self._rope_tables: dict[str, torch.Tensor] = {}

    def new_cache(self) -> BufferedCache:
        self._pack()
        return BufferedCache(len(self.model.model.layers))

    def _pack(self) -> list:
        params = list(self.model.parameters())
        key = tuple((p.data_ptr(), p._version) for p in params)
        if key == self._packed_key:
            return self._packed
        one = lambda norm: 1.0 + norm.weight.float()  # noqa: E731 - Gemma's norms scale by (1 + w)
        packed = []
        for layer in self.model.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            packed.append(SimpleNamespace(
                kind=at.layer_type, ln_in=one(layer.input_layernorm), ln_post_attn=one(layer.post_attention_layernorm),
                ln_pre_ff=one(layer.pre_feedforward_layernorm), ln_post_ff=one(layer.post_feedforward_layernorm),
                eps=layer.input_layernorm.eps, q_norm=one(at.q_norm), k_norm=one(at.k_norm), qk_eps=at.q_norm.eps,
                qkv=torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]),
                qkv_bias=(torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
                          if at.q_proj.bias is not None else None),
                o=at.o_proj.weight, o_bias=at.o_proj.bias, scaling=at.scaling, head_dim=at.head_dim,
                heads=at.q_proj.weight.shape[0] // at.head_dim, kv_heads=at.k_proj.weight.shape[0] // at.head_dim,
                gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), down=mlp.down_proj.weight))
        self._packed, self._packed_key, self._rope_tables = packed, key, {}
        return packed

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype, kind: str = "full_attention"):
        """cos, sin [B, 1, M, D] of the layer type's rotary, from a table per type."""
        need = int(positions.max()) + 1 if positions.numel() else 1
        table = self._rope_tables.get(kind)
        if table is None or table.shape[1] < need or table.dtype != dtype:
            rope = self.model.model.rotary_emb
            size = max(need, 2 * (0 if table is None else table.shape[1]), 256)
            inv_freq = getattr(rope, f"{kind}_inv_freq").float()
            freqs = torch.arange(size, device=self.device, dtype=torch.float32)[:, None] * inv_freq
            emb = torch.cat([freqs, freqs], dim=-1)
            scaling = getattr(rope, f"{kind}_attention_scaling")
            table = torch.stack([emb.cos() * scaling, emb.sin() * scaling]).to(dtype)
            self._rope_tables[kind] = table
        picked = table[:, positions]
        return picked[0, :, None], picked[1, :, None]

    @staticmethod
    def _norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), scale, eps).to(x.dtype)

    def run_forward(self, request: FeatureRequest, attention_mask, position_ids: torch.Tensor,
             cache_position: torch.Tensor, input_ids: torch.Tensor | None = None,
             inputs_embeds: torch.Tensor | None = None, logits_to_keep: int = 0):
        decoder = self.model.model
        x = decoder.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        b, m, _ = x.shape
        rotary = {kind: self._rotary(position_ids, x.dtype, kind) for kind in {p.kind for p in self._packed}}
        layers = {}
        for i, (p, layer_cache) in enumerate(zip(self._packed, self.cache.layers)):
            if i in request.layers:
                layers[i] = x
            mask = attention_mask[p.kind] if isinstance(attention_mask, dict) else attention_mask
            cos, sin = rotary[p.kind]
            h = self._norm(x, p.ln_in, p.eps)
            qkv = F.linear(h, p.qkv, p.qkv_bias).view(b, m, p.heads + 2 * p.kv_heads, p.head_dim)
            q, k, v = qkv.split([p.heads, p.kv_heads, p.kv_heads], dim=2)
            qk = torch.cat([self._norm(q, p.q_norm, p.qk_eps), self._norm(k, p.k_norm, p.qk_eps)], dim=2)
            qk = qk.transpose(1, 2)  # [B, H + KV, M, D]
            half = p.head_dim // 2
            turned = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
            qk = qk * cos + turned * sin
            keys, values = layer_cache.append(qk[:, p.heads:], v.transpose(1, 2))
            attn = F.scaled_dot_product_attention(qk[:, : p.heads], keys, values, attn_mask=mask,
                                                  is_causal=mask is None, scale=p.scaling,
                                                  enable_gqa=p.heads != p.kv_heads)
            attn = F.linear(attn.transpose(1, 2).reshape(b, m, -1), p.o, p.o_bias)
            x = x + self._norm(attn, p.ln_post_attn, p.eps)
            gate, up = F.linear(self._norm(x, p.ln_pre_ff, p.eps), p.gate_up).chunk(2, dim=-1)
            ff = F.linear(F.gelu(gate, approximate="tanh") * up, p.down)
            x = x + self._norm(ff, p.ln_post_ff, p.eps)
        if len(self._packed) in request.layers:
            layers[len(self._packed)] = x
        if logits_to_keep and not request.hidden:
            x = x[:, -logits_to_keep:]
        x = self._norm(x, 1.0 + decoder.norm.weight.float(), decoder.norm.eps)
        features = None if request.empty else Features(x if request.hidden else None, layers)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        with tall_lm_head(self.model):
            return SimpleNamespace(logits=self.model.lm_head(x)), features
