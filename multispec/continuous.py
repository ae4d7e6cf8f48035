"""The continuous-token loop: speculative sampling of vectors (`continuous_generate`) on the rule and payload
types of `multispec.rules.continuous`.

The loop is the core's, at a different payload: a drafter proposes a chain of k vectors per row; the target
scores the chain in one pass and returns, per node, its conditional distribution; the rule (`DensityRatio`
by default) accepts a prefix and draws the correction. Rows run in lockstep; residual fallbacks and a lossy
rule's total-variation account are summed into the output, never hidden.

End of sequence, vocabulary checks and the output layout belong to the modality: here rows run a fixed
number of new vectors and the output is a [B, L + n, D] tensor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from .metrics import SpeculativeStats, StepStats
from .rules.continuous import ContinuousDraft, ContinuousVerdict, DensityRatio, NodeDistributions
from .targets.base import Target


class ContinuousTarget(Protocol):
    """What `continuous_generate` needs of a target: `prefill(values [B, L, D])` once; per step
    `score(chain [B, T, D]) -> NodeDistributions`, node t being the distribution of the vector after
    chain[t] (node 0: after the root, the last committed vector); `commit(kept [B, n, D])` appends."""

    def prefill(self, values: torch.Tensor) -> None: ...

    def score(self, chain: torch.Tensor) -> NodeDistributions: ...

    def commit(self, kept: torch.Tensor) -> None: ...


@dataclass
class ContinuousOutput:
    values: torch.Tensor  # [B, L + n, D]
    stats: SpeculativeStats
    residual_fallbacks: int = 0
    tv_sum: float = 0.0  # summed over the steps' verdicts (`ContinuousVerdict.tv_sum`)
    judged: int = 0

    @property
    def tv_per_token(self) -> float:
        """A lossy rule's estimated total-variation bound per emitted token (0 for an exact rule)."""
        return self.tv_sum / self.judged if self.judged else 0.0


@torch.no_grad()
def continuous_generate(target, drafter, values: torch.Tensor, max_new_tokens: int, k: int = 4,
                        rule: DensityRatio | None = None,
                        generator: torch.Generator | None = None) -> ContinuousOutput:
    """Speculative sampling of `max_new_tokens` vectors after `values` [B, L, D] (every row the same
    length). `drafter.propose(roots [B, D], k, generator) -> ContinuousDraft`, `drafter.commit(values)`."""
    if not isinstance(values, torch.Tensor) or values.dim() != 3 or not values.is_floating_point():
        raise ValueError(f"values: expected a float [batch, length, dim] tensor, got "
                         f"{getattr(values, 'shape', type(values).__name__)}")
    if isinstance(target, Target) or not hasattr(target, "score"):
        raise TypeError(f"target: {type(getattr(target, 'model', target)).__name__} scores token trees, not continuous "
                        "vectors (a continuous target returns NodeDistributions from score)")
    if getattr(drafter, "payload", None) != "continuous":
        raise TypeError(f"drafter: {type(drafter).__name__} drafts tokens, not continuous vectors")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    rule = rule or DensityRatio()
    stats = SpeculativeStats()
    t0 = time.perf_counter()
    target.prefill(values)
    drafter.start(values)
    stats.prefill_s = time.perf_counter() - t0
    out = [values[:, i] for i in range(values.shape[1])]
    roots = values[:, -1]
    b = values.shape[0]
    made = 0
    fallbacks, tv_sum, judged = 0, 0.0, 0
    while made < max_new_tokens:
        t0 = time.perf_counter()
        draft = drafter.propose(roots, min(k, max_new_tokens - made), generator)
        t1 = time.perf_counter()
        chain = torch.cat([roots[:, None], draft.payload], 1)
        dists = target.score(chain)
        verdict = rule.accept(draft, dists, generator)
        t2 = time.perf_counter()
        # rows run in lockstep: every row keeps the shortest accepted run plus one. Exact: where a row is cut
        # before its own rejection, the cut was decided by other rows' independent draws, and its kept
        # vectors are accepted drafts, each an exact draw from the target given the ones before
        n = int(verdict.num_accepted.min())
        drafted = draft.payload.shape[1]
        kept = verdict.payload[:, : n + (1 if n < drafted or verdict.bonus else 0)]
        fallbacks += verdict.residual_fallbacks
        tv_sum, judged = tv_sum + verdict.tv_sum, judged + verdict.judged
        target.commit(kept)
        drafter.commit(kept)
        out.extend(kept[:, i] for i in range(kept.shape[1]))
        roots = kept[:, -1]
        made += kept.shape[1]
        t3 = time.perf_counter()
        stats.steps.append(StepStats(rows=b, drafted=b * draft.payload.shape[1], accepted=int(verdict.num_accepted.sum()),
                                     committed=b * kept.shape[1], draft_s=t1 - t0, verify_s=t2 - t1, commit_s=t3 - t2))
    values = torch.stack(out[: values.shape[1] + max_new_tokens], 1)
    return ContinuousOutput(values, stats, fallbacks, tv_sum=tv_sum, judged=judged)


__all__ = ["ContinuousOutput", "ContinuousTarget", "continuous_generate"]
