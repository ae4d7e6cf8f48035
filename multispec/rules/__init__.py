"""Acceptance rules: which drafted tokens survive verification, and what token comes next.

- `base`: the contract (`AcceptanceRule`, `Verdict`) and the public helpers any rule may use
  (`check_logits`, `chain_drafts`, `chain_verdict`, `full_tree_tokens`);
- `exact`: the lossless rules, `Greedy` and `Exact` (speculative sampling), and `resolve_rule`;
- `judge`: `Judge`, exact verification OR a judge head's approval (lossy, with a counted bound);
  `judge_head`: that head (`JudgeHead`), its inputs and its training;
- `continuous`: `DensityRatio`, speculative sampling of continuous tokens, with its payload types.

Lossy rules state their bound. A modality's own rule subclasses `AcceptanceRule` (or `DensityRatio`) in its
package and uses only the public names here.
"""

from .base import AcceptanceRule, Verdict, chain_drafts, chain_verdict, check_logits, full_tree_tokens
from .continuous import ContinuousDraft, ContinuousVerdict, DensityRatio, NodeDistributions
from .exact import Exact, Greedy, resolve_rule
from .judge import Judge, JudgeStats, JudgeVerdict
from .judge_head import CONTEXT_SCALARS, JudgeHead, judge_inputs, target_fingerprint, train_judge_head

__all__ = ["AcceptanceRule", "CONTEXT_SCALARS", "ContinuousDraft", "ContinuousVerdict", "DensityRatio", "Exact",
           "Greedy", "Judge", "JudgeHead", "JudgeStats", "JudgeVerdict", "NodeDistributions", "Verdict", "target_fingerprint",
           "chain_drafts", "chain_verdict", "check_logits", "full_tree_tokens", "judge_inputs", "resolve_rule",
           "train_judge_head"]
