"""EAGLE-3: a one-layer draft over three of the target's layers, trained on its own predictions.

The head (`Eagle3Head`) fuses the residual streams entering three target layers (low, middle, high:
`aux_layers`, by default 2, L // 2 and L - 3) into one feature, `g = fc(cat(a_low, a_mid, a_high))` [H]. Its one
decoder layer reads, at each position, the next token's embedding and a feature side by side: attention over
`cat(input_layernorm(emb(x)), hidden_norm(g))` [2H], the residual is `g`; the layer's output `h` (before the
final norm) is the feature of the next position when the draft continues on its own predictions, and
`lm_head(norm(h))` scores the draft vocabulary (`d2t`: draft index -> target id, the most frequent tokens of the
training text). Training unrolls the draft on its own features for several steps ("training-time test",
`Eagle3Head.unrolled`), as it will run when drafting a chain or a tree.

On disk a head is in one of two layouts, both read and written here (`save(layout=...)`):
- "eagle3" (the default), the reference layout vLLM and SGLang serve directly (architecture
  `LlamaForCausalLMEagle3`, Llama keys at the top level): `fc.weight` [H, 3Ht], `midlayer.{input_layernorm,
  hidden_norm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}`, `norm.weight`,
  `lm_head.weight` [Vd, H], `d2t` (int64 [Vd], as an offset: target id = i + d2t[i]) and `t2d` (bool [V]); the
  target's embeddings are shared, not stored;
- "speculators", the vLLM project's speculators library's (`Eagle3Speculator`, `speculators_config`, the layer's
  Llama config nested as `transformer_layer_config`, weights `layers.0.*`, the embeddings stored), which
  `speculators`' `SpeculatorModel.from_pretrained` loads with no conversion.
Reading takes either (and `pytorch_model.bin`): `rope_theta` from `rope_parameters` or the top level, a RoPE
scaling (`rope_type` linear, llama3, yarn; dynamic and longrope refused), and the variants speculators trains:
`norm_before_residual` (the residual is the normed feature; a speculators file without the key means true, as vLLM
reads it; a reference file without it, false), `norm_before_fc` / `fc_norm` (an RMS norm over the fused layers,
whole or per layer) and `norm_output` (the normed output is the next step's feature). A head whose checkpoint
stores embeddings other than the target's drafts with its own.

At run time the layer runs through the core's generic adapter (`HFCausalLM`: ragged caches, trees), fed
`cat(emb(x), feature)` as its input embeddings; `Eagle3Drafter` is `EagleDrafter` with the fused target
features in place of the final hidden state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from ..targets.base import FeatureRequest, Features
from ..targets.hf import HFCausalLM, check_causal_lm, output_vocab_size
from .eagle import EagleDrafter, check_d2t

ARCHITECTURE = "LlamaForCausalLMEagle3"  # what vLLM and SGLang register EAGLE-3 Llama heads under


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose entering residual streams EAGLE-3 fuses: (2, L // 2, L - 3) as vLLM and SGLang
    choose them; for a target too shallow for those to rise, a quarter, half and three quarters of the way
    (layer L is the last layer's output)."""
    if num_layers < 1:
        raise ValueError(f"num_layers: expected >= 1, got {num_layers}")
    ids = (2, num_layers // 2, num_layers - 3)
    if 0 <= ids[0] < ids[1] < ids[2]:
        return ids
    return (round(num_layers / 4), num_layers // 2, max(num_layers // 2, round(3 * num_layers / 4)))


@dataclass
class Eagle3Config:
    hidden_size: int  # the draft layer's width
    target_hidden_size: int  # the width of each fused target layer
    draft_vocab_size: int
    target_vocab_size: int
    aux_layers: tuple[int, ...]  # residual streams entering these target layers (vLLM's numbering)
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size / num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    # RoPE scaling beyond theta, as `transformers` names it ({"rope_type": "llama3", "factor": 8.0, ...}); None: none
    rope_scaling: dict | None = None
    norm_before_residual: bool = False  # the layer's residual is hidden_norm(feature), not the feature
    norm_before_fc: bool = False  # one RMS norm over the three fused layers side by side, before fc
    fc_norm: bool = False  # one RMS norm per fused layer, before fc
    norm_output: bool = False  # the final norm's output is both the LM head's input and the next step's feature
    extra: dict = field(default_factory=dict)  # config keys read from a checkpoint that we keep and write back

    def __post_init__(self) -> None:
        self.aux_layers = tuple(int(i) for i in self.aux_layers)
        if len(self.aux_layers) != 3 or list(self.aux_layers) != sorted(self.aux_layers) or min(self.aux_layers) < 0:
            raise ValueError(f"aux_layers: expected three ascending layer ids, got {self.aux_layers}")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc, fc_norm: one or the other, not both (as speculators defines them)")
        if self.rope_scaling is not None:
            self.rope_scaling = dict(self.rope_scaling)
            self.rope_scaling.pop("rope_theta", None)
            if "type" in self.rope_scaling:  # transformers 4's key
                self.rope_scaling.setdefault("rope_type", self.rope_scaling.pop("type"))
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind in ("dynamic", "longrope"):
                raise ValueError(f"rope_type: {kind!r} changes with the sequence length; an EAGLE-3 head with it is "
                                 f"not served (default, linear, llama3 and yarn are)")
            if kind == "default" and len(self.rope_scaling) <= 1:
                self.rope_scaling = None

    @property
    def rope_parameters(self) -> dict:
        """`transformers` 5's `rope_parameters` of the layer (theta and scaling together)."""
        return {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}

    def llama_config(self, vocab_size: int | None = None) -> LlamaConfig:
        """The `transformers` config of the draft layer (one layer of full attention; `vocab_size` default the draft
        vocabulary, which the core's adapter reads)."""
        return LlamaConfig(vocab_size=vocab_size or self.draft_vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=1,
                           num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                           head_dim=self.head_dim, rope_parameters=self.rope_parameters, rms_norm_eps=self.rms_norm_eps,
                           max_position_embeddings=self.max_position_embeddings, tie_word_embeddings=False)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def rope_frequencies(c: Eagle3Config) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [D / 2], the cos/sin scale) of the layer's RoPE: Llama's for theta alone, else
    `transformers`' own function for the scaling type."""
    if c.rope_scaling is None:
        inv = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = c.rope_scaling.get("rope_type", c.rope_scaling.get("type"))
    if kind not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_type: {kind!r} is not a RoPE type this transformers knows")
    inv, scale = ROPE_INIT_FUNCTIONS[kind](c.llama_config(), "cpu")
    return inv.float(), float(scale)


def rotary(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [B, 1, T, D] of Llama's rotary embedding at `positions` [B, T]."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos() * scale, emb.sin() * scale


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Eagle3Attention(nn.Module):
    """Attention whose queries, keys and values read the [2H] input (embedding and feature side by side)."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        # float32 whatever the head's dtype: a plain attribute (module casts leave it), moved to the device once
        self.inv_freq, self.rope_scale = rope_frequencies(c)
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(q [B, nh, T, D], k, v [B, nkv, T, D]) of `x` [B, T, 2H] at `positions` [B, T], rotary applied."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        cos, sin = rotary(positions, self.inv_freq, self.rope_scale)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """`mask` [B, 1, T, S]: additive float, or bool (True = attend)."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Eagle3Layer(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.norm_before_residual = c.norm_before_residual
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Eagle3Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = nn.ModuleDict({"gate_proj": nn.Linear(c.hidden_size, c.intermediate_size, bias=False),
                                  "up_proj": nn.Linear(c.hidden_size, c.intermediate_size, bias=False),
                                  "down_proj": nn.Linear(c.intermediate_size, c.hidden_size, bias=False)})

    def inputs(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The attention input [B, T, 2H]: the normed embedding and the normed feature, side by side."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(features)], dim=-1)

    def finish(self, features: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output (before the final norm) from the feature it read and the attention output: the
        residual is the feature, or its normed form (`norm_before_residual`)."""
        residual = self.hidden_norm(features) if self.norm_before_residual else features
        h = residual + attended
        x = self.post_attention_layernorm(h)
        return h + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](x)) * self.mlp["up_proj"](x))


class _Decoder(nn.Module):
    """The layer as the core's adapter drives it: input embeddings [B, T, 2H] = cat(emb(x), feature), a
    `transformers` cache (layer 0), positions and an additive mask; the output hidden state is `h` (pre-norm)."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.layers = nn.ModuleList([Eagle3Layer(c)])

    def forward(self, inputs_embeds: torch.Tensor, attention_mask=None, position_ids=None, past_key_values=None,
                cache_position=None, **_) -> BaseModelOutputWithPast:
        layer = self.layers[0]
        h = inputs_embeds.shape[-1] // 2
        embeds, features = inputs_embeds[..., :h], inputs_embeds[..., h:]
        b, t, _ = inputs_embeds.shape
        if position_ids is None:
            start = 0 if past_key_values is None else past_key_values.get_seq_length()
            position_ids = torch.arange(start, start + t, device=inputs_embeds.device).expand(b, t)
        q, k, v = layer.self_attn.project(layer.inputs(embeds, features), position_ids)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, 0)
        mask = _additive(attention_mask, q, k)
        hidden = layer.finish(features, layer.self_attn.attend(q, k, v, mask))
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=past_key_values)


def _additive(mask, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The adapter's mask (a tensor, or a dict by layer type: one layer of full attention here) as [B, 1, T, S];
    None: causal over the keys' last T columns (a plain call without the adapter)."""
    if isinstance(mask, dict):
        mask = mask["full_attention"]
    if mask is not None and mask.dim() == 4:
        return mask.to(q.dtype) if mask.is_floating_point() else mask
    t, s = q.shape[2], k.shape[2]
    allowed = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if mask is not None:  # a 2-D padding mask over the keys
        allowed = allowed[None, None] & mask[:, None, None, -s:].bool()
    return allowed


class Eagle3Head(PreTrainedModel):
    """fc over three target layers + one decoder layer over [embedding; feature] + the draft vocabulary's head."""

    config_class = LlamaConfig
    base_model_prefix = "decoder"

    def __init__(self, config: Eagle3Config, d2t: torch.Tensor | None = None):
        super().__init__(config.llama_config())
        self.eagle = config
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        # speculators' variants: an RMS norm over the fused layers side by side, or one per layer, before fc
        self.input_norm = RMSNorm(3 * config.target_hidden_size, config.rms_norm_eps) if config.norm_before_fc else None
        self.fc_norm = nn.ModuleList([RMSNorm(config.target_hidden_size, config.rms_norm_eps) for _ in range(3)]
                                     ) if config.fc_norm else None
        self.embed_tokens: nn.Embedding | None = None  # set when a checkpoint's embeddings are not the target's
        self.decoder = _Decoder(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        if d2t is None:
            d2t = torch.arange(config.draft_vocab_size)
        self.register_buffer("d2t", check_d2t(d2t, config.draft_vocab_size, config.target_vocab_size).clone())
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def layer(self) -> Eagle3Layer:
        return self.decoder.layers[0]

    @property
    def feature_request(self) -> FeatureRequest:
        return FeatureRequest(layers=self.eagle.aux_layers)

    def get_decoder(self) -> nn.Module:
        return self.decoder

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def get_input_embeddings(self) -> nn.Module | None:
        return None  # the target's are shared

    def fuse_target(self, features: Features | dict[int, torch.Tensor]) -> torch.Tensor:
        """g [B, N, H] from the target's residual streams entering `aux_layers` ([B, N, Ht] each)."""
        layers = features.layers if isinstance(features, Features) else features
        missing = [i for i in self.eagle.aux_layers if i not in layers]
        if missing:
            raise ValueError(f"features: the EAGLE-3 head reads target layers {list(self.eagle.aux_layers)}; "
                             f"missing {missing}")
        parts = [layers[i].to(self.fc.weight.dtype) for i in self.eagle.aux_layers]
        if self.fc_norm is not None:
            parts = [norm(part) for norm, part in zip(self.fc_norm, parts)]
        fused = torch.cat(parts, dim=-1)
        if self.input_norm is not None:
            fused = self.input_norm(fused)
        return self.fc(fused)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask=None, position_ids=None, past_key_values=None,
                cache_position=None, logits_to_keep: int = 0, **kwargs) -> CausalLMOutputWithPast:
        """One pass over `inputs_embeds` [B, T, 2H] = cat(emb(x), feature): draft logits [B, T, Vd] (the last
        `logits_to_keep` positions when given) and, as the hidden state, each position's output `h`."""
        out = self.decoder(inputs_embeds, attention_mask, position_ids, past_key_values, cache_position)
        hidden = out.last_hidden_state
        if self.eagle.norm_output:  # the normed output is the next step's feature and the LM head's input
            hidden = self.norm(hidden)
        kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return CausalLMOutputWithPast(logits=self.lm_head(self.normed(kept)), past_key_values=past_key_values,
                                      hidden_states=(hidden,))

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's input from the layer's output as `forward` returns it (already normed with `norm_output`)."""
        return hidden if self.eagle.norm_output else self.norm(hidden)

    # ---- training: the draft unrolled on its own features ----------------------------------------------
    def unrolled(self, embeds: torch.Tensor, g: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test. `embeds` [B, S, H]: emb(x_1 .. x_S) (position t pairs the token after position t
        with its feature); `g` [B, S, H]: the fused target features of positions 0 .. S-1. Step 0 is the
        teacher-forced pass (position t reads g_t); step j reads, at position t, its own step-(j-1) output
        there and the embedding j tokens further on, and attends to step 0's entries up to t and to its own
        earlier steps at t: exactly what a chain drafted from root t sees. Returns each step's draft logits
        [B, S - j, Vd] (position t of step j predicts the target's distribution at position t + j + 1)."""
        b, s, _ = g.shape
        positions = torch.arange(s, device=g.device).expand(b, s)
        layer, attn = self.layer, self.layer.self_attn
        causal = torch.ones(s, s, dtype=torch.bool, device=g.device).tril()
        keys, values, logits, features = [], [], [], g
        for j in range(steps):
            n = s - j  # positions 0 .. n-1 still have a token j + 1 ahead
            q, k, v = attn.project(layer.inputs(embeds[:, j: j + n], features[:, :n]), positions[:, :n] + j)
            keys.append(k)
            values.append(v)
            # keys: step 0 causal over its columns; each later step i <= j on the diagonal (the same position)
            blocks = [causal[:n, :s]] + [torch.eye(n, s - i, dtype=torch.bool, device=g.device)
                                         for i in range(1, j + 1)]
            mask = torch.cat(blocks, dim=1)[None, None]
            hidden = layer.finish(features[:, :n], attn.attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
                                                               mask))
            if self.eagle.norm_output:
                hidden = self.norm(hidden)
            logits.append(self.lm_head(self.normed(hidden)))
            features = hidden
        return logits

    # ---- persistence (the reference EAGLE-3 layout, or speculators') ---------------------------------------
    def save(self, folder: str | Path, dtype: torch.dtype = torch.float16, layout: str = "eagle3",
             target: PreTrainedModel | None = None, verifier: str | None = None) -> None:
        """Write the head in `layout` "eagle3" (the reference layout vLLM and SGLang serve) or "speculators" (which
        `speculators` loads unchanged; it stores the embeddings, so `target`, the model the head drafts for, is
        needed unless the head has its own; `verifier`: the target's name or path, which speculators and
        `vllm serve` read to find it)."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        prefix = "midlayer." if layout == "eagle3" else "layers.0."
        tensors = {_disk_name(k, prefix): (v.to(dtype) if v.is_floating_point() else v).contiguous()
                   for k, v in self.state_dict().items() if k != "d2t"}
        ids = self.d2t.long()
        tensors["d2t"] = (ids - torch.arange(len(ids), device=ids.device)).contiguous()  # offsets, as on disk
        t2d = torch.zeros(self.eagle.target_vocab_size, dtype=torch.bool)
        t2d[ids.cpu()] = True
        tensors["t2d"] = t2d
        if layout == "speculators" and "embed_tokens.weight" not in tensors:
            if target is None:
                raise ValueError("target: the speculators layout stores the embeddings; pass the model the head "
                                 "drafts for")
            tensors["embed_tokens.weight"] = embedding_table(target).to(dtype).contiguous()
        save_file({k: v.cpu() for k, v in tensors.items()}, str(folder / "model.safetensors"))
        if layout == "eagle3":
            config = export_config(self.eagle)
        else:
            architectures = list(getattr(target.config, "architectures", None) or [type(target).__name__]) \
                if target is not None else None
            config = export_speculators_config(self.eagle, verifier, architectures)
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    @staticmethod
    def load(folder: str | Path, dtype: torch.dtype = torch.float32, target=None) -> "Eagle3Head":
        """A head saved in either EAGLE-3 layout (ours, vLLM's, SGLang's or speculators'; `target`: the model it
        drafts for, which fills in what a checkpoint may leave out: its vocabulary size and layer count, and whose
        embeddings the head uses unless the checkpoint stores others)."""
        folder = Path(folder)
        config = read_config(folder, target)
        tensors = read_weights(folder)
        vd = config.draft_vocab_size
        d2t = tensors.pop("d2t", None)
        ids = torch.arange(vd) if d2t is None else d2t.long() + torch.arange(vd)
        tensors.pop("t2d", None)
        embed = tensors.pop("embed_tokens.weight", tensors.pop("model.embed_tokens.weight", None))
        head = Eagle3Head(config, ids)
        state = {_module_name(k): v for k, v in tensors.items()}
        unknown = sorted(set(state) - set(head.state_dict()))
        missing = sorted(set(head.state_dict()) - set(state) - {"d2t"})
        if unknown or missing:
            raise ValueError(f"folder: {folder} is not an EAGLE-3 head this loader knows: missing {missing[:6]}, "
                             f"unexpected {unknown[:6]}")
        head.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()},
                             strict=False)
        if embed is not None and not _same_embeddings(embed, target):
            head.embed_tokens = nn.Embedding.from_pretrained(embed.to(dtype), freeze=True)
        return head.to(dtype).eval()


LAYOUTS = ("eagle3", "speculators")


def embedding_table(model: PreTrainedModel) -> torch.Tensor:
    """The model's input embeddings as a plain table (a scaled embedding, e.g. Gemma's, with its scale applied)."""
    module = model.get_input_embeddings()
    weight = module.weight.detach().float()
    scale = getattr(module, "embed_scale", None)
    if scale is not None:
        weight = weight * (scale.float() if isinstance(scale, torch.Tensor) else float(scale))
    return weight


def _same_embeddings(stored: torch.Tensor, target) -> bool:
    """Whether a checkpoint's embeddings are the target's (then the target's are used, not a copy), within the
    rounding of the checkpoint's dtype."""
    if target is None:
        return False
    raw = target.get_input_embeddings().weight.detach()
    if stored.shape != raw.shape:
        return False
    # the table as we write it (a scaled embedding's scale applied), or the raw weights as speculators writes them
    return any(torch.equal(stored, table.to(stored.dtype)) for table in (embedding_table(target), raw))


# our module names <-> the on-disk names: the decoder layer is `midlayer.` (reference) or `layers.0.` (speculators)
def _disk_name(name: str, prefix: str = "midlayer.") -> str:
    return name.replace("decoder.layers.0.", prefix)


def _module_name(name: str) -> str:
    name = name.replace("model.", "", 1) if name.startswith("model.") else name
    for prefix in ("midlayer.", "layers.0."):
        if name.startswith(prefix):
            return "decoder.layers.0." + name[len(prefix):]
    return name


def _variant_fields(c: Eagle3Config) -> dict:
    """The keys of speculators' variants, written in both layouts so that no reader falls back on a default."""
    return {"norm_before_residual": c.norm_before_residual, "norm_before_fc": c.norm_before_fc,
            "fc_norm": c.fc_norm, "norm_output": c.norm_output}


def export_config(c: Eagle3Config) -> dict:
    """config.json in the reference EAGLE-3 layout: a Llama config with the EAGLE-3 keys vLLM and SGLang read
    (`vocab_size` the target's, `draft_vocab_size`, `target_hidden_size`, no tied embeddings). The fused layers are
    written twice: `eagle_aux_hidden_state_layer_ids` at the top level in vLLM's numbering (the residual stream
    entering each layer), and inside `eagle_config` in SGLang's, which counts the output of the layer before
    (ids - 1; left out when a fused layer is the embeddings, which SGLang cannot name)."""
    out = dict(c.extra)
    eagle = {"use_aux_hidden_state": True}
    if min(c.aux_layers) >= 1:
        eagle["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in c.aux_layers]
    out.update({"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
                "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "num_hidden_layers": 1,
                "vocab_size": c.target_vocab_size, "draft_vocab_size": c.draft_vocab_size,
                "target_hidden_size": c.target_hidden_size, "rope_theta": c.rope_theta,
                "rope_parameters": c.rope_parameters, "rms_norm_eps": c.rms_norm_eps,
                "max_position_embeddings": c.max_position_embeddings, "hidden_act": "silu",
                "tie_word_embeddings": False, **_variant_fields(c),
                "eagle_aux_hidden_state_layer_ids": list(c.aux_layers), "eagle_config": eagle})
    if c.rope_scaling is not None:  # transformers 4's name for the scaling, which older readers take
        out["rope_scaling"] = dict(c.rope_scaling)
    return out


SPECULATORS_VERSION = "0.9.0"  # the speculators release whose layout this writes (and was loaded by)


def export_speculators_config(c: Eagle3Config, verifier: str | None = None,
                              verifier_architectures: list[str] | None = None) -> dict:
    """config.json in speculators' EAGLE-3 layout: the algorithm and its variants at the top level, the draft
    layer's full Llama config as `transformer_layer_config` (its `vocab_size` the target's, which sizes the
    embeddings and the target logits), the verifier named in `speculators_config`."""
    layer = c.llama_config(vocab_size=c.target_vocab_size).to_diff_dict()
    layer.update({"vocab_size": c.target_vocab_size, "head_dim": c.head_dim, "num_hidden_layers": 1,
                  "rope_parameters": c.rope_parameters, "tie_word_embeddings": False, "model_type": "llama"})
    for key in ("transformers_version", "architectures", "dtype", "torch_dtype"):
        layer.pop(key, None)
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION, "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.target_hidden_size, "eagle_aux_hidden_state_layer_ids": list(c.aux_layers),
            **_variant_fields(c), "embed_requires_grad": False, "tie_word_embeddings": False,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "accept_tolerance": 0.0,
                                      "verifier_accept_k": 1}],
                "verifier": {"name_or_path": verifier, "architectures": verifier_architectures or []}},
            "transformer_layer_config": layer}


def read_config(folder: Path, target=None) -> Eagle3Config:
    """An `Eagle3Config` from config.json in either EAGLE-3 layout (Llama keys at the top level, or speculators'
    `transformer_layer_config`), with a clear error for what it lacks or what this loader does not run."""
    path = folder / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"folder: no config.json in {folder}")
    raw = json.loads(path.read_text())
    speculators = "speculators_model_type" in raw
    layer = raw.get("transformer_layer_config", raw)  # the speculators format nests the layer's config
    if raw.get("eagle_config", {}).get("use_aux_hidden_state") is False:
        raise ValueError(f"folder: {folder} is an EAGLE-3 head without fused target layers (use_aux_hidden_state "
                         "false), which this loader does not run")
    _check_layer(folder, raw, layer)
    vocab = layer.get("vocab_size", raw.get("vocab_size")) if speculators else raw.get("vocab_size",
                                                                                       layer.get("vocab_size"))
    if target is not None:
        vocab = int(target.get_output_embeddings().weight.shape[0])
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if aux is None and (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") is not None:
        aux = [i + 1 for i in raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]  # SGLang's numbering
    if aux is None:
        if target is None:
            raise ValueError(f"folder: {folder}'s config names no fused layers; pass the target to take the default")
        aux = default_aux_layers(len(target.get_decoder().layers))
    theta, scaling = _rope(folder, raw, layer)
    kept = {k: v for k, v in raw.items() if k not in _WRITTEN}
    return Eagle3Config(hidden_size=layer["hidden_size"],
                        target_hidden_size=raw.get("target_hidden_size") or layer["hidden_size"],
                        draft_vocab_size=raw.get("draft_vocab_size") or vocab, target_vocab_size=vocab,
                        aux_layers=tuple(aux), intermediate_size=layer["intermediate_size"],
                        num_attention_heads=layer["num_attention_heads"],
                        num_key_value_heads=layer.get("num_key_value_heads", layer["num_attention_heads"]),
                        head_dim=layer.get("head_dim"), rope_theta=theta, rope_scaling=scaling,
                        rms_norm_eps=layer.get("rms_norm_eps", 1e-6),
                        max_position_embeddings=layer.get("max_position_embeddings", 32768),
                        # a speculators file without the key means true (speculators trains so, vLLM reads so)
                        norm_before_residual=bool(raw.get("norm_before_residual", speculators)),
                        norm_before_fc=bool(raw.get("norm_before_fc", False)), fc_norm=bool(raw.get("fc_norm", False)),
                        norm_output=bool(raw.get("norm_output", False)), extra=kept)


def _check_layer(folder: Path, raw: dict, layer: dict) -> None:
    """Refuse by name what the one Llama layer here does not compute."""
    problems = []
    if int(layer.get("num_hidden_layers", 1) or 1) != 1:
        problems.append(f"{layer['num_hidden_layers']} decoder layers (multispec runs one-layer EAGLE-3 heads)")
    if layer.get("model_type", "llama") != "llama":
        problems.append(f"a {layer['model_type']} draft layer (multispec runs Llama layers)")
    if layer.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {layer['hidden_act']!r}")
    for key in ("attention_bias", "mlp_bias"):
        if layer.get(key):
            problems.append(f"{key} true")
    if problems:
        raise ValueError(f"folder: {folder} is an EAGLE-3 head with {'; '.join(problems)}, which this loader does "
                         f"not run")


def _rope(folder: Path, raw: dict, layer: dict) -> tuple[float, dict | None]:
    """(theta, scaling) of the layer: `rope_parameters` (transformers 5, speculators' files) or `rope_scaling`
    (transformers 4) beside a top-level `rope_theta`, in the layer's config or the file's top level."""
    params = layer.get("rope_parameters") or raw.get("rope_parameters") or {}
    if params and not ("rope_type" in params or "rope_theta" in params or "type" in params):
        raise ValueError(f"folder: {folder}'s rope_parameters are per layer type ({sorted(params)}); an EAGLE-3 "
                         f"layer has one")
    scaling = dict(params) or dict(layer.get("rope_scaling") or raw.get("rope_scaling") or {})
    theta = params.get("rope_theta", layer.get("rope_theta", raw.get("rope_theta", 10000.0)))
    return float(theta), (scaling or None)


_WRITTEN = {"architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size", "draft_vocab_size",
            "target_hidden_size", "rope_theta", "rope_parameters", "rope_scaling", "rms_norm_eps",
            "max_position_embeddings", "hidden_act", "tie_word_embeddings", "norm_before_residual", "norm_before_fc",
            "fc_norm", "norm_output", "eagle_aux_hidden_state_layer_ids", "eagle_config", "transformer_layer_config",
            "speculators_model_type", "speculators_version", "speculators_config", "embed_requires_grad", "auto_map",
            "dtype", "torch_dtype", "transformers_version"}


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: model.safetensors, else pytorch_model.bin."""
    if (folder / "model.safetensors").exists():
        return dict(load_file(str(folder / "model.safetensors")))
    if (folder / "pytorch_model.bin").exists():
        return dict(torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True))
    raise FileNotFoundError(f"folder: no model.safetensors or pytorch_model.bin in {folder}")


class Eagle3Drafter(EagleDrafter):
    """Drafts chains or trees with an `Eagle3Head` over three of a target's layers (see the module docstring):
    `EagleDrafter`'s loop, with the fused target layers as the feature where the target computed one."""

    def __init__(self, head: Eagle3Head, target: PreTrainedModel):
        check_causal_lm(target, "target")
        c = head.eagle
        self.head = head.eval()
        # the target's embeddings, unless the checkpoint stored its own (then they are what it was trained on)
        self.embed = head.embed_tokens if head.embed_tokens is not None else target.get_input_embeddings()
        self.vocab_size = output_vocab_size(target)
        layers = len(target.get_decoder().layers)
        text = target.config.get_text_config(decoder=True)
        problems = [f"trained for a vocabulary of {c.target_vocab_size}, the target has {self.vocab_size}"
                    if c.target_vocab_size != self.vocab_size else None,
                    f"its layer is {c.hidden_size} wide, the target's embeddings {self.embed.weight.shape[1]}"
                    if c.hidden_size != self.embed.weight.shape[1] else None,
                    f"it fuses layers {list(c.aux_layers)}, the target has 0..{layers}"
                    if max(c.aux_layers) > layers else None,
                    f"it fuses layers {c.target_hidden_size} wide, the target's are {text.hidden_size}"
                    if c.target_hidden_size != text.hidden_size else None]
        problems = [p for p in problems if p]
        if problems:
            raise ValueError(f"head: {'; '.join(problems)}")
        self.feature_request = head.feature_request
        self.lm = HFCausalLM(head, name="eagle3_head")
        self.device = self.lm.device
        self.hidden_size = c.hidden_size

    @torch.no_grad()
    def draft_embeds(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """[emb(x); feature]: the layer norms each half itself."""
        dtype = self.head.fc.weight.dtype
        emb = self.embed(tokens.to(self.embed.weight.device)).to(self.device, dtype)
        return torch.cat([emb, features.to(self.device, dtype)], dim=-1)

    @torch.no_grad()
    def _target_features(self, features: Features | None, when: str) -> torch.Tensor:
        """g = fc(cat(the target's three layers)) [B, N, H]."""
        if features is None or not features.layers:
            raise ValueError(f"features: the EAGLE-3 drafter needs the target's layers {list(self.head.eagle.aux_layers)} "
                             f"{when}")
        return self.head.fuse_target(features)


__all__ = ["ARCHITECTURE", "LAYOUTS", "Eagle3Config", "Eagle3Drafter", "Eagle3Head", "default_aux_layers",
           "embedding_table", "export_config", "export_speculators_config", "read_config", "read_weights"]
