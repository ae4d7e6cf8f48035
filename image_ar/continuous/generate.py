"""`generate_continuous`: continuous speculative decoding for a diffusion-head AR model, on the core's
continuous loop (`multispec.continuous.continuous_generate`): a draft model or a `PatchEagle` drafts chains of
denoising trajectories, the target scores a chain in one pass, and `TrajectoryRatio` (`trajectory_ratio.py`:
the acceptance, its residual and the lossy `relax` knob with its measured cost) decides. Without a draft, the
target samples alone through the same runner (`targets.plain_trajectories`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from multispec import EngineConfig
from multispec.plugin import ContinuousOutput, SpeculativeStats, checked, continuous_generate

from .diffusion_head import Trajectory
from .drafters import PatchARDrafter, PatchEagle, PatchEagleDrafter, check_eagle
from .head_sampler import HeadSampler, HeadSampling
from .patch_ar import PatchAR, check_pair, unpatchify
from .static import StaticContinuous
from .targets import PatchARTarget, plain_trajectories
from .trajectory_ratio import TrajectoryRatio


@dataclass
class ContinuousImageOutput:
    images: torch.Tensor  # [B, 28, 28] in [0, 1]
    tokens: torch.Tensor  # [B, L, D] the readouts (x̂0) in [-1, 1]
    trajectories: torch.Tensor  # [B, L, S, D]
    seconds: float
    accepted: int = 0
    drafted: int = 0
    residual_fallbacks: int = 0
    stats: SpeculativeStats | None = None
    prefilled: int = 0
    tv_per_token: float = 0.0  # a relaxed rule's estimated TV from the target's law per token (0: exact)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    def origins(self) -> list[str]:
        """Batch 1: per token, who wrote it: "prefill" (the target before drafting), "draft" (an accepted
        draft) or "target" (a correction or bonus draw)."""
        if self.tokens.shape[0] != 1:
            raise ValueError("origins: defined for batch 1 (rows in lockstep share their steps)")
        out = ["prefill"] * self.prefilled
        for step in (self.stats.steps if self.stats is not None else []):
            out += ["draft"] * step.accepted + ["target"] * (step.committed - step.accepted)
        return out[: self.tokens.shape[1]]


def _check_labels(model: PatchAR, labels) -> torch.Tensor:
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.dtype.is_floating_point or not len(labels):
        raise ValueError(f"labels: expected a non-empty 1-D integer tensor of classes, got {labels!r}")
    if labels.min() < 0 or labels.max() >= model.config.num_classes:
        raise ValueError(f"labels: classes must lie in [0, {model.config.num_classes})")
    return labels.to(model.pos.device)


def _speculate(target: PatchAR, labels: torch.Tensor, sampler: HeadSampler, draft, draft_sampler: HeadSampler,
               trajs: torch.Tensor, new: int, k: int, rule, generator, step: str) -> tuple[ContinuousOutput, torch.Tensor]:
    """The speculative part: `new` trajectories after `trajs` on the eager loop or the fixed-shape step, and
    their readouts."""
    if step != "eager":
        engine = StaticContinuous(target, labels, sampler, draft, draft_sampler, k, rule, compile=step == "compiled")
        result = engine.generate(trajs, new, generator)
        return result.output, result.readouts
    adapter = PatchARTarget(target, labels, sampler)
    if isinstance(draft, PatchEagle):  # the draft samples with the target's own head
        drafter = PatchEagleDrafter(draft, adapter, sampler)
    else:
        drafter = PatchARDrafter(draft, labels, draft_sampler)
    spec = continuous_generate(adapter, drafter, trajs, new, k=k, rule=rule, generator=generator)
    return spec, torch.cat(adapter.readouts, 1)


@torch.no_grad()
def generate_continuous(target: PatchAR, labels: torch.Tensor, draft: PatchAR | None = None, *, tree: int = 4,
                        prefill: float = 0.1, sampling: HeadSampling | None = None, rule: TrajectoryRatio | None = None,
                        generator: torch.Generator | None = None,
                        engine: EngineConfig | None = None) -> ContinuousImageOutput:
    """Class-conditional images from `target`: plainly (draft None) or speculatively with `draft`, a small
    `PatchAR` (a draft model with its own head) or a `PatchEagle` (which samples with the target's head).

    `tree`: the drafts per step (a chain of that many tokens). `prefill`: the fraction of tokens the target
    generates alone before drafting starts (at least one). `sampling`: `HeadSampling` (grid points, noise
    temperature, guidance on ε; default guidance 2.0 on the target's grid). `engine.step`: "eager", "static" (the
    speculative steps at fixed shapes, `static.StaticContinuous`, in a CUDA graph on CUDA) or "compiled" (that step
    under `torch.compile`); the target's plain prefill runs eagerly."""
    labels = _check_labels(target, labels)
    k = tree
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"tree: expected a positive int (the drafts per step), got {k!r}")
    sampling = sampling if sampling is not None else HeadSampling()
    if not isinstance(sampling, HeadSampling):
        raise TypeError(f"sampling: expected a HeadSampling, got {type(sampling).__name__}")
    step = checked(engine, EngineConfig, "engine").step
    guidance_scale = sampling.guidance_scale
    c = target.config
    if not 0 <= prefill <= 1:
        raise ValueError(f"prefill: expected a fraction in [0, 1], got {prefill!r}")
    trajectory = Trajectory.make(sampling.steps if sampling.steps is not None else c.steps, c.stop,
                                 sampling.temperature)
    sampler = HeadSampler(target, trajectory, guidance_scale)
    t0 = time.perf_counter()
    if draft is None:
        trajs, reads = plain_trajectories(target, labels, sampler, c.tokens, generator)
        out = ContinuousImageOutput(reads.new_zeros(0), reads, trajs, 0.0, prefilled=c.tokens)
    else:
        eagle = isinstance(draft, PatchEagle)
        if eagle:
            check_eagle(target, draft)
        elif isinstance(draft, PatchAR):
            check_pair(target, draft)
        else:
            raise TypeError(f"draft: expected a PatchAR (a draft model) or a PatchEagle, got {type(draft).__name__}")
        m = min(c.tokens, max(1, math.ceil(prefill * c.tokens)))
        trajs, reads = plain_trajectories(target, labels, sampler, m, generator)
        if m < c.tokens:
            draft_sampler = sampler if eagle else HeadSampler(draft, trajectory, guidance_scale)
            spec, new_reads = _speculate(target, labels, sampler, draft, draft_sampler, trajs, c.tokens - m, k,
                                         rule or TrajectoryRatio(), generator, step)
            trajs = spec.values
            reads = torch.cat([reads, new_reads], 1)[:, : c.tokens]  # the last step may overshoot
            stats = spec.stats
            out = ContinuousImageOutput(reads.new_zeros(0), reads, trajs, 0.0, stats.accepted, stats.drafted,
                                        spec.residual_fallbacks, stats, m, spec.tv_per_token)
        else:
            out = ContinuousImageOutput(reads.new_zeros(0), reads, trajs, 0.0, prefilled=m)
    out.seconds = time.perf_counter() - t0
    out.trajectories = out.trajectories.reshape(len(labels), c.tokens, trajectory.steps, c.token_dim)
    out.images = (unpatchify(out.tokens.clamp(-1, 1), c.patch) + 1) / 2
    return out
