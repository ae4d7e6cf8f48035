"""Target adapters: prefill, score a draft tree in one forward, commit the accepted path.

The contract is `multispec.targets.base.Target`. Modality packages register adapters for model families
the core does not know (state-space and hybrid models, vision-language models, image generators) with
`register_target_adapter` when imported (`multispec.targets.registry`: the core finds them through an
entry-point group, so it never names a modality package).
"""

from __future__ import annotations

from .base import (NO_FEATURES, FeatureRequest, Features, FeedingEngine, PrefillOutput, Target, TargetOutput)
from .guidance import GuidedTarget
from .hf import HFCausalLM, check_causal_lm
from .registry import load_adapter_plugins, register_draft_engine, register_target_adapter, served_models
from .resolve import as_target, registered_feeding_engine, stateful_draft_engine

__all__ = ["NO_FEATURES", "FeatureRequest", "Features", "FeedingEngine", "GuidedTarget", "HFCausalLM", "PrefillOutput",
           "Target", "TargetOutput", "as_target", "check_causal_lm", "load_adapter_plugins", "register_draft_engine",
           "register_target_adapter", "registered_feeding_engine", "served_models", "stateful_draft_engine"]
