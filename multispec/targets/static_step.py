"""A static-shape model step for the lean engine, so the per-step launch and Python overhead can be
compiled away (`torch.compile`) and, on CUDA, replayed from a captured CUDA graph.

`StaticLeanCausalLM` is `LeanCausalLM` (same bookkeeping, same prefill) whose tree-feeding calls run one
function of fixed shapes, `static_step`:

- the K/V cache is one tensor for all layers (`capacity` columns), allocated once per batch size and engine
  (reused across generations: a captured graph keeps reading the same addresses);
- the new nodes are padded to a node budget (the smallest of `node_budget`'s sizes that holds them), with
  position 0 and a mask row that attends to column 0 only; their K/V land in the spare columns after the
  real nodes, which the bookkeeping never reads;
- positions, the mask over all `capacity` columns (bool, made additive inside the graph) and the cache
  columns to write are tensors, so nothing about the step's state is baked into the graph; they are built
  from the engine's state by `static_feed_tables`, on tensors alone.

One compiled function serves every step of a given (batch size, budget, input kind, feature request). On
CUDA one graph is captured per feed shape (budget, new nodes, pending nodes: a handful for a chain or a
fixed tree) around the tables and the decoder pass together, so a feed is a few input copies and one replay
(measured on an H100: BENCHMARKS.md, GPU). Neither number grows with the number of steps (tests check it).
The prefill (one per generation, of the prompt's length) stays eager.

Opt in with `speculative_generate(..., engine=EngineConfig(step="static" | "compiled"))` (`static_engines`:
engines built once per model and kept on it), per engine with `StaticLeanCausalLM(model, capacity=..., node_budget=...,
compile=...)`, or for a target/drafter pair with `static_pair(target, drafter, ...)` (the drafter's lean
engine, e.g. an EAGLE head's, is swapped for a static one). On CUDA the step is captured in CUDA graphs by
default (`cuda_graphs`), around the compiled function when `compile` is set.

Host synchronisation: `StaticLeanCausalLM.feed` (bookkeeping and call) reads nothing back from the device
(its check of the parents joins the step's one read, `multispec.host`), and `commit` takes the counts the
session read; with an EAGLE chain or tree the whole step reads the device once (tests/core/test_host_reads.py).
"""

from __future__ import annotations

import abc
import copy
import types
from typing import NamedTuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..host import require
from ..tree import ancestor_mask_from_parents
from .base import NO_FEATURES, FeatureRequest, Features, TargetOutput
from .hf import PendingNodes
from .lean import LeanCausalLM, BufferedLayer, UsedColumns


class LeanWeights(NamedTuple):
    """A decoder's weights as `static_step` reads them: per layer the packed tuple of `_layer_weights`, the
    embedding, the final norm (weight, eps) and the head (weight, bias)."""

    layers: tuple
    embed: torch.Tensor
    final_norm: tuple
    head: tuple


def static_step(inp: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cols: torch.Tensor,
                rope: torch.Tensor, kv: tuple, model: LeanWeights, layers_wanted: tuple[int, ...], want_hidden: bool):
    """One decoder pass over N padded nodes, writing their K/V into the cache in place.

    `inp`: token ids [B, N] (long) or input embeddings [B, N, H]; `positions` [B, N]; `mask` [B, 1, N, C]
    over all C cache columns (the new nodes' own columns included), additive float or bool (True = attend); `cols` [N]: the cache column
    each node's K/V goes to; `rope` [2, P, D] (cos, sin by position); `kv`: per layer (keys, values)
    [B, KVH, C, D]; `model`: the weights (`LeanWeights`). Returns (float32 logits [B, N, V], final normed hidden
    [B, N, H] or None,
    residual stream entering each of `layers_wanted`)."""
    weights, final_norm, head = model.layers, model.final_norm, model.head
    x = F.embedding(inp, model.embed) if inp.dim() == 2 else inp
    b, n, _ = x.shape
    if mask.dtype == torch.bool:  # allowed entries: the additive float mask the eager engines use
        mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill(~mask, torch.finfo(x.dtype).min)
    table = rope[:, positions]  # [2, B, N, D]
    cos, sin = table[0, :, None], table[1, :, None]
    captured = []
    for i, ((keys, values), w) in enumerate(zip(kv, weights)):
        (ln1, eps1, qkv_w, qkv_b, o_w, o_b, scaling, heads, kv_heads, head_dim, ln2, eps2, gu_w, gu_b, down_w,
         down_b) = w
        if i in layers_wanted:
            captured.append(x)
        h = F.rms_norm(x, (x.shape[-1],), ln1, eps1)
        n_qk = heads + kv_heads
        qkv = F.linear(h, qkv_w, qkv_b).view(b, n, 2 * n_qk + kv_heads, head_dim).transpose(1, 2)
        qk = qkv[:, :n_qk] * cos + qkv[:, n_qk + kv_heads:] * sin  # rotary: x cos + rotate_half(x) sin
        keys.index_copy_(2, cols, qk[:, heads:])
        values.index_copy_(2, cols, qkv[:, n_qk: n_qk + kv_heads])
        attn = F.scaled_dot_product_attention(qk[:, :heads], keys, values, attn_mask=mask, scale=scaling,
                                              enable_gqa=heads != kv_heads)
        x = x + F.linear(attn.transpose(1, 2).reshape(b, n, -1), o_w, o_b)
        h = F.rms_norm(x, (x.shape[-1],), ln2, eps2)
        gate, up = F.linear(h, gu_w, gu_b).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, down_w, down_b)
    if len(weights) in layers_wanted:
        captured.append(x)
    x = F.rms_norm(x, (x.shape[-1],), final_norm[0], final_norm[1])
    logits = F.linear(x, head[0], head[1]).float()
    return logits, (x if want_hidden else None), tuple(captured)


def _layer_weights(p) -> tuple:
    return (p.ln1, p.eps1, p.qkv, p.qkv_bias, p.o, p.o_bias, p.scaling, p.heads, p.kv_heads, p.head_dim, p.ln2,
            p.eps2, p.gate_up, p.gate_up_bias, p.down, p.down_bias)


def node_buckets(node_budget: int | Sequence[int]) -> tuple[int, ...]:
    """The padded widths a step may take: an int n gives 1, 2, 4, ... below n, and n; a sequence is taken
    as given (sorted)."""
    if isinstance(node_budget, int) and not isinstance(node_budget, bool):
        if node_budget < 1:
            raise ValueError(f"node_budget: expected a positive int, got {node_budget}")
        sizes, s = [], 1
        while s < node_budget:
            sizes.append(s)
            s *= 2
        return tuple(sizes + [node_budget])
    sizes = tuple(sorted(set(int(s) for s in node_budget)))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"node_budget: expected positive sizes, got {node_budget!r}")
    return sizes


def padded(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` [B, M, ...] in a new contiguous [B, n, ...] tensor, zeros after M."""
    out = t.new_zeros(t.shape[0], n, *t.shape[2:])
    out[:, : t.shape[1]] = t
    return out


class _PooledColumns(UsedColumns):
    """As `UsedColumns`, but an assignment that is not a crop copies into the engine's fixed buffer."""

    def __set__(self, layer, value: torch.Tensor) -> None:
        buf, layer.used = layer.adopt(self.slot, value)
        setattr(layer, self.slot, buf)


class _StaticLayer(BufferedLayer):
    """One layer's K/V in a buffer of the engine's fixed capacity (one buffer per batch size, reused)."""

    keys = _PooledColumns()
    values = _PooledColumns()

    def __init__(self, engine: "StaticLeanCausalLM", index: int) -> None:
        super().__init__()
        self.engine, self.index = engine, index

    def adopt(self, slot: str, value: torch.Tensor) -> tuple[torch.Tensor, int]:
        buf = getattr(self, slot)
        if buf is not None and value.data_ptr() == buf.data_ptr() and value.stride() == buf.stride():
            return buf, value.shape[2]  # a crop: same storage, fewer columns
        self.engine.check_capacity(value.shape[2])
        dest = self.engine.kv_buffer(value.shape[0], self.index, slot)
        if value.untyped_storage().data_ptr() == dest.untyped_storage().data_ptr():
            value = value.clone()  # e.g. the dead leading columns trimmed after `select`: overlapping copy
        dest[:, :, : value.shape[2]] = value
        return dest, value.shape[2]

    def ensure(self, batch: int) -> None:
        """Point at the engine's buffers for `batch` rows (nothing used yet)."""
        if self._keys is None or self._keys.shape[0] != batch:
            if self.used:
                raise RuntimeError("static cache: the batch size changed without `select`")
            self._keys = self.engine.kv_buffer(batch, self.index, "_keys")
            self._values = self.engine.kv_buffer(batch, self.index, "_values")

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, m = self.used, k.shape[2]
        self.engine.check_capacity(n + m)
        self.ensure(k.shape[0])
        self._keys[:, :, n: n + m] = k
        self._values[:, :, n: n + m] = v
        self.used = n + m
        return self._keys[:, :, : n + m], self._values[:, :, : n + m]


class _StaticCache:
    def __init__(self, engine: "StaticLeanCausalLM", num_layers: int) -> None:
        self.layers = [_StaticLayer(engine, i) for i in range(num_layers)]


@dataclass
class CapturedGraph:
    """One captured CUDA graph: the per-call inputs it reads, the outputs it writes."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple


def capture_graph(run: Callable, dynamic: tuple, device: torch.device, pool=None) -> CapturedGraph:
    """`run(*inputs)` captured in a CUDA graph (in memory pool `pool`, default a new one) over copies of `dynamic`:
    two warm-up runs on a side stream (a compiled `run` compiles there), the capture, one replay; the replay's
    outputs are this call's result. A later call copies its inputs into `graph.inputs` and replays. What `run`
    mutates, the warm-ups mutate too: a caller whose `run` advances a state saves and restores it."""
    inputs = tuple(t.clone() for t in dynamic)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            run(*inputs)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle() if pool is None else pool):
        outputs = run(*inputs)
    graph.replay()
    return CapturedGraph(graph, inputs, outputs)


class CapturedFeed(abc.ABC):
    """A feed run as one function of tensors (`fed(*dynamic, p0=, layers_wanted=, want_hidden=)`), on CUDA
    captured once per shape in a CUDA graph and replayed: a feed is then a few input copies and one replay. The
    engine names its cache buffers (`kv_pointers`): a graph reads fixed addresses."""

    def init_static(self, step: Callable, text_config, capacity: int | None, node_budget: int | Sequence[int],
                    compile: bool | str | Callable, compile_mode: str | None, cuda_graphs: bool | None) -> None:
        """What every fixed-shape engine sets up: its node budgets, its capacity (default: the model's
        `max_position_embeddings` plus the largest budget), its CUDA graphs, and `step` as `self._step` (under
        `torch.compile` when asked), a code object of its own per engine name: dynamo's cache and recompile
        limit are per code object, so a target and a drafter do not share (or exhaust) one."""
        self.buckets = node_buckets(node_budget)
        if capacity is None:
            capacity = int(getattr(text_config, "max_position_embeddings", 2048)) + self.buckets[-1]
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= self.buckets[-1]:
            raise ValueError(f"capacity: expected an int above the largest node budget ({self.buckets[-1]}), "
                             f"got {capacity!r}")
        # a multiple of 16: the mask's rows stay aligned for the fused CUDA attention kernels
        self.capacity = -(-capacity // 16) * 16
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs: the model is not on a CUDA device")
        self._graphs: dict[tuple, CapturedGraph] = {}
        self._graph_pool = None
        self.compiled = compile is not False
        self.static_calls = 0  # feeding calls that ran the static step (the rest ran eagerly)
        label = f"{step.__name__}_{self.name}"
        fn = types.FunctionType(step.__code__.replace(co_name=label), step.__globals__, label)
        if compile is False:
            self._step = fn
            return
        options = dict(fullgraph=True, dynamic=False)
        if compile is not True:
            options["backend"] = compile
        if compile_mode is not None:
            options["mode"] = compile_mode
        self._step = torch.compile(fn, **options)
        limit = 8 * len(self.buckets)  # one graph per (batch size, budget, input kind, request)
        if torch._dynamo.config.recompile_limit < limit:
            torch._dynamo.config.recompile_limit = limit

    def check_capacity(self, columns: int) -> None:
        if columns > self.capacity:
            raise ValueError(f"capacity: {self.name} needs {columns} cache columns, more than its capacity "
                             f"({self.capacity}); build it with a larger `capacity`")

    @abc.abstractmethod
    def kv_pointers(self) -> tuple[int, ...]:
        """The addresses of the engine's cache buffers (part of a graph's key)."""

    def run_feed(self, dynamic: tuple, p0: int, layers_wanted: tuple[int, ...], want_hidden: bool):
        run = lambda *args: self.fed(*args, p0=p0, layers_wanted=layers_wanted, want_hidden=want_hidden)  # noqa
        if not self.cuda_graphs:
            return run(*dynamic)
        inp, parents = dynamic[:2]
        key = (inp.shape, inp.dtype, parents.shape[1], p0, layers_wanted, want_hidden, self.kv_pointers())
        graph = self._graphs.get(key)
        if graph is None:
            graph = self.capture(run, dynamic)
            self._graphs[key] = graph
        else:
            for static, new in zip(graph.inputs, dynamic):
                static.copy_(new)
            graph.graph.replay()
        return graph.outputs

    def capture(self, run: Callable, dynamic: tuple) -> CapturedGraph:
        """Warm up (and compile) on a side stream, then capture the feed; the capture's own run is this call's
        result (the K/V it writes go to this call's columns)."""
        self.before_capture()
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        return capture_graph(run, dynamic, self.device, self._graph_pool)

    def before_capture(self) -> None:
        """What must exist before a capture (allocations of the engine's own): nothing by default."""

    def finish_feed(self, out: tuple, m: int, request: FeatureRequest) -> TargetOutput:
        """The feed's result from `fed`'s outputs (padded to the budget): the first `m` nodes' logits and
        features, the pending forest's tables kept, the parents' check deferred to the step's read."""
        logits, hidden, layers, ok, kept_parents, pos, anc = out
        self.static_calls += 1
        copy_out = self.cuda_graphs or self.compiled and self.device.type == "cuda"  # graph outputs get reused
        keep = (lambda t: t[:, :m].clone()) if copy_out else (lambda t: t[:, :m])  # noqa: E731
        if self.cuda_graphs:
            ok, kept_parents, pos, anc = ok.clone(), kept_parents.clone(), pos.clone(), anc.clone()
        # deferred to the step's host read on CUDA (multispec.host); the tables clamp a bad parent to -1 first
        require(ok, lambda: ValueError("parents: a node's parent must be fed before it"))
        self.pending = PendingNodes(kept_parents, pos, anc)
        features = None
        if request.hidden or request.layers:
            features = Features(keep(hidden) if request.hidden else None,
                                {i: keep(t) for i, t in zip(request.layers, layers)})
        return TargetOutput(keep(logits), features)


class StaticLeanCausalLM(CapturedFeed, LeanCausalLM):
    """`LeanCausalLM` whose tree-feeding calls run the fixed-shape `static_step` (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, name: str = "target", window: int | None = None, *,
                 capacity: int | None = None, node_budget: int | Sequence[int] = 16,
                 compile: bool | str | Callable = False, compile_mode: str | None = None,
                 cuda_graphs: bool | None = None):
        """`capacity`: cache columns per row (prompt + generated tokens + one step's nodes + the padding of
        the largest budget); default: the model's `max_position_embeddings` plus the largest budget.
        `node_budget`: the padded widths of a step (`node_buckets`); a call with more nodes runs eagerly.
        `compile`: False (the static function as it is), True (`torch.compile`, inductor), or a backend
        name / callable for `torch.compile` (tests count graphs with one). `compile_mode`: passed to
        `torch.compile` (e.g. "reduce-overhead" with `cuda_graphs=False`: torch's own CUDA graphs).
        `cuda_graphs`: capture each static shape in a CUDA graph and replay it (default: on CUDA)."""
        super().__init__(model, name, window)
        self.init_static(static_step, model.config, capacity, node_budget, compile, compile_mode, cuda_graphs)
        self._kv: dict[tuple, torch.Tensor] = {}
        self._joint: dict[int, torch.Tensor] = {}  # batch size -> every layer's K and V (see `kv_buffer`)
        self._weights: tuple | None = None
        self._weights_key = None

    # ---- buffers --------------------------------------------------------------------------------------
    def new_cache(self) -> _StaticCache:
        self._pack()  # once per generation, as the lean engine does
        self._static_weights()
        return _StaticCache(self, len(self.model.model.layers))

    def kv_buffer(self, batch: int, layer: int, slot: str) -> torch.Tensor:
        """The engine's fixed K or V buffer for `batch` rows (zeros when new: masked columns must stay finite).
        Where every layer has the same K/V shape, all of them are views of one tensor [2 * layers, batch,
        kv heads, capacity, head dim] (`_joint`), so a commit moves every layer's columns in one copy."""
        key = (batch, layer, slot)
        if key not in self._kv:
            layers = self.model.model.layers
            shapes = [(a.k_proj.weight.shape[0] // a.head_dim, a.head_dim) for a in (ly.self_attn for ly in layers)]
            if len(set(shapes)) == 1:
                joint = torch.zeros(2 * len(layers), batch, shapes[0][0], self.capacity, shapes[0][1],
                                    dtype=self.dtype, device=self.device)
                self._joint[batch] = joint
                for i in range(len(layers)):
                    self._kv[(batch, i, "_keys")], self._kv[(batch, i, "_values")] = joint[2 * i], joint[2 * i + 1]
            else:
                kv_heads, head_dim = shapes[layer]
                self._kv[key] = torch.zeros(batch, kv_heads, self.capacity, head_dim, dtype=self.dtype,
                                            device=self.device)
            if self.device.type == "cuda":
                for k in [k for k in self._kv if k[0] == batch]:
                    torch._dynamo.mark_static_address(self._kv[k])
        return self._kv[key]

    def kv_pointers(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for layer in self.cache.layers for t in (layer._keys, layer._values))

    def before_capture(self) -> None:
        self._static_weights()  # its tables are allocations of their own

    def _move_columns(self, rows: torch.Tensor, dest: torch.Tensor, src: torch.Tensor) -> None:
        joint = self._joint.get(rows.shape[0])
        if joint is not None and all(layer._keys is self._kv.get((rows.shape[0], i, "_keys"))
                                     for i, layer in enumerate(self.cache.layers)):
            joint[:, rows, :, dest] = joint[:, rows, :, src]  # every layer's K and V in one copy
            return
        super()._move_columns(rows, dest, src)

    def _static_weights(self) -> tuple:
        """(`LeanWeights`, rope table), rebuilt when the packing changes."""
        if self._weights is not None and self._weights_key is self._packed_key:
            return self._weights
        packed = self._packed
        rope = self.model.model.rotary_emb
        freqs = torch.arange(self.capacity, device=self.device, dtype=torch.float32)[:, None] * rope.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        table = torch.stack([emb.cos(), emb.sin()]).mul(rope.attention_scaling).to(self.dtype)
        decoder, head = self.model.model, self.model.get_output_embeddings()
        weights = (LeanWeights(tuple(_layer_weights(p) for p in packed), decoder.embed_tokens.weight,
                               (decoder.norm.weight, decoder.norm.variance_epsilon), (head.weight, head.bias)), table)
        if self.device.type == "cuda":  # read in place by captured graphs (never copied in)
            layer_tensors = [t for w in weights[0].layers for t in w if isinstance(t, torch.Tensor)]
            for t in [*layer_tensors, table, decoder.embed_tokens.weight, decoder.norm.weight, head.weight, head.bias]:
                if t is not None:
                    torch._dynamo.mark_static_address(t)
        self._weights, self._weights_key = weights, self._packed_key
        self._graphs.clear()  # captured graphs read the old weights
        return weights

    # ---- the static call --------------------------------------------------------------------------------
    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None, *,
             inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        """`HFCausalLM.feed` without host synchronisation on CUDA: the call's bookkeeping (the pending forest's
        ancestry, positions and the mask in the static layout, `static_feed_tables`) runs on tensors alone, so
        on CUDA it is captured in the same graph as the decoder pass and one replay does the whole feed."""
        b, m = tokens.shape
        n = next((s for s in self.buckets if s >= m), None)
        mixed = self.sliding_window is not None and set(self.layer_types) != {"sliding_attention"}
        if n is None or m == 0 or mixed or parents.shape != (b, m) or b != self.batch_size or request.image_embeds:
            return super().feed(tokens, parents, valid, inputs_embeds=inputs_embeds, request=request)
        device = self.device
        p0, used = self.num_pending, self.cache.layers[0].used
        if used != self.width + p0:  # the pending nodes' K/V sit right after the committed columns
            raise RuntimeError(f"static cache: {used} columns used, expected {self.width} committed + {p0} pending")
        self.check_capacity(used + n)
        for layer in self.cache.layers:
            layer.ensure(b)
        valid = torch.ones(b, m, dtype=torch.bool, device=device) if valid is None else valid.to(device)
        inp = tokens.to(device) if inputs_embeds is None else inputs_embeds.to(device)
        # padded to the budget, in fresh tensors: dynamo guards on strides, size-1 dimensions' included, and
        # the bookkeeping hands over slices of wider tensors
        dynamic = (padded(inp, n), parents.to(device), valid, self.pending.parents, self.length, self.start_col,
                   torch.arange(used, used + n, device=device))
        out = self.run_feed(dynamic, p0, tuple(request.layers), request.hidden)
        for layer in self.cache.layers:
            layer.used = used + m
        return self.finish_feed(out, m, request)

    def fed(self, inp, parents, valid, pending_parents, length, start_col, cols, *, p0: int,
             layers_wanted: tuple[int, ...], want_hidden: bool):
        """The whole feed on tensors: its tables, then the decoder pass (what a CUDA graph captures)."""
        ok, kept_parents, pos, anc, positions, mask = static_feed_tables(
            parents, valid, pending_parents, length, start_col, cols, p0=p0, capacity=self.capacity,
            window=self.window, sliding_window=self.sliding_window)
        model, rope = self._static_weights()
        kv = tuple((layer._keys, layer._values) for layer in self.cache.layers)
        logits, hidden, layers = self._step(inp, positions, mask, cols, rope, kv, model, layers_wanted, want_hidden)
        return logits, hidden, layers, ok, kept_parents, pos, anc


def static_feed_tables(parents: torch.Tensor, valid: torch.Tensor, pending_parents: torch.Tensor,
                       length: torch.Tensor, start_col: torch.Tensor, cols: torch.Tensor, *, p0: int,
                       capacity: int, window: int | None, sliding_window: int | None):
    """A static feed's bookkeeping from tensors alone (no host read, no value-dependent shape), as
    `HFCausalLM.feed` does it: `parents` [B, M] pending indices of the new nodes' parents, `valid` [B, M],
    `pending_parents` [B, P0] those of the nodes fed since the last commit, `length` / `start_col` [B] each
    row's committed end and first column, `cols` [N] the cache columns this call's N (padded) nodes write (the
    first pending node sits at `cols[0] - P0`). Returns (all parents precede their child: a 0-d bool; the
    pending forest's parents [B, P0+M], positions [B, P0+M] and ancestor-or-self mask [B, P0+M, P0+M]; the new nodes'
    positions padded to N [B, N]; the mask [B, 1, N, capacity], bool, True = attend; padding rows read
    column 0 only)."""
    b, m = parents.shape
    n = cols.shape[0]
    device = parents.device
    before = parents < p0 + torch.arange(m, device=device)
    parents = torch.where(before, parents, -1)  # a bad parent cannot index out of the forest before the check
    has_parent = (parents >= 0) & valid
    kept_parents = torch.cat([pending_parents, torch.where(has_parent, parents, -1)], 1)
    anc = ancestor_mask_from_parents(kept_parents)  # [B, P0+M, P0+M]
    pos = (length - start_col)[:, None] + anc.sum(dim=-1) - 1  # a pending root sits at the row's length
    new_pos = pos[:, p0:]
    col = torch.arange(capacity, device=device)
    prefix = (col >= start_col[:, None]) & (col < length[:, None])  # [B, C]: committed, own row
    if window is not None:  # every row still sees at least its last `window` committed tokens
        prefix &= col >= (length.min() - window).clamp(min=0)
    rel = col - (cols[0] - p0)  # the pending index a column holds
    pending_col = (rel >= 0) & (rel < p0 + m)
    rel = rel.clamp(0, p0 + m - 1)
    allowed = torch.where(pending_col, anc[:, p0:].index_select(2, rel), prefix[:, None, :] & valid[:, :, None])
    if sliding_window is not None:
        key_pos = torch.where(pending_col, pos.index_select(1, rel), col - start_col[:, None])  # [B, C]
        allowed &= (new_pos[:, :, None] - key_pos[:, None, :]) < sliding_window
    padding = (col == 0).expand(b, n - m, capacity)  # padding nodes read column 0 (finite), never nothing
    allowed = torch.cat([allowed, padding], 1)[:, None]
    positions = torch.cat([new_pos, new_pos.new_zeros(b, n - m)], 1)
    return before.all(), kept_parents, pos, anc, positions, allowed


# ---- opting a pair in ---------------------------------------------------------------------------------------
def static_pair(target, drafter, *, capacity: int | None = None, node_budget: int | Sequence[int] = 16,
                compile: bool | str | Callable = False, compile_mode: str | None = None,
                cuda_graphs: bool | None = None):
    """(target, drafter) with their lean engines on the static step: `target` a Llama-family `transformers`
    model (or a `LeanCausalLM` around one), `drafter` a drafter whose `lm` is a `LeanCausalLM` (an
    `EagleDrafter`'s head, a lean `ModelDrafter`): a shallow copy of it gets a static engine over the same
    model (other drafters come back unchanged). Both get `capacity` columns (default: the target's
    `max_position_embeddings` plus the largest budget). Pass the pair to `speculative_generate`."""
    model = target.model if isinstance(target, LeanCausalLM) else target
    options = dict(node_budget=node_budget, compile=compile, compile_mode=compile_mode, cuda_graphs=cuda_graphs)
    static_target = StaticLeanCausalLM(model, name="target", capacity=capacity, **options)
    lm = getattr(drafter, "lm", None)
    if type(lm) is LeanCausalLM:
        drafter = copy.copy(drafter)
        drafter.lm = StaticLeanCausalLM(lm.model, name=lm.name, window=lm.window, capacity=static_target.capacity,
                                        **options)
    return static_target, drafter


def capacity_for(prompt_length: int, max_new_tokens: int, node_budget: int | Sequence[int] = 16,
                 draft_nodes: int = 16) -> int:
    """Cache columns that one generation needs at most: the prompt, the new tokens, and a step's pending
    nodes (a drafter's catch-up chain and its tree, `draft_nodes` at most) plus the padding of the largest
    budget."""
    return prompt_length + max_new_tokens + draft_nodes + 2 * node_buckets(node_budget)[-1]
