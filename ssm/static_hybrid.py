"""The fixed-shape tree step of the hybrid SSM/attention targets (`hybrid.BambaTarget` and its subclasses: Bamba,
GraniteMoeHybrid, NemotronH, Jamba, FalconH1, LFM2, Zamba2, Qwen3-Next), for `EngineConfig(step="static" |
"compiled")` and CUDA graphs.

Both halves of the static engines meet here. The attention layers keep their K/V as the core's `StaticFeed` does
(`ColumnCache`: `capacity` columns per layer in buffers of fixed addresses, the tree's K/V written at the columns
the feed names, masks and positions built on tensors by `static_feed_tables`, commits that move columns in
place); the layers with a recurrent state keep it as `static.StaticSSM` does (buffers per batch size, copied
into by the prefill, a commit, `select` and `rollback`). The tree is padded to a node budget with root-only
padding nodes, the adapter's own `score_forward` (its tree layers: tree scan, tree conv, the delta rule, tree
attention) runs over it, and what each state layer keeps for the commit comes out as outputs of the one
function a CUDA graph captures. The prompt is prefilled eagerly by the adapter (the model's own forward or its
unpadded scan), then copied into the buffers. The commit trusts the verdict's path (the eager adapter checks it),
so a step reads the device once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel

from multispec.plugin import (ColumnCache, FeatureRequest, NO_FEATURES, StaticFeed, TargetOutput, padded,
                              static_feed_tables)

from .hybrid import (BambaTarget, FalconH1Target, GraniteMoeHybridTarget, JambaTarget, Lfm2Target, NemotronHTarget,
                     Zamba2Target)
from .qwen3_next import Qwen3NextTarget
from .static import flat_step, state_buffers, unflat_step


class StaticHybrid(StaticFeed):
    """Mixed in before a `BambaTarget` subclass: its tree step at fixed shapes (see the module docstring)."""

    check_paths = False  # the commit trusts the verdict's path: no host read

    def __init__(self, model: PreTrainedModel, name: str = "target", *, capacity: int | None = None,
                 node_budget: int | Sequence[int] = 16, compile: bool | str | Callable = False,
                 compile_mode: str | None = None, cuda_graphs: bool | None = None):
        """As `StaticFeed`'s (`capacity` attention columns per row, `node_budget` the padded tree sizes)."""
        super(StaticFeed, self).__init__(model)  # the adapter's own (StaticFeed's refuses recurrent states)
        self.name = name
        self.init_static(hybrid_step, model.config.get_text_config(decoder=True), capacity, node_budget, compile,
                         compile_mode, cuda_graphs)
        # `init_static` keeps the step function as `_step`, which the adapter uses for the scored tree's steps
        self._static_fn, self._step = self._step, None
        self._pool: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._state_pool: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._layout: list[tuple[int, type]] = []
        if self._ntk is not None:  # the hybrid step rotates outside the model's forward: not per token there
            raise ValueError(f"{name}: dynamic NTK RoPE on a hybrid's fixed-shape step is not served; use step='eager'")

    # ---- buffers --------------------------------------------------------------------------------------
    def dynamic_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (K, V); a layer without attention gives empty [B, 1, 0, 1] placeholders."""
        b = self.batch_size
        empty = torch.zeros(b, 1, 0, 1, dtype=self.dtype, device=self.device)
        out = []
        for layer in self.cache.layers:
            keys = getattr(layer, "keys", None)
            out.append((keys, layer.values) if keys is not None and keys.dim() == 4 else (empty, empty))
        return out

    def adopt(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The attention layers' K/V into the fixed buffers (a placeholder stays one); the states too."""
        attention = [i for i, (k, _) in enumerate(kv) if k.shape[-1] > 0]
        if not attention:
            raise ValueError(f"{self.name}: no attention layer to keep K/V for")
        kv = [(k.clone(), v.clone()) for k, v in kv]
        self.check_capacity(max(kv[i][0].shape[2] for i in attention))
        buffers = self._buffers(kv[0][0].shape[0], [kv[i] for i in attention])
        layers = list(kv)
        for i, (bk, bv) in zip(attention, buffers):
            k, v = kv[i]
            bk[:, :, : k.shape[2]] = k
            bv[:, :, : v.shape[2]] = v
            layers[i] = (bk, bv)
        self.cache = ColumnCache(layers)
        self._adopt_states()

    def _adopt_states(self) -> None:
        keys = sorted(self.conv)
        conv, ssm = state_buffers(self._state_pool, [self.conv[i] for i in keys], [self.ssm[i] for i in keys],
                                  self.device)
        self.conv, self.ssm = dict(zip(keys, conv)), dict(zip(keys, ssm))

    @torch.no_grad()
    def probe_shapes(self, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A one-token prompt prefilled nothing: the K/V shapes from a throwaway forward with the adapter's cache."""
        kept = self.cache
        self.cache = self.new_cache()
        self.decoder(input_ids=torch.zeros(b, 1, dtype=torch.long, device=self.device), past_key_values=self.cache,
                     use_cache=True)
        shapes = [(k[:, :, :0], v[:, :, :0]) for k, v in self.dynamic_layers()]
        self.cache = kept
        return shapes

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        out = super(StaticFeed, self).start(input_ids, attention_mask, **kwargs)  # the adapter's prefill
        kv = self.dynamic_layers()
        if all(k.shape[2] == 0 for k, _ in kv):
            kv = self.probe_shapes(input_ids.shape[0])
        self.adopt(kv)
        return out

    def commit(self, path: torch.Tensor, counts: Sequence[int] | None = None) -> None:
        super().commit(path, counts)
        self._adopt_states()

    def rollback(self, state: tuple) -> None:
        super().rollback(state)
        self._adopt_states()

    # ---- the step -------------------------------------------------------------------------------------
    def kv_pointers(self) -> tuple[int, ...]:
        kv = tuple(t.data_ptr() for layer in self.cache.layers for t in (layer.keys, layer.values))
        return kv + tuple(t.data_ptr() for t in (*self.conv.values(), *self.ssm.values()))

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None, *,
             inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        b, m = tokens.shape
        if self.num_pending:
            raise RuntimeError("score: commit or discard the previous tree first (one tree per step)")
        if parents.shape != (b, m):
            raise ValueError(f"parents: expected shape {(b, m)}, got {tuple(parents.shape)}")
        if b != self.batch_size:
            raise ValueError(f"tokens: batch {b} does not match the {self.batch_size} active rows")
        if m == 0:
            raise ValueError("tokens: a tree needs its root")
        n = next((s for s in self.buckets if s >= m), 1 << (m - 1).bit_length())
        device = self.device
        self.check_capacity(self.width + n)
        valid = torch.ones(b, m, dtype=torch.bool, device=device) if valid is None else valid.to(device)
        inp = tokens.to(device) if inputs_embeds is None else inputs_embeds.to(device)
        dynamic = (padded(inp, n), parents.to(device), valid, self.pending.parents, self.length, self.start_col,
                   torch.arange(self.width, self.width + n, device=device))
        out = self.run_feed(dynamic, 0, (), request.hidden)
        copy_out = self.cuda_graphs or self.compiled and device.type == "cuda"  # graph outputs get reused
        keep = (lambda x: x[:, :m].clone()) if copy_out else (lambda x: x[:, :m])  # noqa: E731
        sources, steps = out[7], out[8]
        self._sources = keep(sources)
        self._step = {i: unflat_step(kind, tuple(map(keep, tensors)))
                      for (i, kind), tensors in zip(self._layout, steps)}
        return self.finish_feed(out[:7], m, request)

    def feed_tensors(self, inp, parents, valid, pending_parents, length, start_col, cols, *, p0: int,
             layers_wanted: tuple[int, ...], want_hidden: bool):
        n, m = inp.shape[1], parents.shape[1]
        ok, kept_parents, pos, anc, positions, allowed = static_feed_tables(
            parents, valid, pending_parents, length, start_col, cols, p0=p0, capacity=self.capacity,
            window=None, sliding_window=None)
        masks = self._additive_masks(allowed, None)
        self.cache.cols = cols
        # the tree's parents for the state layers, padded with roots (a bad parent is a root until the check)
        tree = torch.where(valid & (parents >= 0) & (parents < torch.arange(m, device=parents.device)), parents, -1)
        tree = padded(tree + 1, n) - 1
        tokens = dict(input_ids=inp) if inp.dim() == 2 else dict(inputs_embeds=inp)
        logits, hidden, sources, steps = self._static_fn(self, FeatureRequest(hidden=want_hidden), masks,
                                                         self.node_positions(positions), tokens, tree)
        return logits, hidden, (), ok, kept_parents, pos, anc, sources, steps


def hybrid_step(engine: StaticHybrid, request: FeatureRequest, masks, positions: torch.Tensor, tokens: dict,
                parents: torch.Tensor):
    """One tree step of a hybrid over N padded nodes (what `compile` compiles): float32 logits [B, N, V], the
    final hidden [B, N, H] if asked, the conv sources and each state layer's step tensors."""
    logits, features = engine.score_forward(tokens, masks, positions, None, request, parents)
    steps = engine._step
    engine._layout = [(i, type(s)) for i, s in steps.items()]
    engine._step = None  # rebuilt from the outputs (a replayed graph runs no Python)
    hidden = features.hidden if features is not None else None
    return logits, hidden, engine._sources, tuple(flat_step(s) for s in steps.values())


# each hybrid adapter's fixed-shape class
class StaticBambaTarget(StaticHybrid, BambaTarget):
    """`BambaTarget` on the fixed-shape step."""


class StaticGraniteMoeHybridTarget(StaticHybrid, GraniteMoeHybridTarget):
    """`GraniteMoeHybridTarget` on the fixed-shape step."""


class StaticNemotronHTarget(StaticHybrid, NemotronHTarget):
    """`NemotronHTarget` on the fixed-shape step."""


class StaticJambaTarget(StaticHybrid, JambaTarget):
    """`JambaTarget` on the fixed-shape step."""


class StaticFalconH1Target(StaticHybrid, FalconH1Target):
    """`FalconH1Target` on the fixed-shape step."""


class StaticLfm2Target(StaticHybrid, Lfm2Target):
    """`Lfm2Target` on the fixed-shape step."""


class StaticZamba2Target(StaticHybrid, Zamba2Target):
    """`Zamba2Target` on the fixed-shape step."""


class StaticQwen3NextTarget(StaticHybrid, Qwen3NextTarget):
    """`Qwen3NextTarget` on the fixed-shape step."""


FIXED_SHAPE_CLASSES = {BambaTarget: StaticBambaTarget, GraniteMoeHybridTarget: StaticGraniteMoeHybridTarget,
                       NemotronHTarget: StaticNemotronHTarget, JambaTarget: StaticJambaTarget,
                       FalconH1Target: StaticFalconH1Target, Lfm2Target: StaticLfm2Target,
                       Zamba2Target: StaticZamba2Target, Qwen3NextTarget: StaticQwen3NextTarget}

__all__ = ["FIXED_SHAPE_CLASSES", "StaticBambaTarget", "StaticFalconH1Target", "StaticGraniteMoeHybridTarget",
           "StaticHybrid", "StaticJambaTarget", "StaticLfm2Target", "StaticNemotronHTarget", "StaticQwen3NextTarget",
           "StaticZamba2Target", "hybrid_step"]
