"""multispec: speculative generation on one verification core.

    from multispec import speculative_generate
    out = speculative_generate(target_model, draft_model, input_ids, max_new_tokens=64)
    out.sequences, out.stats
"""

from .drafters import (Drafter, EagleDrafter, HybridDrafter, ModelDrafter, NGramDrafter, SuffixDecodingDrafter,
                       TokenRecyclingDrafter)
from .generate import SpeculativeOutput, speculative_generate
from .metrics import SpeculativeStats, StepStats
from .sampling import SamplingConfig, classifier_free_guidance
from .session import Checkpoint, Session, SpanScore
from .prompt import Prompt
from .rules import AcceptanceRule, Exact, Greedy, Verdict
from .targets import FeatureRequest, Features, HFCausalLM, PrefillOutput, Target, TargetOutput, register_target_adapter
from .tree import Chain, DraftTree, DynamicTree, StaticTree

__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule", "Chain", "Drafter", "DraftTree", "DynamicTree", "Exact", "FeatureRequest", "Features",
    "Checkpoint", "Greedy", "HFCausalLM", "PrefillOutput", "Prompt", "Session", "SpanScore", "Target", "TargetOutput",
    "EagleDrafter", "HybridDrafter", "ModelDrafter", "NGramDrafter", "SamplingConfig", "SpeculativeOutput",
    "SpeculativeStats", "StaticTree", "SuffixDecodingDrafter", "TokenRecyclingDrafter",
    "StepStats", "Verdict", "classifier_free_guidance", "register_target_adapter", "speculative_generate",
]
