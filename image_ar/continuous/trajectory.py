"""The payload types of trajectory speculation: a chain of drafted denoising trajectories (`TrajectoryDraft`)
and a model's per-node law of the next trajectory (`TrajectoryNodes`), shared by the drafters
(`drafters.PatchARDrafter`, `drafters.PatchEagleDrafter`), the target adapter and the rule
(`trajectory_ratio.TrajectoryRatio`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multispec.plugin import ContinuousDraft

from .head_sampler import HeadConditions, HeadSampler


@dataclass
class TrajectoryNodes:
    """The target's (or draft's) per-node law of the next trajectory: `conditions` for B*T nodes."""

    sampler: HeadSampler
    conditions: HeadConditions
    shape: tuple[int, int]  # (B, T)

    def states(self, payload: torch.Tensor) -> torch.Tensor:
        b, t = payload.shape[:2]
        return payload.reshape(b * t, self.sampler.steps, self.sampler.dim)

    def log_prob(self, payload: torch.Tensor) -> torch.Tensor:
        states = self.states(payload)
        means, _ = self.sampler.means(self.conditions, states)
        return self.sampler.log_density(states, means).view(self.shape)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        b, t = self.shape
        states, _ = self.sampler.sample(self.conditions, self.sampler.noise(b * t, generator))
        return states.reshape(b, t, -1)

    def node(self, rows: torch.Tensor, nodes: torch.Tensor) -> HeadConditions:
        return self.conditions.take(rows * self.shape[1] + nodes)


@dataclass
class TrajectoryDraft(ContinuousDraft):
    """A chain of draft trajectories with the draft's own transition means [B, k, S - 1, D]."""

    means: torch.Tensor | None = None


__all__ = ["TrajectoryDraft", "TrajectoryNodes"]
