"""multispec: speculative generation on one verification core.

    from multispec import SamplingConfig, speculative_generate
    out = speculative_generate(target_model, draft_model, input_ids, max_new_tokens=64,
                               sampling=SamplingConfig(do_sample=True, temperature=0.7))
    out.sequences, out.stats
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, for readers and type checkers; loaded on first use (`__getattr__`)
    from .config import EngineConfig, StoppingConfig
    from .drafters import (Drafter, EagleDrafter, HybridDrafter, ModelDrafter, NGramDrafter,
                           SuffixDecodingDrafter, TokenRecyclingDrafter)
    from .generate import SpeculativeOutput, speculative_generate
    from .metrics import SpeculativeStats, StepStats
    from .sampling import SamplingConfig, classifier_free_guidance
    from .session import Checkpoint, Session, SpanScore
    from .prompt import Prompt
    from .rules import AcceptanceRule, Exact, Greedy, Verdict
    from .targets import (FeatureRequest, Features, GuidedTarget, HFCausalLM, PrefillOutput, Target, TargetOutput,
                          register_target_adapter)
    from .tree import Chain, DraftTree, DynamicTree, StaticTree

_MODULES = {  # module -> the public names it defines
    ".config": ("EngineConfig", "StoppingConfig"),
    ".drafters": ("Drafter", "EagleDrafter", "HybridDrafter", "ModelDrafter", "NGramDrafter", "SuffixDecodingDrafter",
                  "TokenRecyclingDrafter"),
    ".generate": ("SpeculativeOutput", "speculative_generate"),
    ".metrics": ("SpeculativeStats", "StepStats"),
    ".sampling": ("SamplingConfig", "classifier_free_guidance"),
    ".session": ("Checkpoint", "Session", "SpanScore"),
    ".prompt": ("Prompt",),
    ".rules": ("AcceptanceRule", "Exact", "Greedy", "Verdict"),
    ".targets": ("FeatureRequest", "Features", "GuidedTarget", "HFCausalLM", "PrefillOutput", "Target", "TargetOutput",
                 "register_target_adapter"),
    ".tree": ("Chain", "DraftTree", "DynamicTree", "StaticTree"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str):
    """The public names, each imported on first use: `import multispec` (and so `multispec --help`) loads no
    torch; `from multispec import speculative_generate` loads what that needs."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'multispec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule", "Chain", "Checkpoint", "DraftTree", "Drafter", "DynamicTree", "EagleDrafter", "EngineConfig",
    "Exact", "FeatureRequest", "Features", "Greedy", "GuidedTarget", "HFCausalLM", "HybridDrafter", "ModelDrafter",
    "NGramDrafter", "PrefillOutput", "Prompt", "SamplingConfig", "Session", "SpanScore", "SpeculativeOutput",
    "SpeculativeStats", "StaticTree", "StepStats", "StoppingConfig", "SuffixDecodingDrafter", "Target",
    "TargetOutput", "TokenRecyclingDrafter", "Verdict", "classifier_free_guidance", "register_target_adapter",
    "speculative_generate",
]
