"""The drafter interface: propose a draft tree for every active row, learn what was committed."""

from __future__ import annotations

import torch

from ..prompt import Prompt
from ..rules import Verdict
from ..sampling import SamplingConfig
from ..targets.base import NO_FEATURES, FeatureRequest, Features
from ..tree import DraftTree, TreeSpec


class Drafter:
    """A source of draft trees.

    Lifecycle: `start(prompt, features)` once; then per step `propose(roots, spec, sampling, generator)`
    -> `DraftTree`, and `commit(draft, verdict, features)` with the target's verdict; `select(rows)` when
    rows finish. `roots[b]` is row b's last committed token (not yet seen by the target).

    What the session reads of a drafter, declared here with its default:

    - `vocab_size`: the vocabulary its drafts come from, checked against the target's; None: it works in
      token space and fits any vocabulary (prompt lookup);
    - `feature_request`: what a feature-level drafter (EAGLE) reads of the target; the loop asks the target for
      it and passes it to `start` (at the prefilled tokens, [B, L-1, ...]) and `commit` (at every full-tree
      node of the step, [B, T, ...]);
    - `observes_target`: it learns from the target's verdict on every node (Token Recycling): the loop calls
      `observe` after each verification with the full tree and the target's logits there;
    - `supports_skipped_steps`: it can sit out a step another drafter drafts (`HybridDrafter`) or text
      appended from elsewhere: it gets `skip(roots)` instead of `propose` for that step, then `commit`.
    """

    vocab_size: int | None = None
    feature_request: FeatureRequest = NO_FEATURES
    observes_target: bool = False
    supports_skipped_steps: bool = False

    def start(self, prompt: Prompt, features: Features | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement start()")

    def propose(self, roots: torch.Tensor,  # [B] int64: each active row's last committed token
                spec: TreeSpec, sampling: SamplingConfig, generator: torch.Generator | None = None) -> DraftTree:
        raise NotImplementedError(f"{type(self).__name__} must implement propose()")

    def commit(self, draft: DraftTree, verdict: Verdict, features: Features | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement commit()")

    def select(self, rows: torch.Tensor) -> None:  # rows: [B'] int64 batch positions to keep, in order
        raise NotImplementedError(f"{type(self).__name__} must implement select()")

    def observe(self, tokens: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor) -> None:
        """`tokens` [B, T] the full tree (node 0 = root), `target_logits` [B, T, V] the target after each
        node, `valid` [B, T] which nodes are real."""

    def skip(self, roots: torch.Tensor) -> None:  # roots: [B] int64
        """This step is drafted elsewhere; `roots` are its roots. Default: nothing to remember."""
