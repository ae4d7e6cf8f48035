"""Continuous speculative decoding for a diffusion-head AR model, on the core's continuous loop.

The payload of one token is its whole denoising trajectory (the S states, flattened to S*D; the emitted
token is the last state). The draft model samples a chain of k trajectories; the target runs its
transformer once over the chain and evaluates its own transition means *along the draft's trajectories*
(trajectory alignment: both models' reverse steps are compared on the same states with the draft's
noise), one batched head call for all k x S states. Draft i is accepted with probability

    min(1, p(τ_i) / q(τ_i)),   log p(τ) - log q(τ) = Σ_steps Σ_d [(x' - μq)² - (x' - μp)²] / (2 s²)

(`trajectory_log_ratio`, Triton beside its reference), in order; the first rejection discards every later
draft and draws the correction from norm(max(0, p - q)) by acceptance-rejection: proposals y ~ p (fresh
noise), kept with probability max(0, 1 - q(y)/p(y)) (the bound M = 1 since (p - q)⁺ <= p; one try
succeeds with probability TV(p, q)), `proposals` at a time, at most `max_tries` in all; a row whose
tries all fail takes a plain target draw, counted in `residual_fallbacks`. Trajectories distributed as
the target's give emitted tokens distributed as the target's, so the output follows the target's law.

`relax` > 1 is an explicit, lossy relaxation (the reference code's hidden inner temperature T = 42): the
log ratio is divided by relax², which accepts more drafts and moves the output toward the draft's law.
Its cost is measured, not hidden: a relaxed token's law is exactly E_q[min(1, r^(1/relax²)) - min(1, r)]
in total variation from the target's (r = p/q; the extra acceptance is taken from where p < q and
missing from the residual), and the rule reports that difference at every judged draft, so
`ContinuousImageOutput.tv_per_token` estimates the bound without bias.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from multispec.continuous import continuous_generate
from multispec.metrics import SpeculativeStats
from multispec.rules import ContinuousVerdict, DensityRatio
from multispec.sampling import uniform

from .continuous_eagle import PatchEagle, PatchEagleDrafter, check_eagle
from .diffusion_head import Trajectory
from .head_sampler import HeadConditions, HeadSampler
from .patch_ar import PatchAR, check_pair, unpatchify
from .trajectory import TrajectoryDraft, TrajectoryNodes
from .trajectory_kernel import trajectory_log_ratio


def _split(z: torch.Tensor, guided: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not guided:
        return z, None
    c, u = z.chunk(2)
    return c, u


class _Runner:
    """A model's transformer with a cache, run on both guidance halves ([cond rows; uncond rows])."""

    def __init__(self, model: PatchAR, labels: torch.Tensor, sampler: HeadSampler):
        self.model, self.sampler = model, sampler
        self.guided = sampler.guided
        b = len(labels)
        self.labels = torch.cat([labels, torch.full_like(labels, model.null_class)]) if self.guided else labels
        self.cache = model.new_cache(len(self.labels))
        self.batch = b
        self.dim = model.config.token_dim

    def tokens(self, payload: torch.Tensor) -> torch.Tensor:
        """Emitted tokens (last states) of trajectory payloads [B, T, S*D], doubled for guidance."""
        x = payload[..., -self.dim:]
        return torch.cat([x, x]) if self.guided else x

    def start(self, payload: torch.Tensor | None) -> torch.Tensor:
        """Class + the tokens of `payload` (committed); returns their transformer outputs [2B or B, T, H]:
        the conditions z_0 .. z_T of the tokens after each."""
        tokens = None if payload is None else self.tokens(payload)
        z = self.model.transform(self.model.inputs(self.labels, tokens, 0), self.cache)
        self.cache.commit(z.shape[1])
        return z

    def feed(self, payload: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Transformer outputs [2B or B, T, H] of tokens at the cache's length + offset (not committed)."""
        start = self.cache.length + offset
        return self.model.transform(self.model.inputs(None, self.tokens(payload), start), self.cache, offset)

    def conditions(self, z: torch.Tensor) -> HeadConditions:
        """Head conditions of transformer outputs [2B or B, ..., H], rows flattened in (row, node) order."""
        c, u = _split(z, self.guided)
        flat = lambda t: None if t is None else t.reshape(-1, t.shape[-1])  # noqa: E731
        return self.sampler.conditions(flat(c), flat(u))


class PatchARTarget:
    """A `PatchAR` as a continuous target (`multispec.continuous.ContinuousTarget`). It keeps the readout
    (x̂0) of every committed token in `readouts`, and the features an EAGLE-style draft reads: the
    conditions of the prefilled tokens (`prefill_features`) and of the last scored chain's nodes
    (`chain_features`), [2B or B, T, H]."""

    def __init__(self, model: PatchAR, labels: torch.Tensor, sampler: HeadSampler):
        self.runner = _Runner(model, labels, sampler)
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


class PatchARDrafter:
    """A small `PatchAR` drafting chains of trajectories (payload "continuous")."""

    payload = "continuous"

    def __init__(self, model: PatchAR, labels: torch.Tensor, sampler: HeadSampler):
        self.runner = _Runner(model, labels, sampler)
        self.sampler = sampler

    def start(self, values: torch.Tensor) -> None:
        self.runner.start(values[:, :-1])

    def propose(self, roots: torch.Tensor, k: int, generator: torch.Generator | None = None) -> TrajectoryDraft:
        b = roots.shape[0]
        previous = roots[:, None]
        payloads, means, logq, conds = [], [], [], []
        for j in range(k):
            cond = self.runner.conditions(self.runner.feed(previous, offset=j))
            states, mean = self.sampler.sample(cond, self.sampler.noise(b, generator))
            payloads.append(states.reshape(b, 1, -1))
            means.append(mean)
            logq.append(self.sampler.log_density(states, mean))
            conds.append(cond)
            previous = payloads[-1]
        self._fed = k
        conditions = HeadConditions(torch.stack([c.cond for c in conds], 1).flatten(0, 1),
                                    None if conds[0].uncond is None else torch.stack([c.uncond for c in conds], 1).flatten(0, 1),
                                    conds[0].scale)
        payload = torch.cat(payloads, 1)
        return TrajectoryDraft(payload, torch.stack(logq, 1), TrajectoryNodes(self.sampler, conditions, (b, k)),
                               torch.stack(means, 1))

    def commit(self, kept: torch.Tensor) -> None:
        n = kept.shape[1]
        if n > self._fed:  # every draft accepted: the last one was never fed
            self.runner.feed(kept[:, self._fed - 1: self._fed], offset=self._fed)
        self.runner.cache.commit(n)


class TrajectoryRatio(DensityRatio):
    """Exact continuous speculative sampling over denoising trajectories (see the module docstring)."""

    def __init__(self, max_tries: int = 64, proposals: int = 8, relax: float = 1.0, bonus: bool = False,
                 backend: str | None = None):
        super().__init__(max_tries)
        if not isinstance(proposals, int) or not 1 <= proposals <= max_tries:
            raise ValueError(f"proposals: expected an int in [1, max_tries={max_tries}], got {proposals!r}")
        if not (isinstance(relax, (int, float)) and relax >= 1):
            raise ValueError(f"relax: expected a number >= 1 (1 = exact), got {relax!r}")
        self.proposals, self.relax, self.backend, self.bonus = proposals, float(relax), backend, bool(bonus)
        self.lossless = self.relax == 1.0

    def log_ratios(self, draft: TrajectoryDraft, target: TrajectoryNodes) -> torch.Tensor:
        """[B, k] log p(τ_i) - log q(τ_i) of the draft trajectories (target nodes 0..k-1)."""
        b, k = draft.payload.shape[:2]
        sampler = target.sampler
        states = draft.payload.reshape(b * k, sampler.steps, sampler.dim)
        rows = torch.arange(b, device=states.device).repeat_interleave(k)
        nodes = torch.arange(k, device=states.device).repeat(b)
        mean_p, _ = sampler.means(target.node(rows, nodes), states)
        mean_q = draft.means.reshape(b * k, sampler.steps - 1, sampler.dim)
        return trajectory_log_ratio(states[:, 1:], mean_p, mean_q, sampler.std, backend=self.backend).view(b, k)

    def accept(self, draft: TrajectoryDraft, target: TrajectoryNodes,
               generator: torch.Generator | None = None) -> ContinuousVerdict:
        if not isinstance(draft, TrajectoryDraft) or not isinstance(target, TrajectoryNodes):
            return super().accept(draft, target, generator)
        x = draft.payload
        b, k, _ = x.shape
        device = x.device
        log_ratio = self.log_ratios(draft, target)
        ratio = (log_ratio / self.relax ** 2).clamp(max=0).exp()
        rejected = uniform((b, k), generator, device) >= ratio
        first = torch.where(rejected.any(1), rejected.float().argmax(1), torch.full((b,), k, device=device)).long()
        out = torch.cat([x, torch.zeros_like(x[:, :1])], 1)
        correction, fallbacks = self.residual(draft, target, first, generator)
        out[torch.arange(b, device=device), first] = correction
        verdict = ContinuousVerdict(out, first, fallbacks, bonus=self.bonus)
        if not self.lossless:
            # TV of a relaxed token from the target's: the extra acceptance probability, taken from the
            # region p < q and given back nowhere else (the residual keeps the exact rule's shape)
            judged = torch.arange(k, device=device)[None] <= first[:, None]
            verdict.tv_sum = float(((ratio - log_ratio.clamp(max=0).exp()) * judged).sum())
            verdict.judged = int(judged.sum())
        return verdict

    def residual(self, draft: TrajectoryDraft, target: TrajectoryNodes, first: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, int]:
        """Per row a trajectory from node first[b]: the residual after a rejection; after a fully accepted
        chain a target draw (the bonus) if `bonus`, else nothing (zeros: the loop does not commit it).
        Proposals run `proposals` per row at a time."""
        b, k = draft.payload.shape[:2]
        p, q = target.sampler, draft.draft_dists.sampler
        device = draft.payload.device
        rows = torch.arange(b, device=device)
        done = first == k
        if not self.bonus and bool(done.all()):
            return draft.payload.new_zeros(b, p.steps * p.dim), 0
        m = 1 if bool(done.all()) else self.proposals  # bonus draws alone need one proposal per row
        each = rows.repeat_interleave(m)
        cond_p = target.node(rows, first).take(each)
        # the draft's conditions at node first (any node for bonus rows: their proposals are not tested)
        cond_q = draft.draft_dists.node(rows, first.clamp(max=k - 1)).take(each)
        tries = 0
        while True:
            states, mean_p = p.sample(cond_p, p.noise(b * m, generator))
            flat = states.reshape(b, m, -1)
            if tries == 0:
                result = flat[:, 0].clone()  # bonus rows' draw (untested proposals: plain target draws)
            if bool(done.all()):
                break
            mean_q, _ = q.means(cond_q, states)
            log_pq = trajectory_log_ratio(states[:, 1:], mean_p, mean_q, p.std, backend=self.backend).view(b, m)
            keep = uniform((b, m), generator, device) < (1 - (-log_pq).exp()).clamp(min=0)
            keep &= ~done[:, None]
            hit = keep.any(1)
            pick = keep.float().argmax(1)
            result[hit] = flat[rows[hit], pick[hit]]
            done |= hit
            tries += m
            if bool(done.all()) or tries + m > self.max_tries:
                break
        failed = ~done
        if bool(failed.any()):
            # a row whose tries all failed takes a fresh plain target draw: not one of its rejected proposals,
            # which the rejections lean toward where q(y)/p(y) is high
            lost = rows[failed]
            fresh, _ = p.sample(target.node(lost, first[failed]), p.noise(len(lost), generator))
            result[failed] = fresh.reshape(len(lost), -1)
        return result, int(failed.sum())


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


def plain_trajectories(model: PatchAR, labels: torch.Tensor, sampler: HeadSampler, n: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The target alone: n trajectories per row [B, n, S*D] and their readouts [B, n, D]."""
    runner = _Runner(model, labels, sampler)
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


@torch.no_grad()
def generate_continuous(target: PatchAR, labels: torch.Tensor, draft: PatchAR | None = None, *, k: int = 4,
                        prefill: float = 0.1, guidance_scale: float | None = 2.0, steps: int | None = None,
                        temperature: float = 1.0, rule: TrajectoryRatio | None = None,
                        generator: torch.Generator | None = None) -> ContinuousImageOutput:
    """Class-conditional images from `target`: plainly (draft None) or speculatively with `draft`, a small
    `PatchAR` (a draft model with its own head) or a `PatchEagle` (which samples with the target's head).

    `prefill`: the fraction of tokens the target generates alone before drafting starts (at least one).
    `steps`: grid points of the heads' trajectories (default: the target's config); `temperature`: MAR's
    noise temperature (both models); `guidance_scale`: classifier-free guidance on ε (None: unguided)."""
    labels = _check_labels(target, labels)
    c = target.config
    if not 0 <= prefill <= 1:
        raise ValueError(f"prefill: expected a fraction in [0, 1], got {prefill!r}")
    trajectory = Trajectory.make(steps if steps is not None else c.steps, c.stop, temperature)
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
            adapter = PatchARTarget(target, labels, sampler)
            if eagle:  # the draft samples with the target's own head
                drafter = PatchEagleDrafter(draft, adapter, sampler)
            else:
                drafter = PatchARDrafter(draft, labels, HeadSampler(draft, trajectory, guidance_scale))
            spec = continuous_generate(adapter, drafter, trajs, c.tokens - m, k=k, rule=rule or TrajectoryRatio(),
                                       generator=generator)
            trajs = spec.values
            reads = torch.cat([reads, *adapter.readouts], 1)[:, : c.tokens]  # the last step may overshoot
            stats = spec.stats
            out = ContinuousImageOutput(reads.new_zeros(0), reads, trajs, 0.0, stats.accepted, stats.drafted,
                                        spec.residual_fallbacks, stats, m, spec.tv_per_token)
        else:
            out = ContinuousImageOutput(reads.new_zeros(0), reads, trajs, 0.0, prefilled=m)
    out.seconds = time.perf_counter() - t0
    out.trajectories = out.trajectories.reshape(len(labels), c.tokens, trajectory.steps, c.token_dim)
    out.images = (unpatchify(out.tokens.clamp(-1, 1), c.patch) + 1) / 2
    return out
