"""The continuous acceptance rule: speculative sampling when every token is a vector and acceptance is a
density ratio, and the payload types such a rule reads and returns.

A drafter proposes a chain of k vectors per row with their draft log-densities (`ContinuousDraft`); the
target returns, per node, its conditional distribution (`NodeDistributions`: `log_prob` and `sample`);
`DensityRatio` accepts draft i with probability min(1, p_i(x_i) / q_i(x_i)), in order, and at the first
rejection draws the correction from the residual norm(max(0, p_i - q_i)) by rejection sampling (propose
y ~ p_i, keep it with probability max(0, 1 - q_i(y) / p_i(y)): the kept y has exactly the residual's
density). Sequential semantics: a rejection discards every later draft, so the output follows the target's
law. The residual sampler gives up after `max_tries` proposals (it succeeds per try with probability
TV(p_i, q_i)) and then takes a plain target sample; such fallbacks are counted in the verdict
(`ContinuousVerdict.residual_fallbacks`), never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..sampling import uniform


class NodeDistributions(Protocol):
    """The target's (or draft's) conditional distribution at every node of a chain, [B, T]."""

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log-density of `x` [B, T, D] under each node's distribution: [B, T]."""

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """One draw per node: [B, T, D]."""


@dataclass
class ContinuousDraft:
    """A chain of `k` draft vectors per row: `payload` [B, k, D] and their draft log-densities
    `draft_logdensity` [B, k] (each under the draft's conditional given the draft's own earlier vectors)."""

    payload: torch.Tensor
    draft_logdensity: torch.Tensor
    draft_dists: NodeDistributions | None = None  # the draft's conditionals, for the residual


@dataclass
class ContinuousVerdict:
    """Per row: `payload[b, :num_accepted[b] + 1]` the accepted drafts and the correction (or bonus)."""

    payload: torch.Tensor  # [B, k + 1, D]
    num_accepted: torch.Tensor  # [B]
    residual_fallbacks: int = 0  # rows whose residual sampler gave up and took a target sample
    # False: payload[:, k] holds no bonus draw; when every row accepts all k drafts the loop commits the k
    # drafts alone and the next step drafts after the last one (for payloads whose target draw is not free,
    # such as a diffusion head's trajectory, the bonus costs as much as a plain step)
    bonus: bool = True
    # a lossy rule's account of its departure from the target: per judged draft (every draft up to and
    # including a row's first rejection), relaxed minus exact acceptance probability at the drawn value.
    # Its mean estimates, without bias, an upper bound on each emitted token's total variation from the
    # target's law (see `ContinuousOutput.tv_per_token`); 0 for an exact rule
    tv_sum: float = 0.0
    judged: int = 0


class DensityRatio:
    """Exact speculative sampling for continuous tokens (see the module docstring)."""

    lossless = True

    def __init__(self, max_tries: int = 64):
        if not isinstance(max_tries, int) or max_tries < 1:
            raise ValueError(f"max_tries: expected a positive int, got {max_tries!r}")
        self.max_tries = max_tries

    def accept(self, draft: ContinuousDraft, target: NodeDistributions,
               generator: torch.Generator | None = None) -> ContinuousVerdict:
        x = draft.payload
        b, k, d = x.shape
        device = x.device
        logp = target.log_prob(torch.cat([x, x[:, -1:]], 1))[:, :k]  # nodes 0..k-1 predict drafts 1..k
        ratio = (logp - draft.draft_logdensity).clamp(max=0).exp()
        u = uniform((b, k), generator, device)
        rejected = u >= ratio
        # accepted prefix length: index of the first rejection (k when none)
        first = torch.where(rejected.any(1), rejected.float().argmax(1), torch.full((b,), k, device=device)).long()
        out = torch.zeros(b, k + 1, d, dtype=x.dtype, device=device)
        out[:, :k] = x
        rows = torch.arange(b, device=device)
        correction, fallbacks = self._residual(target, draft, first, generator)
        out[rows, first] = correction
        return ContinuousVerdict(out, first, fallbacks)

    def _residual(self, target: NodeDistributions, draft: ContinuousDraft, first: torch.Tensor,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, int]:
        """Per row, a draw from node `first[b]`: the residual max(0, p - q) after a rejection, the target
        itself after a fully accepted chain (the bonus)."""
        b, k, d = draft.payload.shape
        rows = torch.arange(b, device=first.device)
        chain = torch.cat([draft.payload, draft.payload[:, -1:]], 1)
        done = first == k  # bonus rows: a plain target draw is exact
        result = target.sample(generator)[rows, first]
        if draft.draft_dists is None and not bool(done.all()):
            raise ValueError("draft: a rejection needs the draft's conditionals (draft_dists) for the residual")
        tries = 0
        while not bool(done.all()) and tries < self.max_tries:
            tries += 1
            y = target.sample(generator)  # [B, T, D] one proposal per node
            pick = y[rows, first]
            probe = chain.clone()
            probe[rows, first] = pick
            logp = target.log_prob(probe)[rows, first]
            logq = draft.draft_dists.log_prob(probe[:, :k])[rows, first.clamp(max=k - 1)]
            keep_prob = (1 - (logq - logp).exp()).clamp(min=0)
            take = ~done & (uniform((b,), generator, keep_prob.device) < keep_prob)
            result[take] = pick[take]
            done = done | take
        fallbacks = int((~done).sum())  # these rows keep their plain target draw
        return result, fallbacks


__all__ = ["ContinuousDraft", "ContinuousVerdict", "DensityRatio", "NodeDistributions"]
