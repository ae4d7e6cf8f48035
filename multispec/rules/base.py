"""The acceptance-rule contract: what a rule receives, what it returns (`Verdict`), and the helpers any rule
(the core's or a modality's) may use to check its inputs and lay out its answer.

A rule sees the draft tree, the target's logits after every node of the full tree (node 0 = the root, the
last committed token) and the sampling config, and returns a `Verdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..sampling import SamplingConfig
from ..targets.base import NO_FEATURES, FeatureRequest, Features
from ..tree import DraftTree


@dataclass
class Verdict:
    """A rule's decision. Per row: `tokens[b, :num_accepted[b] + 1]` are the accepted drafts followed by the
    correction (or bonus) token; `path[b, :num_accepted[b] + 1]` are their full-tree nodes starting at the root
    (node 0), i.e. the nodes whose cache entries survive. Padding is -1."""

    tokens: torch.Tensor  # [B, D + 1] int64
    num_accepted: torch.Tensor  # [B] int64
    path: torch.Tensor  # [B, D + 1] int64
    # num_accepted + 1 per row as read on the host, once the loop has read the step (None before)
    host_counts: tuple[int, ...] | None = field(default=None, kw_only=True)


class AcceptanceRule:
    """Interface: decide which drafted nodes survive. Subclasses override `accept`.

    `lossless` says whether the output follows the target's law exactly; a lossy rule states its bound.
    A rule that reads the target's features at the draft nodes (a judge) sets `feature_request`; the loop
    scores the tree with it. Every rule's `accept` takes `features=` (the features the scoring pass returned,
    None if nothing was asked), whether it reads them or not."""

    lossless: bool = False
    feature_request: FeatureRequest = NO_FEATURES

    def accept(self, draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None = None, features: Features | None = None) -> Verdict:
        """The verdict on `draft` given `target_logits` [B, N + 1, V] (after the root and every node) and the
        target's `features` at every full-tree node [B, N + 1, ...] (those `feature_request` asked for)."""
        raise NotImplementedError(f"{type(self).__name__} must implement accept()")

    def check_target(self, target) -> None:
        """Raise if this rule cannot verify for `target` (an adapter; a session calls this once, before any
        forward). Any target by default; a judge trained for one target refuses another."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_logits(draft: DraftTree, target_logits: torch.Tensor) -> None:
    """Fail unless `target_logits` is [B, N + 1, vocab] for a draft of B rows and N nodes (root first)."""
    b, n = draft.tokens.shape
    if target_logits.dim() != 3 or target_logits.shape[:2] != (b, n + 1):
        raise ValueError(
            f"target_logits: expected shape [{b}, {n + 1}, vocab] (root + {n} draft nodes), "
            f"got {tuple(target_logits.shape)}"
        )


def chain_drafts(draft: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain's draft tokens [B, N] and per-row draft counts [B] (valid nodes must form a prefix), the
    inputs of the chain verification kernels."""
    return draft.tokens, draft.valid.sum(dim=1)


def chain_verdict(tokens: torch.Tensor, num_accepted: torch.Tensor) -> Verdict:
    """The `Verdict` of a chain whose emitted tokens are `tokens` [B, N + 1] (padded with -1): its path is
    nodes 0..num_accepted[b] of each row."""
    k1 = tokens.shape[1]
    idx = torch.arange(k1, device=tokens.device)[None, :]
    path = torch.where(idx <= num_accepted[:, None], idx, -1).expand_as(tokens).contiguous()
    return Verdict(tokens, num_accepted, path)


def full_tree_tokens(draft: DraftTree) -> torch.Tensor:
    """[B, N + 1]: the draft's tokens behind a placeholder root (node 0, token 0), in full-tree numbering."""
    root = torch.zeros(draft.batch_size, 1, dtype=torch.long, device=draft.tokens.device)
    return torch.cat([root, draft.tokens], dim=1)


__all__ = ["AcceptanceRule", "Verdict", "chain_drafts", "chain_verdict", "check_logits", "full_tree_tokens"]
