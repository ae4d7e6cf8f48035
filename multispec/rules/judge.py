"""Judge verification (Judge Decoding, Bachmann et al. 2025): accept a draft token when the exact rule
accepts it *or* a judge reading the target's hidden state at that token says it is good.

The judge (`JudgeHead`, in `judge_head`) reads the target's final hidden state at the draft token, which
the verification pass computes anyway (`FeatureRequest(hidden=True)`), so judging costs one dot product per
node.

The rule is lossy. Its bound is counted, not assumed: the exact rule verifies each node's children first
(with its own draws when sampling), and only where it rejects them all does the judge's first approved child
take the place of the correction, with exact verification going on below it ("exact OR judge": a judge never
displaces a child the exact rule accepts). With greedy decoding the output departs from the target's own only
at those judge-taken tokens, and `JudgeVerdict.overrides` counts them per row (`JudgeStats` sums them). With
no node approved (threshold 1, or a disabled judge) the rule is `Exact`, draw for draw.

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

from ..sampling import SamplingConfig
from ..targets.base import FeatureRequest, Features
from ..tree import DraftTree
from .base import AcceptanceRule, Verdict
from .exact import Exact
from .judge_head import JudgeHead, judge_inputs

_OFF = -1.0e4  # logit of every other token at an approved node's parent: exp(-1e4) is 0 in float32


@dataclass
class JudgeVerdict(Verdict):
    """A `Verdict` plus `overrides[b]`: emitted drafts of row b the judge took where the exact rule had
    rejected every sibling (greedy: drafts that are not the target's argmax), and `overridden[b, i]`: whether
    accepted draft `tokens[b, i]` is one of them (what a trace colours as the judge's)."""

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
        if not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            # a negative threshold would approve every token, one of 1 or more none: say so rather than run it
            raise ValueError(f"threshold: expected a probability in [0, 1] (head probabilities above it are "
                             f"approved; 1 approves nothing), got {threshold!r}")
        if not isinstance(min_target_prob, (int, float)) or not 0.0 <= min_target_prob <= 1.0:
            raise ValueError(f"min_target_prob: expected a probability in [0, 1] (the least target probability of "
                             f"an approved token), got {min_target_prob!r}")
        self.head, self.threshold, self.min_target_prob = head, float(threshold), float(min_target_prob)

    def __repr__(self) -> str:
        return (f"Judge(threshold={self.threshold}, min_target_prob={self.min_target_prob}, "
                f"enabled={self.head is not None})")

    def check_target(self, target) -> None:
        if self.head is not None:
            self.head.check_target(target.user_model)

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
        """Exact first, then the judge, node by node along the path: the exact rule verifies a node's children
        (sibling by sibling, with its own draws); only where it rejects them all does the judge's first
        approved child (in draft order) take the place of the correction, and exact verification goes on
        below it. A judge never displaces a child the exact rule accepts."""
        approved = self.approvals(draft, features, target_logits)
        verdict = Exact().accept(draft, target_logits, sampling, generator)
        b, n = draft.tokens.shape
        judged = torch.zeros(b, n, dtype=torch.bool, device=draft.tokens.device)
        if bool(approved.any()):
            verdict = self._judge_where_exact_stops(draft, target_logits, sampling, generator, approved, verdict,
                                                    judged)
        path = verdict.path[:, 1:]  # full-tree nodes of the accepted drafts (then the correction's -1s)
        on_path = (path > 0) & (torch.arange(path.shape[1], device=path.device)[None] < verdict.num_accepted[:, None])
        overridden = judged.gather(1, (path - 1).clamp(min=0)) & on_path
        return JudgeVerdict(verdict.tokens, verdict.num_accepted, verdict.path, overridden.sum(1), overridden)

    @staticmethod
    def _judge_where_exact_stops(draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
                                 generator: torch.Generator | None, approved: torch.Tensor, verdict: Verdict,
                                 judged: torch.Tensor) -> Verdict:
        """Repeat until no row can go on: find where each row's exact walk stopped; if that node has an
        approved child, force the walk so far plus that child (a one-hot target distribution at each forced
        node: the exact rule then accepts it with certainty) and verify again, fresh draws below the child.
        Rows that cannot go on keep their verdict. Marks the judge's nodes in `judged` [B, N]."""
        parents = draft.parents.to(approved.device)
        node_index = torch.arange(draft.num_nodes, device=approved.device)
        for _ in range(draft.num_nodes):
            rows = torch.arange(draft.batch_size, device=approved.device)
            stop = verdict.path.gather(1, verdict.num_accepted[:, None])[:, 0]  # full-tree node, 0 = root
            children = approved & (parents + 1 == stop[:, None]) & ~judged
            going = children.any(1)
            if not bool(going.any()):
                return verdict
            child = torch.where(children, node_index, draft.num_nodes).amin(1)  # the first in draft order
            logits = target_logits.clone()
            for r in going.nonzero()[:, 0].tolist():
                walk = verdict.path[r, : int(verdict.num_accepted[r]) + 1].tolist() + [int(child[r]) + 1]
                for at, nxt in zip(walk[:-1], walk[1:]):
                    logits[r, at] = _OFF
                    logits[r, at, draft.tokens[r, nxt - 1]] = 0.0
            judged[rows[going], child[going]] = True
            again = Exact().accept(draft, logits, sampling, generator)
            keep = going[:, None]
            verdict = Verdict(torch.where(keep, again.tokens, verdict.tokens),
                              torch.where(going, again.num_accepted, verdict.num_accepted),
                              torch.where(keep, again.path, verdict.path))
        return verdict


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
