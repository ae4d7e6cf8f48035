"""Re-exports judge verification from its home, `multispec.rules` (the `Judge` rule in `multispec.rules.judge`,
its head and training in `multispec.rules.judge_head`), so existing imports keep working."""

from .rules.judge import Judge, JudgeStats, JudgeVerdict
from .rules.judge_head import CONTEXT_SCALARS, JudgeHead, judge_inputs, train_judge_head

__all__ = ["CONTEXT_SCALARS", "Judge", "JudgeHead", "JudgeStats", "JudgeVerdict", "judge_inputs", "train_judge_head"]
