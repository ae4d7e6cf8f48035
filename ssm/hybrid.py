"""Hybrid SSM/attention models as speculative targets: `transformers`' `BambaForCausalLM` (Mamba-2 mixers
interleaved with full-attention layers, as in IBM's Bamba and Granite 4.0-H).

One forward scores the whole draft tree: Mamba-2 layers run the STree tree scan and tree conv
(`mamba2_tree_mix`), attention layers read the committed KV cache plus the tree through the core's
ancestor mask with position ids = committed length + depth (the KV layout and its gather-on-commit are
`HFCausalLM`'s). The commit moves both to the same accepted path: KV entries of the path's nodes are
gathered into place, SSM states set in closed form and conv states to the last accepted node's window.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from multispec.plugin import (FeatureRequest, Features, HFCausalLM, NO_FEATURES, PrefillOutput,
                              ancestor_mask_from_parents, cache_layer_types, require_version)

from .mamba2 import Mamba2Step, mamba2_commit_layers, mamba2_prefill_mix, mamba2_tree_mix
from .mamba1 import mamba1_tree_mix
from .targets import accepted_nodes, commit_layer_states, mamba_ssm_prefill, rms_norm
from .kernels import tree_conv1d_dispatch
from .tree_scan import conv_sources, gather_windows
from .versions import SSM_TRANSFORMERS

MAMBA = "linear_attention"  # the cache layer kind of a Mamba mixer
HYBRID = "hybrid"  # a Mamba mixer and attention in one layer (their states and K/V in one cache layer)


def feed_forward(mlp, x: torch.Tensor) -> torch.Tensor:
    """A gated SiLU MLP (`BambaMLP`) as three `F.linear` calls, without module-call overhead (the verify
    step runs one per layer); other feed-forward modules are called as they are."""
    if getattr(getattr(mlp, "config", None), "hidden_act", None) != "silu" or not hasattr(mlp, "gate_proj"):
        return mlp(x)
    gate = F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)
    up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
    return F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)


_QKV: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def rotate_heads(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """RoPE on heads [B, heads, T, D] with (cos, sin) [B, T, rd]: the first `rd` dims of each head rotate
    (partial rotary), the rest pass; None: no position embedding (NoPE, e.g. Granite 4.0-H)."""
    if rotary is None:
        return x
    cos, sin = (t[:, None] for t in rotary)
    rd = cos.shape[-1]
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    turned = torch.cat([-x_rot[..., rd // 2:], x_rot[..., : rd // 2]], dim=-1)
    return torch.cat([x_rot * cos + turned * sin, x_pass], dim=-1)


def _fused_qkv(attn) -> tuple:
    """(key, the q/k/v weights concatenated, their biases or None), cached per parameter version; traced (the
    fixed-shape step under `torch.compile`) it is built in the graph, where the cache's pointer check cannot be."""
    parts = (attn.q_proj, attn.k_proj, attn.v_proj)
    fuse = lambda: (torch.cat([p.weight for p in parts]),  # noqa: E731
                    torch.cat([p.bias for p in parts]) if attn.q_proj.bias is not None else None)
    if torch.compiler.is_compiling():
        return (None, *fuse())
    key = tuple((p.weight.data_ptr(), p.weight._version) for p in parts)
    hit = _QKV.get(attn)
    if hit is None or hit[0] != key:
        hit = (key, *fuse())
        _QKV[attn] = hit
    return hit


def tree_attention(attn, h: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
                   cache_layer, key_scale: float = 1.0, qk_norms: tuple | None = None,
                   adapters: tuple | None = None) -> torch.Tensor:
    """`BambaAttention` over the tree nodes, appending their K/V to `cache_layer`: what the module computes,
    with q/k/v fused into one matmul and grouped heads left to SDPA (the module's SDPA path repeats the
    whole cached K/V per head group whenever a mask is given, i.e. every verify step). `key_scale`: keys
    are multiplied by it before the rotary embedding (Falcon-H1's `key_multiplier`). `qk_norms`: per-head
    RMS norms of queries and keys, applied before the rotary embedding (LFM2's `q_layernorm`, `k_layernorm`).
    `adapters`: low-rank modules whose outputs add to the queries, keys and values (Zamba2's per-layer
    adapters on its shared attention block)."""
    b, m, _ = h.shape
    w = attn.q_proj.weight
    hit = _fused_qkv(attn)
    heads, kv_heads, d = w.shape[0] // attn.head_dim, attn.k_proj.weight.shape[0] // attn.head_dim, attn.head_dim
    qkv = F.linear(h, hit[1], hit[2])
    if adapters is not None:
        qkv = qkv + torch.cat([adapter(h) for adapter in adapters], dim=-1)
    qkv = qkv.view(b, m, heads + 2 * kv_heads, d).transpose(1, 2)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    if key_scale != 1.0:
        k = k * key_scale
    if qk_norms is not None:
        q, k = rms_norm(qk_norms[0], q), rms_norm(qk_norms[1], k)
    keys, values = cache_layer.update(rotate_heads(k, rotary), v, None)
    out = F.scaled_dot_product_attention(rotate_heads(q, rotary), keys, values, attn_mask=mask, scale=attn.scaling,
                                         enable_gqa=heads != kv_heads)
    out_proj = attn.o_proj if hasattr(attn, "o_proj") else attn.out_proj
    return F.linear(out.transpose(1, 2).reshape(b, m, -1), out_proj.weight, out_proj.bias)


class BambaTarget(HFCausalLM):
    """Target adapter for `BambaForCausalLM` (one draft tree per step; chains are trees)."""

    stateful = True
    model_type = "bamba"
    provides = FeatureRequest(hidden=True)
    check_paths = True  # `commit` checks the path's range (a host read; the fixed-shape step trusts the rule's)

    def __init__(self, model: PreTrainedModel):
        if not (isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) == self.model_type):
            raise TypeError(f"model: expected a transformers {self.model_type} causal LM, got {type(model).__name__}")
        require_version(SSM_TRANSFORMERS, "multispec.ssm")
        super().__init__(model, name="model")
        self.decoder = model.model
        # the Mamba layers: those transformers keeps a recurrent state for ("linear_attention" cache layers)
        # (a "hybrid" layer holds a Mamba mixer and attention side by side, as in Falcon-H1)
        self.mamba_layers = [i for i, kind in enumerate(cache_layer_types(model.config)) if kind in self.state_kinds]
        self.conv: dict[int, torch.Tensor] = {}
        self.ssm: dict[int, torch.Tensor] = {}
        self._step: dict[int, Mamba2Step] | None = None
        self._sources: torch.Tensor | None = None  # the scored tree's conv sources, shared by all layers

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)  # typed layers: KV for attention, states for Mamba

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
              inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> PrefillOutput:
        b = input_ids.shape[0]
        for i in self.mamba_layers:  # a one-token prompt prefills nothing: zero states
            self.conv[i], self.ssm[i] = self._zero_states(self._mamba(i), b)
        self._step = None
        return super().start(input_ids, attention_mask, inputs_embeds=inputs_embeds, request=request)

    @torch.no_grad()
    def prefill_forward(self, ids: torch.Tensor, mask2d: torch.Tensor, request: FeatureRequest = NO_FEATURES,
                 inputs_embeds: torch.Tensor | None = None) -> Features | None:
        unpadded = inputs_embeds is None and request.empty and bool(mask2d.all())
        if unpadded and self.own_prefill and not mamba_ssm_prefill(self.device):
            return self._prefill_unpadded(ids)
        # the model's own forward (its chunked scan) over the left-padded prompts; positions count real tokens
        pos = (mask2d.long().cumsum(-1) - 1).clamp(min=0)
        tokens = dict(input_ids=ids) if inputs_embeds is None else dict(inputs_embeds=inputs_embeds)
        out = self.decoder(attention_mask=mask2d, position_ids=pos, past_key_values=self.cache, use_cache=True,
                           **tokens)
        for i in self.mamba_layers:
            self.conv[i], self.ssm[i] = self._cached_states(i, ids.shape[0])
        return Features(out.last_hidden_state) if request.hidden else None

    def _cached_states(self, i: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's (conv, SSM) states as the model's own forward left them in the cache."""
        return self.cache.get_conv_state(i).clone(), self.cache.get_recurrent_state(i).float().clone()

    def _prefill_unpadded(self, ids: torch.Tensor) -> None:
        """Mamba-2 layers through `mamba2_prefill_mix` (conv1d + chunked SSD), attention layers through the
        model's own attention with a causal mask: the same states and KV entries as the model's forward."""
        b, n = ids.shape
        hidden = self._embed(self.decoder.get_input_embeddings()(ids))
        pos = torch.arange(n, device=self.device).expand(b, n)
        with self._rotating():  # dynamic NTK RoPE per token, as `generate` rotates (`multispec.targets.dynamic_rope`)
            rotary = self._rotary(hidden, pos)
        causal = torch.full((n, n), torch.finfo(hidden.dtype).min, dtype=hidden.dtype, device=self.device).triu(1)
        for i, layer in enumerate(self.decoder.layers):
            h = layer.input_layernorm(hidden)
            if i in self.conv:
                h, self.conv[i], self.ssm[i] = mamba2_prefill_mix(layer.mamba, h)
            else:
                h, _ = layer.self_attn(hidden_states=h, position_embeddings=rotary,
                                       attention_mask=causal[None, None], past_key_values=self.cache)
            hidden = hidden + h * self.residual_scale
            hidden = hidden + self._feed_forward(layer, hidden) * self.residual_scale

    def score_forward(self, inputs, masks, positions, cache_position, request, parents):
        if self.num_pending:
            raise RuntimeError("score: commit or discard the previous tree first (one tree per step)")
        ancestors = ancestor_mask_from_parents(parents)
        width = self._mamba(self.mamba_layers[0]).conv_kernel_size if self.mamba_layers else 1
        sources = conv_sources(parents, width, depth=ancestors.sum(-1) - 1)
        embed = self.decoder.get_input_embeddings()
        hidden = inputs["inputs_embeds"] if "inputs_embeds" in inputs else embed(inputs["input_ids"])
        hidden = self._embed(hidden)
        with self._rotating():
            rotary = self._rotary(hidden, positions)
        step: dict[int, Mamba2Step] = {}
        tree = (rotary, masks, parents, ancestors, sources, step)
        for i, layer in enumerate(self.decoder.layers):
            hidden = self._tree_layer(i, layer, hidden, *tree)
        hidden = self._normed(hidden)
        self._step, self._sources = step, sources
        return self._logits(hidden), (Features(hidden) if request.hidden else None)

    # ---- the class's layer pieces (a subclass for another hybrid of the same layout overrides them) -------
    state_kinds = (MAMBA, HYBRID)  # the cache layer kinds whose layers keep a state (`mamba_layers`)
    residual_scale = 1.0  # a branch's output is scaled by this before it joins the residual stream
    own_prefill = True  # unpadded prompts through `_prefill_unpadded` (else always the model's own forward)

    def _mamba(self, i: int):
        """Layer i's Mamba mixer."""
        return self.decoder.layers[i].mamba

    def _zero_states(self, mixer, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A Mamba-2 mixer's (conv, SSM) states before any token."""
        return (torch.zeros(b, mixer.conv_dim, mixer.conv_kernel_size, dtype=self.dtype, device=self.device),
                torch.zeros(b, mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, device=self.device))

    def _committed_states(self, layers: list[int], on_path, has, last) -> tuple[list, list]:
        """The (conv, SSM) states of `layers` after the accepted nodes (Mamba-2: closed form, batched)."""
        return mamba2_commit_layers([self._mamba(i) for i in layers], [self._step[i] for i in layers],
                                    [self.conv[i] for i in layers], [self.ssm[i] for i in layers], self._sources,
                                    on_path, has, last)

    def _tree_layer(self, i: int, layer, hidden: torch.Tensor, rotary, masks, parents, ancestors, sources,
                    step: dict) -> torch.Tensor:
        """Layer i over the tree's nodes: a Mamba-2 mixer through the tree scan (its step kept in `step` for
        the commit) or attention over the committed K/V plus the tree, then the feed-forward."""
        h = rms_norm(layer.input_layernorm, hidden)
        if i in self.conv:
            h, step[i] = mamba2_tree_mix(self._mamba(i), h, self.conv[i], self.ssm[i], parents, ancestors, sources)
        else:  # K/V of the tree nodes are appended after the committed columns; the mask does the rest
            h = tree_attention(layer.self_attn, h, rotary, masks, self.cache.layers[i])
        hidden = hidden + h * self.residual_scale
        return hidden + self._feed_forward(layer, hidden) * self.residual_scale

    def _embed(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        return self.decoder.rotary_emb(hidden, position_ids=positions)

    def _feed_forward(self, layer, hidden: torch.Tensor) -> torch.Tensor:
        return feed_forward(layer.feed_forward, rms_norm(layer.pre_ff_layernorm, hidden))

    @property
    def _final_norm(self):
        return self.decoder.final_layernorm

    def _normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm (an RMS norm of the usual form: weight times the normed input)."""
        return rms_norm(self._final_norm, hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden).float()

    @torch.no_grad()
    def commit(self, path: torch.Tensor, counts: Sequence[int] | None = None) -> None:
        if self._step is None:
            raise RuntimeError("commit: no tree was scored since the last commit")
        path = path.to(self.device)
        on_path, has, last = accepted_nodes(path, self.batch_size, self.num_pending, checked=self.check_paths)
        layers = list(self._step)
        convs, ssms = self._committed_states(layers, on_path, has, last)
        self.conv.update(zip(layers, convs))
        self.ssm.update(zip(layers, ssms))
        super().commit(path, counts)  # the attention layers' KV entries of the same path
        self._step = None

    def discard(self) -> None:
        super().discard()
        self._step = None

    def checkpoint(self) -> tuple:
        if self._step is not None:
            raise RuntimeError("checkpoint: commit or discard the scored tree first")
        clone = lambda states: {i: t.clone() for i, t in states.items()}  # noqa: E731
        return super().checkpoint(), clone(self.conv), clone(self.ssm)

    def rollback(self, state: tuple) -> None:
        attention, conv, ssm = state
        super().rollback(attention)
        self.conv, self.ssm = {i: t.clone() for i, t in conv.items()}, {i: t.clone() for i, t in ssm.items()}
        self._step = None

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        rows = rows.to(self.device)
        self.conv = {i: c[rows] for i, c in self.conv.items()}
        self.ssm = {i: s[rows] for i, s in self.ssm.items()}


class GraniteMoeHybridTarget(BambaTarget):
    """Target adapter for `GraniteMoeHybridForCausalLM` (IBM Granite 4.0-H: Mamba-2 and attention layers, each
    followed by a mixture of experts plus a shared MLP). The layout is Bamba's; Granite scales the input
    embeddings, every residual branch and the logits by constants of its config, and may use no position
    embedding at all (NoPE: `position_embedding_type` other than "rope")."""

    model_type = "granitemoehybrid"

    def __init__(self, model: PreTrainedModel):
        super().__init__(model)
        config = model.config
        self.residual_scale = float(config.residual_multiplier)
        self.embedding_scale = float(config.embedding_multiplier)
        self.logits_scale = float(config.logits_scaling)

    def _embed(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * self.embedding_scale

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        rotary = getattr(self.decoder, "rotary_emb", None)
        return None if rotary is None else rotary(hidden, position_ids=positions)

    def _feed_forward(self, layer, hidden: torch.Tensor) -> torch.Tensor:
        h = rms_norm(layer.post_attention_layernorm, hidden)
        shared = layer.shared_mlp(h)
        return layer.block_sparse_moe(h) + shared if layer.has_experts else shared

    @property
    def _final_norm(self):
        return self.decoder.norm

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden).float() / self.logits_scale


class NemotronHTarget(BambaTarget):
    """Target adapter for `NemotronHForCausalLM` (NVIDIA Nemotron-H): a pattern of single-mixer blocks, each
    pre-normed and residual: Mamba-2, attention without position embedding, MLP or mixture of experts. Prompts
    prefill through the model's own forward."""

    model_type = "nemotron_h"
    own_prefill = False

    def _mamba(self, i: int):
        return self.decoder.layers[i].mixer

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        return None  # NoPE: positions reach attention through the mask only

    def _tree_layer(self, i: int, layer, hidden: torch.Tensor, rotary, masks, parents, ancestors, sources,
                    step: dict) -> torch.Tensor:
        h = rms_norm(layer.norm, hidden)
        if i in self.conv:
            h, step[i] = mamba2_tree_mix(layer.mixer, h, self.conv[i], self.ssm[i], parents, ancestors, sources)
        elif layer.block_type == "full_attention":
            h = tree_attention(layer.mixer, h, None, masks, self.cache.layers[i])
        else:  # an MLP or a mixture of experts: position-wise
            h = layer.mixer(h)
        return hidden + h

    @property
    def _final_norm(self):
        return self.decoder.norm_f


class JambaTarget(BambaTarget):
    """Target adapter for `JambaForCausalLM` (AI21 Jamba): Mamba-1 mixers (with RMS norms on the time step, B
    and C) and attention without position embedding, each followed by an MLP or a mixture of experts. The
    Mamba-1 layers scan the tree node by node (`mamba1_tree_mix`) and commit the accepted node's own state.
    Prompts prefill through the model's own forward."""

    model_type = "jamba"
    own_prefill = False

    def _zero_states(self, mixer, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(b, mixer.intermediate_size, mixer.conv_kernel_size, dtype=self.dtype, device=self.device),
                torch.zeros(b, mixer.intermediate_size, mixer.ssm_state_size, device=self.device))

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        return None  # NoPE

    def _tree_layer(self, i: int, layer, hidden: torch.Tensor, rotary, masks, parents, ancestors, sources,
                    step: dict) -> torch.Tensor:
        h = rms_norm(layer.input_layernorm, hidden)
        if i in self.conv:
            h, step[i] = mamba1_tree_mix(layer.mamba, h, self.conv[i], self.ssm[i], parents, sources, _jamba_norms)
        else:
            h = tree_attention(layer.self_attn, h, None, masks, self.cache.layers[i])
        hidden = hidden + h
        return hidden + feed_forward(layer.feed_forward, rms_norm(layer.pre_ff_layernorm, hidden))

    def _committed_states(self, layers: list[int], on_path, has, last) -> tuple[list, list]:
        return kept_node_states(self, layers, has, last)


def kept_node_states(target: BambaTarget, layers: list[int], has, last) -> tuple[list, list]:
    """The committed (conv, recurrent) states of `layers` whose tree mixer kept every node's state (`.states`
    [B, T, ...] beside the pre-conv inputs `.xbc`): the last accepted node's state and conv window."""
    rows = torch.arange(has.shape[0], device=has.device)
    out = [commit_layer_states(target.conv[i], target.ssm[i], target._step[i].states[rows, last],
                               target._step[i].xbc, target._sources, has, last) for i in layers]
    return [c for c, _ in out], [h for _, h in out]


def _jamba_norms(mixer, step: torch.Tensor, B: torch.Tensor, C: torch.Tensor):
    return rms_norm(mixer.dt_layernorm, step), rms_norm(mixer.b_layernorm, B), rms_norm(mixer.c_layernorm, C)


class FalconH1Target(BambaTarget):
    """Target adapter for `FalconH1ForCausalLM` (TII Falcon-H1): every layer runs a Mamba-2 mixer and
    attention side by side on the same normed input and adds both to the residual stream, then an MLP.
    Falcon-H1's muP multipliers are applied where the model applies them: the embeddings, the mixer's input
    and projection sections (`mamba2_tree_mix` reads them from the mixer), its output, the attention's input,
    keys and output, the MLP's gate and down projection (its own module) and the logits. The mixer's gated
    norm is optional (`mamba_rms_norm`). Prompts prefill through the model's own forward."""

    model_type = "falcon_h1"
    own_prefill = False

    def __init__(self, model: PreTrainedModel):
        super().__init__(model)
        config = model.config
        self.embedding_scale = float(config.embedding_multiplier)
        self.logits_scale = float(config.lm_head_multiplier)

    def _embed(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * self.embedding_scale

    def _tree_layer(self, i: int, layer, hidden: torch.Tensor, rotary, masks, parents, ancestors, sources,
                    step: dict) -> torch.Tensor:
        h = rms_norm(layer.input_layernorm, hidden)
        ssm, step[i] = mamba2_tree_mix(layer.mamba, h, self.conv[i], self.ssm[i], parents, ancestors, sources)
        attn = tree_attention(layer.self_attn, h * layer.attention_in_multiplier, rotary, masks,
                              self.cache.layers[i], key_scale=layer.self_attn.key_multiplier)
        hidden = hidden + ssm * layer.ssm_out_multiplier + attn * layer.attn_out_multiplier
        return hidden + layer.feed_forward(rms_norm(layer.pre_ff_layernorm, hidden))

    @property
    def _final_norm(self):
        return self.decoder.final_layernorm

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden).float() * self.logits_scale


class Lfm2Target(BambaTarget):
    """Target adapter for `Lfm2ForCausalLM` (Liquid AI LFM2): gated short-convolution layers (`in_proj` to
    B, C, x; a depthwise causal conv of width `conv_L_cache` over B * x; C times its output) and attention
    layers with per-head query/key RMS norms and RoPE, each pre-normed and followed by an MLP. A conv layer
    keeps only its conv window: over a tree each node's window is read along its path (`tree_conv1d`, the
    Mamba layers' tree conv), and the commit sets it to the last accepted node's window. Prompts prefill
    through the model's own forward."""

    model_type = "lfm2"
    own_prefill = False
    state_kinds = ("conv",)

    def _mamba(self, i: int):
        return self.decoder.layers[i].conv  # `conv_kernel_size`: the window `score_forward` computes sources for

    def _zero_states(self, mixer, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        # no recurrent state: a [B, 0] placeholder keeps the shared bookkeeping (select, rollback) uniform
        return (torch.zeros(b, mixer.conv.in_channels, mixer.conv_kernel_size, dtype=self.dtype, device=self.device),
                torch.zeros(b, 0, device=self.device))

    def _cached_states(self, i: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.get_conv_state(i).clone(), torch.zeros(b, 0, device=self.device)

    def _tree_layer(self, i: int, layer, hidden: torch.Tensor, rotary, masks, parents, ancestors, sources,
                    step: dict) -> torch.Tensor:
        h = rms_norm(layer.operator_norm, hidden)
        if i in self.conv:
            conv = layer.conv
            gate_b, gate_c, x = F.linear(h, conv.in_proj.weight, conv.in_proj.bias).chunk(3, dim=-1)
            step[i] = gate_b * x  # the conv's inputs: the commit reads the accepted node's window from them
            y = tree_conv1d_dispatch(step[i], self.conv[i], parents, conv.conv.weight.squeeze(1), conv.conv.bias,
                                     sources=sources)
            h = F.linear(gate_c * y.to(h.dtype), conv.out_proj.weight, conv.out_proj.bias)
        else:
            attn = layer.self_attn
            h = tree_attention(attn, h, rotary, masks, self.cache.layers[i],
                               qk_norms=(attn.q_layernorm, attn.k_layernorm))
        hidden = hidden + h
        return hidden + layer.feed_forward(rms_norm(layer.ffn_norm, hidden))

    def _committed_states(self, layers: list[int], on_path, has, last) -> tuple[list, list]:
        rows = torch.arange(on_path.shape[0], device=on_path.device)
        convs = []
        for i in layers:
            window = gather_windows(self._step[i], self.conv[i], self._sources[rows, last][:, None])[:, 0]
            convs.append(torch.where(has[:, None, None], window.to(self.conv[i].dtype), self.conv[i]))
        return convs, [self.ssm[i] for i in layers]

    @property
    def _final_norm(self):
        return self.decoder.embedding_norm


class Zamba2Target(BambaTarget):
    """Target adapter for `Zamba2ForCausalLM` (Zyphra Zamba2): every layer is a Mamba-2 block; before some
    ("hybrid" layers) a shared transformer block reads the hidden state concatenated with the input
    embeddings (attention with its per-layer low-rank adapters on q, k, v, optional RoPE, then an MLP with its
    adapter, no residual of its own), whose projected output adds to that layer's Mamba input. The shared
    block's weights repeat every `num_mem_blocks` hybrid layers; its K/V sit in the hybrid layer's own cache
    layer. Prompts prefill through the model's own forward."""

    model_type = "zamba2"
    own_prefill = False

    def _mamba(self, i: int):
        layer = self.decoder.layers[i]
        return layer.mamba if hasattr(layer, "mamba") else layer.mamba_decoder.mamba

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor):
        rotary = getattr(self.decoder, "rotary_emb", None)  # only with `use_mem_rope`
        return None if rotary is None else rotary(hidden, position_ids=positions)

    def _embed(self, hidden: torch.Tensor) -> torch.Tensor:
        self._embeddings = hidden  # the shared blocks read the input embeddings again
        return hidden

    def _tree_layer(self, i: int, layer, hidden: torch.Tensor, rotary, masks, parents, ancestors, sources,
                    step: dict) -> torch.Tensor:
        mamba_layer, branch = layer, None
        if hasattr(layer, "shared_transformer"):
            shared, mamba_layer = layer.shared_transformer, layer.mamba_decoder
            attn = shared.self_attn
            h = rms_norm(shared.input_layernorm, torch.cat([hidden, self._embeddings], dim=-1))
            adapters = None
            if attn.config.use_shared_attention_adapter:
                slot = attn.layer_dic[i]
                adapters = (attn.linear_q_adapter_list[slot], attn.linear_k_adapter_list[slot],
                            attn.linear_v_adapter_list[slot])
            h = tree_attention(attn, h, rotary, masks, self.cache.layers[i], adapters=adapters)
            branch = F.linear(shared.feed_forward(rms_norm(shared.pre_ff_layernorm, h), i), layer.linear.weight,
                              layer.linear.bias)
        h = rms_norm(mamba_layer.input_layernorm, hidden if branch is None else hidden + branch)
        h, step[i] = mamba2_tree_mix(mamba_layer.mamba, h, self.conv[i], self.ssm[i], parents, ancestors, sources)
        return hidden + h

    @property
    def _final_norm(self):
        return self.decoder.final_layernorm
