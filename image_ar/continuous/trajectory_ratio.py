"""`TrajectoryRatio`: the continuous rule on whole denoising trajectories.

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

from dataclasses import dataclass

import torch

from multispec.plugin import ContinuousVerdict, DensityRatio, uniform

from .trajectory import TrajectoryDraft, TrajectoryNodes
from .trajectory_kernel import trajectory_log_ratio, trajectory_log_ratio_ref


@dataclass
class FixedVerdict:
    """`TrajectoryRatio.accept_fixed`'s verdict, every field a tensor of a fixed shape (nothing read back)."""

    payload: torch.Tensor  # [B, k + 1, S*D]: the accepted drafts, then the correction (or the bonus draw)
    num_accepted: torch.Tensor  # [B] long: the first rejected node (k: none)
    fallbacks: torch.Tensor  # [] long: rows whose residual tries all failed (a fresh target draw)
    tv_sum: torch.Tensor  # [] float: a relaxed rule's TV terms over the judged drafts within reach
    judged: torch.Tensor  # [] long


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

    @property
    def fixed_tries(self) -> int:
        """The residual's proposals per row in all, as `residual` runs them (`proposals` at a time while another
        batch fits in `max_tries`): `accept_fixed` draws them at once."""
        return self.max_tries // self.proposals * self.proposals

    def log_ratios(self, draft: TrajectoryDraft, target: TrajectoryNodes, checked: bool = True) -> torch.Tensor:
        """[B, k] log p(τ_i) - log q(τ_i) of the draft trajectories (target nodes 0..k-1); `checked` False: the
        PyTorch reference without the kernel's input checks (they read the device; a fixed-shape step's
        compiler fuses the reference)."""
        b, k = draft.payload.shape[:2]
        sampler = target.sampler
        states = draft.payload.reshape(b * k, sampler.steps, sampler.dim)
        rows = torch.arange(b, device=states.device).repeat_interleave(k)
        nodes = torch.arange(k, device=states.device).repeat(b)
        mean_p, _ = sampler.means(target.node(rows, nodes), states)
        mean_q = draft.means.reshape(b * k, sampler.steps - 1, sampler.dim)
        if not checked:
            return trajectory_log_ratio_ref(states[:, 1:], mean_p, mean_q, sampler.std).view(b, k)
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

    def accept_fixed(self, draft: TrajectoryDraft, target: TrajectoryNodes, u_accept: torch.Tensor,
                     proposal_noise: torch.Tensor, u_proposals: torch.Tensor, fallback_noise: torch.Tensor,
                     reach: torch.Tensor) -> FixedVerdict:
        """`accept` at fixed shapes and without a host read (the continuous loop's static step), on the caller's
        draws: `u_accept` [B, k] (the drafts' coins), `proposal_noise` [B * fixed_tries, S, D] and `u_proposals`
        [B, fixed_tries] (the residual's proposals and coins), `fallback_noise` [B, S, D]. The residual tests
        every proposal of a row at once and keeps the first kept one: the law of `residual`'s batches, which stop
        at the first. Every row computes its residual and its fallback draw, used or not. `reach` []: the drafts
        that can still be emitted, so the TV account judges what `accept` on a chain cut to `reach` would."""
        x = draft.payload
        b, k, _ = x.shape
        device = x.device
        log_ratio = self.log_ratios(draft, target, checked=False)
        ratio = (log_ratio / self.relax ** 2).clamp(max=0).exp()
        rejected = u_accept >= ratio
        first = torch.where(rejected.any(1), rejected.float().argmax(1), torch.full((b,), k, device=device)).long()
        correction, failed = self._fixed_residual(draft, target, first, proposal_noise, u_proposals, fallback_noise)
        out = torch.cat([x, correction[:, None]], 1)
        keep_draft = torch.arange(k + 1, device=device)[None] < first[:, None]
        out = torch.where(keep_draft[..., None], out, correction[:, None].expand_as(out))
        nodes = torch.arange(k, device=device)[None]
        judged = (nodes <= first[:, None]) & (nodes < reach)
        tv = ((ratio - log_ratio.clamp(max=0).exp()) * judged).sum()
        # as `accept` on the chain cut to `reach` counts them: the rows whose residual ran and failed
        fallbacks = (failed & (first < reach)).sum()
        return FixedVerdict(out, first, fallbacks, tv, judged.sum())

    def _fixed_residual(self, draft: TrajectoryDraft, target: TrajectoryNodes, first: torch.Tensor,
                        noise: torch.Tensor, u: torch.Tensor, fallback_noise: torch.Tensor):
        """Per row the correction at node first[b] (`residual`'s law; after a fully accepted chain a plain target
        draw, the bonus) and which rows fell back (every try failed), at fixed shapes."""
        b, k = draft.payload.shape[:2]
        p, q = target.sampler, draft.draft_dists.sampler
        tries = self.fixed_tries
        rows = torch.arange(b, device=first.device)
        each = rows.repeat_interleave(tries)
        states, mean_p = p.sample(target.node(rows, first).take(each), noise)
        mean_q, _ = q.means(draft.draft_dists.node(rows, first.clamp(max=k - 1)).take(each), states)
        log_pq = trajectory_log_ratio_ref(states[:, 1:], mean_p, mean_q, p.std).view(b, tries)
        keep = u < (1 - (-log_pq).exp()).clamp(min=0)
        hit = keep.any(1)
        flat = states.reshape(b, tries, -1)
        picked = flat[rows, keep.float().argmax(1)]
        fresh, _ = p.sample(target.node(rows, first), fallback_noise)
        done = first == k  # the bonus: a plain target draw, the first proposal (untested)
        result = torch.where(hit[:, None], picked, fresh.reshape(b, -1))
        result = torch.where(done[:, None], flat[:, 0], result)
        return result, ~hit & ~done
