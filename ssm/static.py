"""The fixed-shape tree step of the state-space targets (Mamba-2, Mamba-1, FalconMamba), for
`EngineConfig(step="static" | "compiled")` and CUDA graphs.

The eager adapter (`targets.SSMTarget`) already scores a whole tree in one pass of tensor operations (the tree
conv, the tree scan, the ancestor mask); what keeps it from a captured graph is the tree's size, which changes
from step to step, the state tensors, which each commit replaces, and its checks, which read the device. Here:

- the tree is padded to a node budget (`node_buckets`): padding nodes are roots (parent -1) marked invalid, so
  each reads the committed state alone and no real node reads them;
- every layer's conv and SSM states live in buffers allocated once per batch size (reused across generations:
  a captured graph keeps reading the same addresses); the prefill, a commit, `select` and `rollback` copy the new
  states into them;
- the parents' check is deferred to the step's one read (`multispec.host.require`); the commit trusts the
  verdict's path (the rule builds it over the tree this engine scored; the eager adapter checks it), so a step
  reads nothing back from the device but the session's one read.

One function of tensors (`fed`: the layers, the final norm, the head) serves every step of a (batch size,
budget) shape; on CUDA it is captured once per shape and replayed, with `compile` under
`torch.compile(fullgraph=True)`. What each mixer keeps for the commit (pre-conv inputs, scan inputs or per-node
states) comes out of the graph as outputs. The prefill stays eager (one call per generation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields

import torch
from transformers import PreTrainedModel

from multispec.plugin import CapturedFeed, FeatureRequest, Features, NO_FEATURES, TargetOutput, padded, require

from .mamba1 import FalconMambaTarget, MambaTarget
from .mamba2 import Mamba2Target
from .targets import rms_norm


class StaticSSM(CapturedFeed):
    """Mixed in before an `SSMTarget` subclass: its `score` at fixed shapes (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, name: str = "target", *, capacity: int | None = None,
                 node_budget: int | Sequence[int] = 16, compile: bool | str | Callable = False,
                 compile_mode: str | None = None, cuda_graphs: bool | None = None):
        """`node_budget`: the padded tree sizes (`node_buckets`; a larger tree runs eagerly); `capacity` is
        accepted for the engines' common signature (a state-space step has no cache columns); `compile` False
        / True / a `torch.compile` backend; `cuda_graphs` (default: on CUDA)."""
        super().__init__(model)
        self.name = name
        self.init_static(ssm_step, model.config, capacity, node_budget, compile, compile_mode, cuda_graphs)
        # `init_static` keeps the step function as `_step`, which the adapter uses for the scored tree's steps
        self._static_fn, self._step = self._step, None
        self._pool: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._step_types: list[type] = []

    # ---- the state buffers ----------------------------------------------------------------------------
    def _adopt_states(self) -> None:
        """Copy the current states into the engine's buffers for this batch size; they become the states."""
        self.conv, self.ssm = state_buffers(self._pool, self.conv, self.ssm, self.device)

    def kv_pointers(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in (*self.conv, *self.ssm))

    def prefill(self, prompt, request: FeatureRequest = NO_FEATURES):
        out = super().prefill(prompt, request)
        self._adopt_states()
        return out

    def rollback(self, state: tuple) -> None:
        super().rollback(state)
        self._adopt_states()

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self._adopt_states()

    # ---- the step -------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None,
              request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        """`SSMTarget.score` at a fixed shape, without a host read (see the module docstring)."""
        b, t = tokens.shape
        n = next((s for s in self.buckets if s >= t), None)
        if n is None or t == 0 or parents.shape != (b, t) or b != self.batch_size or self._step is not None:
            return super().score(tokens, parents, valid, request)  # its errors, or an eager step past the budget
        self.check_request(request)
        device = self.device
        valid = torch.ones(b, t, dtype=torch.bool, device=device) if valid is None else valid.to(device)
        dynamic = (padded(tokens.to(device), n), padded(parents.to(device) + 1, n) - 1, padded(valid, n))
        out = self.run_feed(dynamic, 0, (), request.hidden)
        logits, hidden, ok, sources, steps = out
        self.static_calls += 1
        copy_out = self.cuda_graphs or self.compiled and device.type == "cuda"  # graph outputs get reused
        keep = (lambda x: x.clone()) if copy_out else (lambda x: x)  # noqa: E731
        require(ok.clone() if copy_out else ok, lambda: ValueError("parents: a node's parent must come before it"))
        self._sources = keep(sources)
        self._step = [unflat_step(kind, tuple(map(keep, tensors))) for kind, tensors in zip(self._step_types, steps)]
        self._tokens = dynamic[0]
        features = Features(keep(hidden[:, :t])) if request.hidden else None
        return TargetOutput(keep(logits[:, :t]), features)

    def fed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, *, p0: int,
            layers_wanted: tuple[int, ...], want_hidden: bool):
        """The whole step on tensors (what a CUDA graph captures): the parents' check, every layer over the
        padded tree, the final norm and the head; the mixers' steps and the conv sources as outputs."""
        return self._static_fn(self, tokens, parents, valid, want_hidden)

    check_paths = False  # the commit trusts the verdict's path (see the module docstring): no host read

    def commit(self, path: torch.Tensor) -> None:
        super().commit(path)
        self._adopt_states()


def ssm_step(engine: StaticSSM, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor,
             want_hidden: bool):
    """One tree step of `engine`'s model over N padded nodes (what `compile` compiles): (float32 logits
    [B, N, V], final normed hidden [B, N, H] or None, parents-precede-children flag, conv sources, each layer's
    step tensors)."""
    n = tokens.shape[1]
    parents = torch.where(valid, parents, -1)
    before = parents < torch.arange(n, device=parents.device)
    parents = torch.where(before, parents, -1)  # a bad parent is a root until the deferred check raises
    hidden = engine._layers(tokens, parents)
    steps = engine._step
    engine._step_types = [type(s) for s in steps]
    engine._step = None  # rebuilt from the outputs (a replayed graph runs no Python)
    hidden = rms_norm(engine.backbone.norm_f, hidden)
    logits = engine.model.lm_head(hidden.to(engine.model.lm_head.weight.dtype)).float()
    return logits, (hidden if want_hidden else None), before.all(), engine._sources, tuple(map(flat_step, steps))


def state_buffers(pool: dict, convs: list[torch.Tensor], ssms: list[torch.Tensor], device: torch.device
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`convs` and `ssms` copied into `pool`'s buffers for their batch size (made when missing or of other
    shapes; on CUDA marked as static addresses for captured graphs); returns the buffers, the states from now."""
    b = convs[0].shape[0] if convs else 0
    shapes = [(c.shape, s.shape) for c, s in zip(convs, ssms)]
    found = pool.get(b)
    if found is None or [(c.shape, s.shape) for c, s in zip(*found)] != shapes:
        found = ([torch.zeros_like(c) for c in convs], [torch.zeros_like(s) for s in ssms])
        if device.type == "cuda":
            for t in (*found[0], *found[1]):
                torch._dynamo.mark_static_address(t)
        pool[b] = found
    for bufs, states in zip(found, (convs, ssms)):
        for buf, state in zip(bufs, states):
            if buf is not state:  # a view of the buffer itself (e.g. rows selected) is copied through a clone
                same = buf.untyped_storage().data_ptr() == state.untyped_storage().data_ptr()
                buf.copy_(state.clone() if same else state)
    return list(found[0]), list(found[1])


def flat_step(step) -> tuple[torch.Tensor, ...]:
    """What a state layer keeps for the commit (a tensor, or a dataclass of tensors) as a tuple of tensors."""
    return (step,) if isinstance(step, torch.Tensor) else tuple(getattr(step, f.name) for f in fields(step))


def unflat_step(kind: type, tensors: tuple[torch.Tensor, ...]):
    """`flat_step`'s inverse, given the step's type."""
    return tensors[0] if issubclass(kind, torch.Tensor) else kind(*tensors)


class StaticMamba2Target(StaticSSM, Mamba2Target):
    """`Mamba2Target` on the fixed-shape step."""


class StaticMambaTarget(StaticSSM, MambaTarget):
    """`MambaTarget` on the fixed-shape step."""


class StaticFalconMambaTarget(StaticSSM, FalconMambaTarget):
    """`FalconMambaTarget` on the fixed-shape step."""


FIXED_SHAPE_CLASSES = {Mamba2Target: StaticMamba2Target, MambaTarget: StaticMambaTarget,
                       FalconMambaTarget: StaticFalconMambaTarget}

__all__ = ["FIXED_SHAPE_CLASSES", "StaticFalconMambaTarget", "StaticMamba2Target", "StaticMambaTarget", "StaticSSM",
           "flat_step", "ssm_step", "state_buffers", "unflat_step"]
