"""The fixed-shape step over a model's own `transformers` forward, for every decoder whose cache is attention
keys and values (Qwen3, Qwen3-MoE, Gemma 2 and 3, OLMo 2, Granite, Mixtral, Phi-3, Cohere 2, gpt-oss, Llama
with any RoPE scaling, ...), where the hand-written lean engine (`static_step.StaticLeanCausalLM`) does not
apply. The model computes exactly as in `HFCausalLM`'s eager feed (its own attention, RoPE variant, q/k norms,
soft-capping, sinks, experts); only the cache and the feed's tables change:

- the cache is `ColumnCache`: per layer one K and one V tensor of `capacity` columns, allocated once per batch
  size and reused across generations (a captured CUDA graph keeps reading the same addresses); a forward writes
  its new nodes' K/V at the columns `cache.cols` names (one `index_copy_` per layer) and attends over all
  `capacity` columns, masked;
- the new nodes are padded to a node budget (`node_buckets`); padding nodes sit at position 0, read column 0
  only, and write spare columns after the real nodes that the bookkeeping never reads;
- the positions, the masks (one per attention layer type: full and sliding window) and the written columns are
  tensors built by `static_feed_tables` on tensors alone, so the step holds no host read and one graph serves
  every step of a (batch size, budget) shape;
- a commit moves the accepted columns in place (`HFCausalLM.commit`) and crops nothing: columns past a row's
  length are masked until they are written again.

The prompt is prefilled eagerly with the model's dynamic cache (one call per generation), then copied into the
fixed buffers. Opt in with `speculative_generate(..., engine=EngineConfig(step="static" | "compiled"))`, which
picks this engine for a target the lean engine cannot run (`static_engines`). On CUDA each feed shape is
captured in a CUDA graph (`CapturedFeed`); `compile` puts the step under `torch.compile(fullgraph=True)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from .base import NO_FEATURES, FeatureRequest, TargetOutput
from .hf import HFCausalLM, keeps_state
from .lean import dispatched
from .dynamic_rope import dynamic_rotary
from .static_step import CapturedFeed, padded, static_feed_tables


def model_unsupported(model: object) -> str | None:
    """Why no fixed-shape engine runs `model` whatever its adapter (None: nothing in the model itself)."""
    if not isinstance(model, PreTrainedModel):
        return f"not a transformers PreTrainedModel ({type(model).__name__})"
    if keeps_state(model):
        return (f"{type(model).__name__} keeps a recurrent state, and no fixed-shape engine is registered for its "
                f"adapter (`register_fixed_shape`)")
    if dispatched(model):
        return "dispatched by accelerate (device_map): its offloaded weights move in per call"
    try:
        dynamic_rotary(model)  # dynamic NTK RoPE runs per token on tensors (`dynamic_rope`), one state
    except ValueError as e:
        return str(e)
    return None


class ColumnLayer(CacheLayerMixin):
    """One attention layer's K and V, `capacity` columns each; an update writes the new keys at the columns its
    cache names and returns every column (the masks decide which are read)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cache: "ColumnCache", keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.cache, self.keys, self.values, self.is_initialized = cache, keys, values, True
        self.device = keys.device

    def lazy_initialization(self, key_states, value_states) -> None:  # the buffers exist from the start
        raise RuntimeError("ColumnLayer: its buffers are allocated by the engine")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        cols = self.cache.cols
        self.keys.index_copy_(2, cols, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, cols, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class ColumnCache(Cache):
    """Every layer a `ColumnLayer`; `cols` [N]: the columns the next forward writes."""

    def __init__(self, buffers: Sequence[tuple[torch.Tensor, torch.Tensor]]):
        super().__init__(layers=[ColumnLayer(self, k, v) for k, v in buffers])
        self.cols = torch.zeros(0, dtype=torch.long, device=buffers[0][0].device)


class StaticFeed(CapturedFeed):
    """Mixed in before an `HFCausalLM` (or an adapter of one that keeps its feed): its feeds run the model's own
    forward at fixed shapes (see the module docstring).

    The subclass contract, beside `HFCausalLM`'s: `feed_tensors(...)` (the feed on tensors, what a CUDA graph
    captures: a hybrid runs its recurrent layers here), `adopt(kv)` / `dynamic_layers()` / `probe_shapes(b)` (how
    the prompt's cache becomes the fixed buffers), `unwindowed_pairs(allowed)` (the pairs sliding windows keep, as
    tensors), and the class attribute `graph_attributes` (tensor attributes a feed reads, copied in at each
    replay)."""

    def __init__(self, model: PreTrainedModel, name: str = "target", *, capacity: int | None = None,
                 node_budget: int | Sequence[int] = 16, compile: bool | str | Callable = False,
                 compile_mode: str | None = None, cuda_graphs: bool | None = None):
        """As `StaticLeanCausalLM`'s: `capacity` cache columns per row (default: `max_position_embeddings` plus
        the largest budget), `node_budget` the padded widths (`node_buckets`; a feed of more nodes pads to the
        next power of two), `compile` False / True / a `torch.compile` backend, `cuda_graphs` (default: on
        CUDA)."""
        reason = model_unsupported(model)
        if reason is not None:
            raise ValueError(f"{name}: the fixed-shape step cannot run this model ({reason})")
        super().__init__(model, name)
        self.init_static(generic_step, model.config.get_text_config(decoder=True), capacity, node_budget, compile,
                         compile_mode, cuda_graphs)
        self._pool: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        if self._ntk is not None:  # its state enters each call as tensors, its table at a fixed address
            self._ntk.reserve(2 * self.capacity + 2)  # a token's length is below its column + its row's offset
            self.graph_attributes = (*type(self).graph_attributes, "_ntk.offset", "_ntk.longest", "_ntk.inv")

    # ---- buffers --------------------------------------------------------------------------------------
    def _buffers(self, batch: int, like: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list:
        """The engine's K/V buffers for `batch` rows, shaped as each layer of `like` (zeros when new: masked
        columns must stay finite)."""
        pool = self._pool.get(batch)
        shapes = [(k.shape[1], k.shape[3], v.shape[3]) for k, v in like]
        if pool is None or [(k.shape[1], k.shape[3], v.shape[3]) for k, v in pool] != shapes:
            pool = [(torch.zeros(batch, h, self.capacity, dk, dtype=self.dtype, device=self.device),
                     torch.zeros(batch, h, self.capacity, dv, dtype=self.dtype, device=self.device))
                    for h, dk, dv in shapes]
            if self.device.type == "cuda":
                for k, v in pool:
                    torch._dynamo.mark_static_address(k)
                    torch._dynamo.mark_static_address(v)
            self._pool[batch] = pool
        return pool

    def adopt(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy `kv` (per layer K, V [B, H, W, D], W <= capacity) into the fixed buffers; they become the cache."""
        kv = [(k.clone(), v.clone()) for k, v in kv]  # `kv` may be views of the buffers themselves
        self.check_capacity(max(k.shape[2] for k, _ in kv))
        buffers = self._buffers(kv[0][0].shape[0], kv)
        for (k, v), (bk, bv) in zip(kv, buffers):
            bk[:, :, : k.shape[2]] = k
            bv[:, :, : v.shape[2]] = v
        self.cache = ColumnCache(buffers)

    def dynamic_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        if self._ntk is not None:  # every length the steps can reach, before them: the steps then read nothing
            self._ntk.fill()
        out = super().start(input_ids, attention_mask, **kwargs)  # the prompt through the model's dynamic cache
        b = input_ids.shape[0]
        kv = [(k, v) for k, v in self.dynamic_layers() if k is not None and k.numel()]
        if len(kv) != len(self.cache.layers):  # a one-token prompt: shapes from a throwaway forward
            kv = self.probe_shapes(b)
        self.adopt(kv)
        return out

    @torch.no_grad()
    def probe_shapes(self, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cache = DynamicCache()
        ids = torch.zeros(b, 1, dtype=torch.long, device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        return [(layer.keys[:, :, :0], layer.values[:, :, :0]) for layer in cache.layers]

    def _crop(self, width: int) -> None:
        """Nothing: columns past a row's length are masked until a feed writes them again."""

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)  # slices the buffers (views) and trims dead leading columns
        self.adopt(self.dynamic_layers())

    # ---- the static call --------------------------------------------------------------------------------
    def kv_pointers(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for layer in self.cache.layers for t in (layer.keys, layer.values))

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None, *,
             inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        """`HFCausalLM.feed` at a fixed shape and without a host read (see the module docstring)."""
        b, m = tokens.shape
        if parents.shape != (b, m):
            raise ValueError(f"parents: expected shape {(b, m)}, got {tuple(parents.shape)}")
        if b != self.batch_size:
            raise ValueError(f"tokens: batch {b} does not match the {self.batch_size} active rows")
        if m == 0:
            return super().feed(tokens, parents, valid, inputs_embeds=inputs_embeds, request=request)
        n = next((s for s in self.buckets if s >= m), 1 << (m - 1).bit_length())
        device, p0 = self.device, self.num_pending
        used = self.width + p0  # the pending nodes' K/V sit right after the committed columns
        self.check_capacity(used + n)
        valid = torch.ones(b, m, dtype=torch.bool, device=device) if valid is None else valid.to(device)
        inp = tokens.to(device) if inputs_embeds is None else inputs_embeds.to(device)
        if self._ntk is not None:
            self._ntk.cover_columns(used + n)
        dynamic = (padded(inp, n), parents.to(device), valid, self.pending.parents, self.length, self.start_col,
                   torch.arange(used, used + n, device=device), *(_get(self, a) for a in self.graph_attributes))
        out = self.run_feed(dynamic, p0, tuple(request.layers), request.hidden)
        return self.finish_feed(out, m, request)

    # tensor attributes an adapter's feed reads (e.g. Qwen2-VL's rope deltas in `node_positions`; dotted: an attribute
    # of one): a captured graph must read them as inputs, copied in at each replay, not at the addresses they had
    # when it was captured
    graph_attributes: tuple[str, ...] = ()

    def fed(self, inp, parents, valid, pending_parents, length, start_col, cols, *attributes, p0: int,
            layers_wanted: tuple[int, ...], want_hidden: bool):
        """The whole feed on tensors: its tables, then the model's forward (what a CUDA graph captures);
        `attributes`: the values of `graph_attributes`, set on the engine for the call."""
        kept = tuple(_get(self, a) for a in self.graph_attributes)
        for name, value in zip(self.graph_attributes, attributes):
            _set(self, name, value)
        try:
            return self.feed_tensors(inp, parents, valid, pending_parents, length, start_col, cols, p0=p0,
                             layers_wanted=layers_wanted, want_hidden=want_hidden)
        finally:
            for name, value in zip(self.graph_attributes, kept):
                _set(self, name, value)

    def feed_tensors(self, inp, parents, valid, pending_parents, length, start_col, cols, *, p0: int,
             layers_wanted: tuple[int, ...], want_hidden: bool):
        tables = dict(p0=p0, capacity=self.capacity, window=None)
        ok, kept_parents, pos, anc, positions, allowed = static_feed_tables(
            parents, valid, pending_parents, length, start_col, cols, sliding_window=None, **tables)
        sliding = None
        if self.sliding_window is not None:
            sliding = static_feed_tables(parents, valid, pending_parents, length, start_col, cols,
                                         sliding_window=self.sliding_window, **tables)[-1]
            sliding = sliding | self.unwindowed_pairs(allowed)
        masks = self._additive_masks(allowed, sliding)
        self.cache.cols = cols
        request = FeatureRequest(hidden=want_hidden, layers=layers_wanted)
        tokens = dict(input_ids=inp) if inp.dim() == 2 else dict(inputs_embeds=inp)
        with self._rotating():
            logits, hidden, layers = self._step(self, request, masks, self.node_positions(positions), tokens)
        return logits, hidden, layers, ok, kept_parents, pos, anc

    def unwindowed_pairs(self, allowed: torch.Tensor) -> torch.Tensor | bool:
        """Pairs of the bool mask [B, 1, N, C] that sliding windows do not cut (the eager feed's
        `feed_unwindowed`): none, unless an adapter says otherwise from tensors (`graph_attributes`)."""
        return False

    def _additive_masks(self, allowed: torch.Tensor, sliding: torch.Tensor | None):
        """The bool masks [B, 1, N, C] as the model reads them: additive, one per attention layer type."""
        neg = torch.finfo(self.dtype).min
        additive = lambda a: torch.zeros(a.shape, dtype=self.dtype, device=a.device).masked_fill(~a, neg)  # noqa
        if sliding is None:
            return additive(allowed)
        if set(self.layer_types) == {"sliding_attention"}:
            return additive(sliding)
        full, slid = additive(allowed), additive(sliding)
        return {t: (slid if t == "sliding_attention" else full) for t in set(self.layer_types)}


class StaticHFCausalLM(StaticFeed, HFCausalLM):
    """`HFCausalLM` at fixed shapes: the engine of every decoder the core serves without an adapter."""


def _get(obj, name: str):
    """`obj.name`, `name` dotted or not."""
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _set(obj, name: str, value) -> None:
    head, _, last = name.rpartition(".")
    setattr(_get(obj, head) if head else obj, last, value)


def generic_step(engine: StaticFeed, request: FeatureRequest, masks, positions: torch.Tensor,
                  tokens: dict):
    """One forward of the engine's model over the padded nodes (what `compile` compiles): float32 logits
    [B, N, V], the final hidden state [B, N, H] if asked, and the residual stream entering each asked layer."""
    out, features = engine.run_forward(request, attention_mask=masks, position_ids=positions, **tokens)
    logits = out.logits.float()
    if features is None:
        return logits, None, ()
    return logits, features.hidden, tuple(features.layers[i] for i in request.layers)


__all__ = ["ColumnCache", "ColumnLayer", "StaticFeed", "StaticHFCausalLM", "model_unsupported"]
