"""A `PatchAR` as the continuous loop's target, and the target sampling alone (the reference)."""

from __future__ import annotations

import torch

from .head_sampler import HeadSampler
from .patch_ar import PatchAR
from .runner import Runner
from .trajectory import TrajectoryNodes


class PatchARTarget:
    """A `PatchAR` as a continuous target (`multispec.continuous.ContinuousTarget`). It keeps the readout
    (x̂0) of every committed token in `readouts`, and the features an EAGLE-style draft reads: the
    conditions of the prefilled tokens (`prefill_features`) and of the last scored chain's nodes
    (`chain_features`), [2B or B, T, H]."""

    def __init__(self, model: PatchAR, labels: torch.Tensor, sampler: HeadSampler):
        self.runner = Runner(model, labels, sampler)
        self.sampler = sampler
        self.readouts: list[torch.Tensor] = []
        self.prefill_features = self.chain_features = None

    def prefill(self, values: torch.Tensor) -> None:
        self.prefill_features = self.runner.start(values[:, :-1])
        self.readouts = []

    def score(self, chain: torch.Tensor) -> TrajectoryNodes:
        z = self.runner.feed(chain)
        self.chain_features = z
        self._nodes = TrajectoryNodes(self.sampler, self.runner.conditions(z), tuple(chain.shape[:2]))
        return self._nodes

    def commit(self, kept: torch.Tensor) -> None:
        b, n = kept.shape[:2]
        rows = torch.arange(b, device=kept.device).repeat_interleave(n)
        nodes = torch.arange(n, device=kept.device).repeat(b)
        last = kept[..., -self.sampler.dim:].reshape(b * n, -1)
        self.readouts.append(self.sampler.readout(self._nodes.node(rows, nodes), last).view(b, n, -1))
        self.runner.cache.commit(n)


def plain_trajectories(model: PatchAR, labels: torch.Tensor, sampler: HeadSampler, n: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The target alone: n trajectories per row [B, n, S*D] and their readouts [B, n, D]."""
    runner = Runner(model, labels, sampler)
    z = runner.start(None)
    trajs, reads = [], []
    for i in range(n):
        cond = runner.conditions(z)
        states, _ = sampler.sample(cond, sampler.noise(len(labels), generator))
        reads.append(sampler.readout(cond, states[:, -1]))
        trajs.append(states.reshape(len(labels), 1, -1))
        if i + 1 < n:
            z = runner.feed(trajs[-1])
            runner.cache.commit(1)
    return torch.cat(trajs, 1), torch.stack(reads, 1)
