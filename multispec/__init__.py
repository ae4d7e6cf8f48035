"""multispec: speculative generation on one verification core.

    from multispec import SamplingConfig, speculative_generate
    out = speculative_generate(target_model, draft_model, input_ids, max_new_tokens=64,
                               sampling=SamplingConfig(do_sample=True, temperature=0.7))
    out.sequences, out.stats
"""

from .config import EngineConfig, StoppingConfig
from .drafters import (Drafter, EagleDrafter, HybridDrafter, ModelDrafter, NGramDrafter, SuffixDecodingDrafter,
                       TokenRecyclingDrafter)
from .generate import SpeculativeOutput, speculative_generate
from .metrics import SpeculativeStats, StepStats
from .sampling import SamplingConfig, classifier_free_guidance
from .session import Checkpoint, Session, SpanScore
from .prompt import Prompt
from .rules import AcceptanceRule, Exact, Greedy, Verdict
from .targets import (FeatureRequest, Features, GuidedTarget, HFCausalLM, PrefillOutput, Target, TargetOutput,
                      register_target_adapter)
from .tree import Chain, DraftTree, DynamicTree, StaticTree

__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule", "Chain", "Checkpoint", "DraftTree", "Drafter", "DynamicTree", "EagleDrafter", "EngineConfig",
    "Exact", "FeatureRequest", "Features", "Greedy", "GuidedTarget", "HFCausalLM", "HybridDrafter", "ModelDrafter",
    "NGramDrafter", "PrefillOutput", "Prompt", "SamplingConfig", "Session", "SpanScore", "SpeculativeOutput",
    "SpeculativeStats", "StaticTree", "StepStats", "StoppingConfig", "SuffixDecodingDrafter", "Target",
    "TargetOutput", "TokenRecyclingDrafter", "Verdict", "classifier_free_guidance", "register_target_adapter",
    "speculative_generate",
]
