"""The lossless rules: `Greedy` reproduces argmax decoding, `Exact` reproduces sampling from the target's
(transformed) distribution (speculative sampling; trees are verified sibling by sibling with the residual
norm(max(p - q, 0)), and drafts without probabilities count as one-hot q)."""

from __future__ import annotations

import torch

from ..kernels import chain_verify_greedy, chain_verify_random, tree_verify_greedy, tree_verify_random
from ..sampling import SamplingConfig, exponential, nan_safe_argmax, uniform
from ..targets.base import Features
from ..tree import DraftTree
from .base import AcceptanceRule, Verdict, chain_drafts, chain_verdict, check_logits, full_tree_tokens


class Greedy(AcceptanceRule):
    """Accept a drafted token iff it is the target's argmax after its parent (lossless greedy)."""

    lossless = True

    def accept(self, draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None = None, features: Features | None = None) -> Verdict:
        check_logits(draft, target_logits)
        argmax = nan_safe_argmax(sampling.process(target_logits))
        if draft.is_chain:
            tokens, n = chain_drafts(draft)
            out, acc = chain_verify_greedy(tokens, n, argmax)
            return chain_verdict(out, acc)
        fc, ns = draft.linked()
        out, path, acc = tree_verify_greedy(full_tree_tokens(draft), fc, ns, argmax)
        return Verdict(out, acc, path)


class Exact(AcceptanceRule):
    """Speculative sampling (Leviathan et al. / Chen et al.; multi-draft trees as in SpecInfer).

    Accept draft x with probability min(1, p(x) / q(x)); on rejection try the next sibling against the
    residual norm(max(p - q, 0)); when every child is rejected, sample the residual. The output
    distribution equals the target's. With `do_sample=False` it reduces to `Greedy`.
    """

    lossless = True

    def accept(self, draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None = None, features: Features | None = None) -> Verdict:
        if not sampling.do_sample:
            return Greedy().accept(draft, target_logits, sampling, generator)
        check_logits(draft, target_logits)
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
            tokens, n = chain_drafts(draft)
            out, acc = chain_verify_random(tokens, n, p, draft.draft_probs, uniforms[:, 1:], noise, greedy_rows)
            return chain_verdict(out, acc)
        fc, ns = draft.linked()
        q = None
        if draft.draft_probs is not None:
            q = torch.cat([torch.zeros(b, 1, v, device=device), draft.draft_probs.float()], dim=1)
        out, path, acc = tree_verify_random(full_tree_tokens(draft), fc, ns, p, q, uniforms, noise, greedy_rows)
        return Verdict(out, acc, path)


def resolve_rule(rule: AcceptanceRule | str | None, do_sample: bool) -> AcceptanceRule:
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


__all__ = ["Exact", "Greedy", "resolve_rule"]
