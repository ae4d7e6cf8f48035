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
    """

    vocab_size: int | None = None  # None: the drafter works in token space and fits any vocabulary
    # feature-level drafters (EAGLE) say what they read of the target: the loop asks the target for it and
    # passes it to `start` (at the prefilled tokens, [B, L-1, ...]) and `commit` (at every full-tree node
    # of the step, [B, T, ...]); None otherwise
    feature_request: FeatureRequest = NO_FEATURES

    def start(self, prompt: Prompt, features: Features | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement start()")

    def propose(self, roots: torch.Tensor, spec: TreeSpec, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> DraftTree:
        raise NotImplementedError(f"{type(self).__name__} must implement propose()")

    def commit(self, draft: DraftTree, verdict: Verdict, features: Features | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement commit()")

    def select(self, rows: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement select()")

    # drafters that learn from the target's verdict on every node (Token Recycling) set this: the loop then
    # calls `observe` after each verification with the full tree and the target's logits there
    observes_target: bool = False

    def observe(self, tokens: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor) -> None:
        """`tokens` [B, T] the full tree (node 0 = root), `target_logits` [B, T, V] the target after each
        node, `valid` [B, T] which nodes are real."""

    # drafters that can sit out a step another drafter drafts (see `HybridDrafter`) set this, and get
    # `skip(roots)` instead of `propose` for that step, then `commit` as usual
    supports_skipped_steps: bool = False

    def skip(self, roots: torch.Tensor) -> None:
        """This step is drafted elsewhere; `roots` are its roots. Default: nothing to remember."""
