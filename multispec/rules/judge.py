"""Judge verification (Judge Decoding, Bachmann et al. 2025): accept a draft token when the exact rule
accepts it *or* a judge reading the target's hidden state at that token says it is good.

The judge (`JudgeHead`, in `judge_head`) reads the target's final hidden state at the draft token, which
the verification pass computes anyway (`FeatureRequest(hidden=True)`), so judging costs one dot product per
node.

The rule is lossy. Its bound is counted, not assumed: a node the judge approves is taken at its parent
(among approved siblings, the first in draft order) and the parent's exact verdict applies otherwise,
so with greedy decoding the output departs from the target's own only at an emitted token the target
would not have chosen, and `JudgeVerdict.overrides` counts those per row (`JudgeStats` sums them). With
no node approved (threshold above 1, or a disabled judge) the rule is `Exact`, draw for draw.

`min_target_prob` ρ adds a floor: the judge may approve only a token the target itself gives probability at
least ρ at that position (its softmax, before any sampling transform). Every emitted token is then the exact
rule's or one the target rates at least ρ, a bound that holds whatever the head learned. It is for targets
whose other plausible continuations (another phrasing) are safe while their improbable ones (a wrong digit)
are not: a head trained on a few thousand labels is overconfident on new problems, and the floor removes the
approvals the target itself rules out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import SamplingConfig, nan_safe_argmax
from ..targets.base import FeatureRequest, Features
from ..tree import DraftTree
from .base import AcceptanceRule, Verdict
from .exact import Exact
from .judge_head import JudgeHead, judge_inputs

_OFF = -1.0e4  # logit of every other token at an approved node's parent: exp(-1e4) is 0 in float32


@dataclass
class JudgeVerdict(Verdict):
    """A `Verdict` plus `overrides[b]`: emitted drafts of row b the exact rule did not accept by itself
    (greedy: drafts that are not the target's argmax; sampling: every accepted judge-approved draft, an
    upper bound, since the exact draw is not made for them), and `overridden[b, i]`: whether accepted draft
    `tokens[b, i]` is one of them (what a trace colours as the judge's)."""

    overrides: torch.Tensor | None = None  # [B] int64
    overridden: torch.Tensor | None = None  # [B, D] bool, False past num_accepted[b]


class Judge(AcceptanceRule):
    """Exact verification OR a judge's approval (`head`'s probability above `threshold`).

    `head=None` disables the judge (the rule is then `Exact`). Works on chains and trees, greedy and
    sampling; see the module docstring for the semantics and the counted bound."""

    lossless = False
    feature_request = FeatureRequest(hidden=True)

    def __init__(self, head: JudgeHead | None, threshold: float = 0.5, min_target_prob: float = 0.0):
        if head is not None and not isinstance(head, JudgeHead):
            raise TypeError(f"head: expected a JudgeHead or None, got {type(head).__name__}")
        if not isinstance(threshold, (int, float)) or threshold != threshold:
            raise ValueError(f"threshold: expected a number (probabilities above it are approved), got {threshold!r}")
        if not isinstance(min_target_prob, (int, float)) or not 0.0 <= min_target_prob <= 1.0:
            raise ValueError(f"min_target_prob: expected a probability in [0, 1] (the least target probability of "
                             f"an approved token), got {min_target_prob!r}")
        self.head, self.threshold, self.min_target_prob = head, float(threshold), float(min_target_prob)

    def __repr__(self) -> str:
        return (f"Judge(threshold={self.threshold}, min_target_prob={self.min_target_prob}, "
                f"enabled={self.head is not None})")

    def approvals(self, draft: DraftTree, features: Features | None,
                  target_logits: torch.Tensor | None = None) -> torch.Tensor:
        """[B, N] bool: the draft nodes the judge approves (a context judge, and the `min_target_prob` floor,
        also read `target_logits` [B, N + 1, V], the target's logits after the root and every node)."""
        if self.head is None or draft.num_nodes == 0:
            return torch.zeros_like(draft.valid)
        if features is None or features.hidden is None:
            raise ValueError("features: the judge reads the target's hidden states at the draft nodes "
                             "(score the tree with Judge.feature_request)")
        if target_logits is None and (self.head.context or self.min_target_prob > 0):
            raise ValueError("target_logits: a context judge and the min_target_prob floor read the target's "
                             "distribution at each parent")
        n = draft.num_nodes
        x = features.hidden[:, 1: n + 1]  # node 0 is the root
        parent = (draft.parents + 1).clamp(min=0).to(features.hidden.device)  # full-tree index; root = 0
        pick = lambda t: t.gather(1, parent[..., None].expand(-1, -1, t.shape[-1]))  # noqa: E731
        tokens = draft.tokens.clamp(min=0).to(features.hidden.device)
        if self.head.context:
            x = judge_inputs(x, pick(features.hidden), pick(target_logits.to(features.hidden.device)), tokens)
        with torch.no_grad():
            approved = torch.sigmoid(self.head(x.float())) > self.threshold
            if self.min_target_prob > 0:
                parent_logits = pick(target_logits.to(features.hidden.device)).float()
                p_token = torch.softmax(parent_logits, -1).gather(-1, tokens[..., None])[..., 0]
                approved &= p_token >= self.min_target_prob
        return approved.to(draft.valid.device) & draft.valid

    def accept(self, draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None = None, features: Features | None = None) -> JudgeVerdict:
        approved = self.approvals(draft, features, target_logits)
        logits = target_logits
        if bool(approved.any()):
            logits = target_logits.clone()
            rows, nodes = approved.nonzero(as_tuple=True)
            parent = draft.parents[rows, nodes] + 1  # full-tree index of each approved node's parent
            for r, n, par in reversed(list(zip(rows.tolist(), nodes.tolist(), parent.tolist()))):
                # reversed: the first approved sibling is written last and wins
                logits[r, par] = _OFF
                logits[r, par, draft.tokens[r, n]] = 0.0
        verdict = Exact().accept(draft, logits, sampling, generator)
        overridden = self._overridden(draft, target_logits, sampling, verdict, approved)
        return JudgeVerdict(verdict.tokens, verdict.num_accepted, verdict.path, overridden.sum(1), overridden)

    @staticmethod
    def _overridden(draft: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, verdict: Verdict,
                    approved: torch.Tensor) -> torch.Tensor:
        path = verdict.path[:, 1:]  # full-tree nodes of the accepted drafts (then the correction's -1s)
        if not bool(approved.any()):
            return torch.zeros(path.shape, dtype=torch.bool, device=path.device)
        b = draft.batch_size
        rows = torch.arange(b, device=path.device)[:, None].expand_as(path)
        on_path = (path > 0) & (torch.arange(path.shape[1], device=path.device)[None] < verdict.num_accepted[:, None])
        node = (path - 1).clamp(min=0)
        was_approved = approved[rows, node] & on_path
        if sampling.do_sample:
            return was_approved
        parent = draft.parents[rows, node] + 1
        own = nan_safe_argmax(sampling.process(logits))  # [B, N + 1] the target's choice after each node
        differs = own[rows, parent] != draft.tokens[rows, node]
        return was_approved & differs


@dataclass
class JudgeStats:
    """Sums over verdicts: drafted tokens the judge turned from rejected into accepted."""

    overrides: int = 0
    steps: int = 0

    def __call__(self, draft: DraftTree, verdict: Verdict, rows: list[int]) -> None:
        """An `on_step` callback for `speculative_generate` / `Session.generate`."""
        self.steps += 1
        if isinstance(verdict, JudgeVerdict) and verdict.overrides is not None:
            self.overrides += int(verdict.overrides.sum())



__all__ = ["Judge", "JudgeStats", "JudgeVerdict"]
