"""A hand-written forward for small Llama-family decoders, under `HFCausalLM`'s cache bookkeeping.

Why: a draft model is only worth running if it is much cheaper than its target, and for small models on
a CPU the cost of a `transformers` forward is mostly fixed per-call overhead (mask utilities, cache
classes, output capture, module dispatch), several times the arithmetic of a small byte Llama's tree
step (see BENCHMARKS.md, "Per-call overhead: the lean forwards"). `LeanCausalLM` keeps everything `HFCausalLM`
decides (ragged rows, tree masks, positions, commit by gather) and replaces only the model call: fused
q/k/v and gate/up projections, `F.rms_norm`, one rotary pass over q and k, SDPA with grouped heads, and a
preallocated KV buffer that grows by doubling instead of a concatenation per layer per step.

Supported: `llama`, `mistral` and `qwen2` configs with SiLU MLPs, default RoPE, and either no sliding
window or one in every layer (`lean_unsupported(model)` says why another model is not). It serves as
a target too (final hidden states for feature-level drafters included) and runs EAGLE heads. Weights are packed at `start` and re-packed
there when a parameter was modified in place or replaced since (tracked by tensor version counters); do
not change the weights in the middle of a generation.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from .base import NO_FEATURES, FeatureRequest, Features
from .hf import HFCausalLM, attention_layer_types
from .lm_head import tall_lm_head

LEAN_MODEL_TYPES = ("llama", "mistral", "qwen2")


def unsupported_class(model: object, model_types: tuple[str, ...]) -> str | None:
    """Why `model` is not a `transformers` model of one of `model_types` (None if it is)."""
    if not isinstance(model, PreTrainedModel):
        return f"not a transformers PreTrainedModel ({type(model).__name__})"
    if model.config.model_type not in model_types:
        return f"model_type {model.config.model_type!r} (supported: {', '.join(model_types)})"
    return None


def dispatched(model: object) -> bool:
    """Whether `accelerate` dispatched `model` (`device_map=`): weights spread over devices, or offloaded to the
    CPU or disk and moved in by hooks around each module's forward. A lean forward reads the weights itself and
    would find them on the meta device; the model's own forward runs the hooks."""
    if getattr(model, "hf_device_map", None) is not None and len(set(model.hf_device_map.values())) > 1:
        return True
    modules = model.modules() if isinstance(model, torch.nn.Module) else ()
    return any(hasattr(m, "_hf_hook") for m in modules)


def lean_unsupported(model: object) -> str | None:
    """None if `LeanCausalLM` can run `model` exactly like `transformers` does, else the reason why not."""
    reason = unsupported_class(model, LEAN_MODEL_TYPES)
    if reason is not None:
        return reason
    if dispatched(model):
        return "dispatched by accelerate (device_map): its own forward moves the offloaded weights in"
    config = model.config
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (only silu)"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope_type {rope.get('rope_type')!r} (only default RoPE)"
    types, window = attention_layer_types(config)
    if window is not None and set(types) != {"sliding_attention"}:
        return "sliding-window attention in some layers only"
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
        return f"{type(model).__name__} does not have the Llama module layout (model.layers, model.rotary_emb)"
    return None


def _rotate_half_rows(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows (or bias entries) whose output is rotate_half(output) per head: [-x2, x1] for x = [x1, x2]."""
    w = weight.reshape(-1, head_dim, *weight.shape[1:])
    half = head_dim // 2
    return torch.cat([-w[:, half:], w[:, :half]], dim=1).reshape(weight.shape)


class UsedColumns:
    """A K or V buffer attribute of `BufferedLayer`, seen as its used columns; assigning goes through
    `_adopt`."""

    def __set_name__(self, owner, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, layer, owner=None):
        if layer is None:
            return self
        buf = getattr(layer, self.slot)
        return None if buf is None else buf[:, :, : layer.used]

    def __set__(self, layer, value: torch.Tensor) -> None:
        buf, layer.used = layer._adopt(getattr(layer, self.slot), value)
        setattr(layer, self.slot, buf)


class BufferedLayer:
    """One layer's K/V in a buffer with spare columns. `keys`/`values` are views of the used columns;
    assigning a prefix view (a crop) only moves the boundary, assigning anything else replaces the buffer."""

    keys = UsedColumns()
    values = UsedColumns()

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.used = 0

    @staticmethod
    def _adopt(buf: torch.Tensor | None, value: torch.Tensor) -> tuple[torch.Tensor, int]:
        if buf is not None and value.data_ptr() == buf.data_ptr() and value.stride() == buf.stride():
            return buf, value.shape[2]  # a crop: same storage, fewer columns
        spare = torch.empty(*value.shape[:2], max(2 * value.shape[2], 64), value.shape[3],
                            dtype=value.dtype, device=value.device)
        spare[:, :, : value.shape[2]] = value
        return spare, value.shape[2]

    def reserve(self, batch: int, columns: int, attn) -> None:
        """Start with `columns` unused (zero) columns: the cache layout of a prompt whose head is skipped."""
        kv_heads = attn.k_proj.weight.shape[0] // attn.head_dim
        shape = (batch, kv_heads, columns, attn.head_dim)
        w = attn.k_proj.weight
        self.keys = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.values = torch.zeros(shape, dtype=w.dtype, device=w.device)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new columns after the used ones; return all used columns."""
        n, m = self.used, k.shape[2]
        if self._keys is None or n + m > self._keys.shape[2] or self._keys.shape[0] != k.shape[0]:
            grown = max(2 * (n + m), 64)
            for name, new in (("_keys", k), ("_values", v)):
                old = getattr(self, name)
                buf = torch.empty(*new.shape[:2], grown, new.shape[3], dtype=new.dtype, device=new.device)
                if n:
                    buf[:, :, :n] = old[:, :, :n]
                setattr(self, name, buf)
        self._keys[:, :, n: n + m] = k
        self._values[:, :, n: n + m] = v
        self.used = n + m
        return self._keys[:, :, : n + m], self._values[:, :, : n + m]


class BufferedCache:
    def __init__(self, num_layers: int) -> None:
        self.layers = [BufferedLayer() for _ in range(num_layers)]


class LeanCausalLM(HFCausalLM):
    """`HFCausalLM` with a direct forward for Llama-family decoders (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, name: str = "draft_model", window: int | None = None):
        """`window`: attend to (and prefill) only about the last `window` committed tokens, plus the
        pending ones. For a draft model that trades a little proposal quality for a cost that no longer
        grows with the context (speculation stays lossless: the target verifies). None: full attention."""
        reason = lean_unsupported(model)
        if reason is not None:
            raise TypeError(f"{name}: the lean engine does not support this model: {reason}")
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window: expected None or a positive int, got {window!r}")
        super().__init__(model, name)
        self.window = window
        self._lo = 0  # first cache column the current call attends to
        self._packed: list | None = None
        self._packed_key: tuple | None = None
        self._rope_table: torch.Tensor | None = None

    def new_cache(self) -> BufferedCache:
        self._pack()  # once per generation, not per call (the check's cost: BENCHMARKS.md, "Per-call overhead")
        return BufferedCache(len(self.model.model.layers))

    def _pack(self) -> list:
        """Per layer (norm weights, fused qkv weight/bias, o weight/bias, fused gate-up, down): rebuilt
        only when a parameter changed."""
        params = list(self.model.parameters())
        key = tuple((p.data_ptr(), p._version) for p in params)
        if key == self._packed_key:
            return self._packed
        packed = []
        for layer in self.model.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            qkv = [at.q_proj, at.k_proj, at.v_proj]
            weights, biases = [p.weight for p in qkv], [p.bias for p in qkv]
            # rotate_half is linear: its q/k outputs come from the same matmul as extra rows (no cat/neg)
            weights += [_rotate_half_rows(at.q_proj.weight, at.head_dim),
                        _rotate_half_rows(at.k_proj.weight, at.head_dim)]
            biases += [None if at.q_proj.bias is None else _rotate_half_rows(at.q_proj.bias, at.head_dim),
                       None if at.k_proj.bias is None else _rotate_half_rows(at.k_proj.bias, at.head_dim)]
            bias = torch.cat(biases) if at.q_proj.bias is not None else None
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            gate_up_bias = (torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
                            if mlp.gate_proj.bias is not None else None)
            packed.append(SimpleNamespace(
                ln1=layer.input_layernorm.weight, eps1=layer.input_layernorm.variance_epsilon,
                qkv=torch.cat(weights), qkv_bias=bias,
                o=at.o_proj.weight, o_bias=at.o_proj.bias, scaling=at.scaling,
                heads=at.q_proj.weight.shape[0] // at.head_dim, kv_heads=at.k_proj.weight.shape[0] // at.head_dim,
                head_dim=at.head_dim,
                ln2=layer.post_attention_layernorm.weight, eps2=layer.post_attention_layernorm.variance_epsilon,
                gate_up=gate_up, gate_up_bias=gate_up_bias, down=mlp.down_proj.weight, down_bias=mlp.down_proj.bias))
        self._packed, self._packed_key, self._rope_table = packed, key, None
        return packed

    @torch.no_grad()
    def prefill_forward(self, ids: torch.Tensor, mask2d: torch.Tensor, request: FeatureRequest = NO_FEATURES,
                 inputs_embeds: torch.Tensor | None = None) -> Features | None:
        self._lo = 0
        if not bool(mask2d.all()):
            return super().prefill_forward(ids, mask2d, request, inputs_embeds)
        if self.sliding_window is not None and ids.shape[1] > self.sliding_window:
            return super().prefill_forward(ids, mask2d, request, inputs_embeds)  # a banded mask
        # no padding: plain causal attention, without building (and reading) an L x L float mask
        n = ids.shape[1]
        skip = n - self.window if self.window is not None and n > self.window else 0
        if skip:
            # a window: the columns before it are never read; treat them as padding (positions restart)
            for layer in self.cache.layers:
                layer.reserve(ids.shape[0], skip, self.model.model.layers[0].self_attn)
            self.start_col = torch.full_like(self.start_col, skip)
            self._lo = skip
        pos = torch.arange(n - skip, device=self.device).expand(ids.shape[0], n - skip)
        tokens = dict(input_ids=ids[:, skip:]) if inputs_embeds is None else dict(inputs_embeds=inputs_embeds[:, skip:])
        _, features = self.run_forward(request, attention_mask=None, position_ids=pos, cache_position=pos[0],
                                logits_to_keep=1, **tokens)
        if features is not None and skip:  # the skipped head of the prompt has no features: zeros
            def pad(t: torch.Tensor) -> torch.Tensor:
                return torch.cat([t.new_zeros(t.shape[0], skip, t.shape[2]), t], 1)

            features = Features(None if features.hidden is None else pad(features.hidden),
                                {i: pad(t) for i, t in features.layers.items()})
        return features

    def _first_read_column(self) -> int:
        # every row still sees at least its last `window` committed tokens; the mask starts at that column
        self._lo = max(0, min(self.host_length) - self.window) if self.window is not None else 0
        return self._lo

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, M, D] for `positions` [B, M], read from a table built once (and doubled when a
        position runs past it): one index per call instead of ten elementwise ops."""
        need = int(positions.max()) + 1 if positions.numel() else 1
        if self._rope_table is None or self._rope_table.shape[1] < need or self._rope_table.dtype != dtype:
            rope = self.model.model.rotary_emb
            size = max(need, 2 * (0 if self._rope_table is None else self._rope_table.shape[1]), 256)
            freqs = torch.arange(size, device=self.device, dtype=torch.float32)[:, None] * rope.inv_freq.float()
            emb = torch.cat([freqs, freqs], dim=-1)
            self._rope_table = torch.stack([emb.cos(), emb.sin()]).mul(rope.attention_scaling).to(dtype)
        table = self._rope_table[:, positions]  # [2, B, M, D]
        return table[0, :, None], table[1, :, None]

    def run_forward(self, request: FeatureRequest, attention_mask: torch.Tensor, position_ids: torch.Tensor,
             cache_position: torch.Tensor, input_ids: torch.Tensor | None = None,
             inputs_embeds: torch.Tensor | None = None, logits_to_keep: int = 0):
        if isinstance(attention_mask, dict):
            raise ValueError("attention_mask: per-layer-type masks are not supported by the lean engine")
        decoder = self.model.model
        lo = self._lo  # masks built for this call already start at column `lo`
        x = decoder.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        b, m, _ = x.shape
        cos, sin = self._rotary(position_ids, x.dtype)
        layers = {}
        for i, (p, layer_cache) in enumerate(zip(self._packed, self.cache.layers)):
            if i in request.layers:
                layers[i] = x
            h = F.rms_norm(x, (x.shape[-1],), p.ln1, p.eps1)
            n_qk = p.heads + p.kv_heads
            qkv = F.linear(h, p.qkv, p.qkv_bias).view(b, m, 2 * n_qk + p.kv_heads, p.head_dim).transpose(1, 2)
            qk = qkv[:, :n_qk] * cos + qkv[:, n_qk + p.kv_heads:] * sin  # rotary: x cos + rotate_half(x) sin
            keys, values = layer_cache.append(qk[:, p.heads:], qkv[:, n_qk: n_qk + p.kv_heads])
            keys, values = keys[:, :, lo:], values[:, :, lo:]
            attn = F.scaled_dot_product_attention(qk[:, : p.heads], keys, values, attn_mask=attention_mask,
                                                  is_causal=attention_mask is None, scale=p.scaling,
                                                  enable_gqa=p.heads != p.kv_heads)
            x = x + F.linear(attn.transpose(1, 2).reshape(b, m, -1), p.o, p.o_bias)
            h = F.rms_norm(x, (x.shape[-1],), p.ln2, p.eps2)
            gate, up = F.linear(h, p.gate_up, p.gate_up_bias).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, p.down, p.down_bias)
        if len(self._packed) in request.layers:
            layers[len(self._packed)] = x
        if logits_to_keep and not request.hidden:
            x = x[:, -logits_to_keep:]
        x = F.rms_norm(x, (x.shape[-1],), decoder.norm.weight, decoder.norm.variance_epsilon)
        features = None if request.empty else Features(x if request.hidden else None, layers)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        with tall_lm_head(self.model):
            return SimpleNamespace(logits=self.model.lm_head(x)), features
