"""Acceptance rules: which drafted tokens survive verification, and what token comes next.

A rule sees the draft tree, the target's logits after every node of the full tree (node 0 = root)
and the sampling config, and returns a `Verdict`. `Greedy` and `Exact` are lossless: Greedy
reproduces argmax decoding, Exact reproduces sampling from the target's (transformed) distribution
(speculative sampling; trees are verified sibling by sibling with the residual norm(max(p - q, 0)),
and drafts without probabilities count as one-hot q). Lossy rules (LANTERN's relaxed acceptance,
judge verification, ...) subclass `AcceptanceRule` and state their bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import chain_verify_greedy, chain_verify_random, tree_verify_greedy, tree_verify_random
from .sampling import SamplingConfig, exponential, nan_safe_argmax, uniform
from .targets.base import NO_FEATURES, FeatureRequest
from .tree import DraftTree


@dataclass
class Verdict:
    """Per row: `tokens[b, :num_accepted[b] + 1]` are the accepted drafts followed by the correction
    (or bonus) token; `path[b, :num_accepted[b] + 1]` are their full-tree nodes starting at the root
    (node 0), i.e. the nodes whose cache entries survive. Padding is -1."""

    tokens: torch.Tensor  # [B, D + 1] int64
    num_accepted: torch.Tensor  # [B] int64
    path: torch.Tensor  # [B, D + 1] int64


class AcceptanceRule:
    """Interface: decide which drafted nodes survive. Subclasses override `accept`.

    A rule that reads the target's features at the draft nodes (a judge) sets `feature_request`; the loop
    then scores the tree with it and passes `features=` to `accept`."""

    lossless: bool = False
    feature_request: FeatureRequest = NO_FEATURES

    def accept(self, draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None = None) -> Verdict:
        raise NotImplementedError(f"{type(self).__name__} must implement accept()")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _check_logits(draft: DraftTree, target_logits: torch.Tensor) -> None:
    b, n = draft.tokens.shape
    if target_logits.dim() != 3 or target_logits.shape[:2] != (b, n + 1):
        raise ValueError(
            f"target_logits: expected shape [{b}, {n + 1}, vocab] (root + {n} draft nodes), "
            f"got {tuple(target_logits.shape)}"
        )


def _chain_inputs(draft: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft tokens and per-row draft counts of a chain (valid nodes must form a prefix)."""
    num = draft.valid.sum(dim=1)
    return draft.tokens, num


def _chain_verdict(tokens: torch.Tensor, num_accepted: torch.Tensor) -> Verdict:
    k1 = tokens.shape[1]
    idx = torch.arange(k1, device=tokens.device)[None, :]
    path = torch.where(idx <= num_accepted[:, None], idx, -1).expand_as(tokens).contiguous()
    return Verdict(tokens, num_accepted, path)


def _full_tree_tokens(draft: DraftTree) -> torch.Tensor:
    root = torch.zeros(draft.batch_size, 1, dtype=torch.long, device=draft.tokens.device)
    return torch.cat([root, draft.tokens], dim=1)


class Greedy(AcceptanceRule):
    """Accept a drafted token iff it is the target's argmax after its parent (lossless greedy)."""

    lossless = True

    def accept(self, draft, target_logits, sampling, generator=None):
        _check_logits(draft, target_logits)
        argmax = nan_safe_argmax(sampling.process(target_logits))
        if draft.is_chain:
            tokens, n = _chain_inputs(draft)
            out, acc = chain_verify_greedy(tokens, n, argmax)
            return _chain_verdict(out, acc)
        fc, ns = draft.linked()
        out, path, acc = tree_verify_greedy(_full_tree_tokens(draft), fc, ns, argmax)
        return Verdict(out, acc, path)


class Exact(AcceptanceRule):
    """Speculative sampling (Leviathan et al. / Chen et al.; multi-draft trees as in SpecInfer).

    Accept draft x with probability min(1, p(x) / q(x)); on rejection try the next sibling against the
    residual norm(max(p - q, 0)); when every child is rejected, sample the residual. The output
    distribution equals the target's. With `do_sample=False` it reduces to `Greedy`.
    """

    lossless = True

    def accept(self, draft, target_logits, sampling, generator=None):
        if not sampling.do_sample:
            return Greedy().accept(draft, target_logits, sampling, generator)
        _check_logits(draft, target_logits)
        b, t, v = target_logits.shape
        if draft.draft_probs is not None and draft.draft_probs.shape[-1] != v:
            raise ValueError(
                f"draft_probs: vocabulary {draft.draft_probs.shape[-1]} does not match the target's {v}"
            )
        p = sampling.probs(target_logits)
        device = p.device
        uniforms = uniform((b, t), generator, device)
        noise = exponential((b, v), generator, device)
        greedy_rows = torch.zeros(b, dtype=torch.bool, device=device)
        if draft.is_chain:
            tokens, n = _chain_inputs(draft)
            out, acc = chain_verify_random(tokens, n, p, draft.draft_probs, uniforms[:, 1:], noise, greedy_rows)
            return _chain_verdict(out, acc)
        fc, ns = draft.linked()
        q = None
        if draft.draft_probs is not None:
            q = torch.cat([torch.zeros(b, 1, v, device=device), draft.draft_probs.float()], dim=1)
        out, path, acc = tree_verify_random(_full_tree_tokens(draft), fc, ns, p, q, uniforms, noise, greedy_rows)
        return Verdict(out, acc, path)


def resolve_rule(rule: "AcceptanceRule | str | None", do_sample: bool) -> AcceptanceRule:
    """`None` picks Exact when sampling and Greedy otherwise; strings name the built-in rules."""
    if rule is None:
        return Exact() if do_sample else Greedy()
    if isinstance(rule, str):
        named = {"greedy": Greedy, "exact": Exact}
        if rule.lower() not in named:
            raise ValueError(f"rule: unknown rule {rule!r}; expected one of {sorted(named)} or an AcceptanceRule")
        rule = named[rule.lower()]()
    if not isinstance(rule, AcceptanceRule):
        raise TypeError(f"rule: expected an AcceptanceRule, a rule name or None, got {type(rule).__name__}")
    if isinstance(rule, Greedy) and do_sample:
        raise ValueError("rule: Greedy acceptance with do_sample=True would not sample; use Exact (or rule=None)")
    return rule
