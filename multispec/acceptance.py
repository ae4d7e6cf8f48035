"""Re-exports the acceptance rules from their home, `multispec.rules`, so existing imports keep working."""

from .rules.base import AcceptanceRule, Verdict, chain_drafts, chain_verdict, check_logits, full_tree_tokens
from .rules.exact import Exact, Greedy, resolve_rule

__all__ = ["AcceptanceRule", "Exact", "Greedy", "Verdict", "chain_drafts", "chain_verdict", "check_logits",
           "full_tree_tokens", "resolve_rule"]
