"""multispec.ssm: speculative decoding for state-space models (STree-style tree verification).

Importing this package registers its target adapters and draft engines with the core, so
`multispec.speculative_generate` accepts `transformers`' `Mamba2ForCausalLM`, `MambaForCausalLM`,
`FalconMambaForCausalLM` and the hybrids `BambaForCausalLM`, `GraniteMoeHybridForCausalLM`,
`NemotronHForCausalLM`, `JambaForCausalLM`, `FalconH1ForCausalLM`, `Lfm2ForCausalLM`, `Zamba2ForCausalLM` and
`Qwen3NextForCausalLM` directly, as
targets and as draft models (the core imports this package by itself when it meets a stateful model).
"""

from multispec.plugin import register_draft_engine, register_entry, register_fixed_shape, register_target_adapter

from .drafters import StatefulDraftEngine
from .hybrid import (BambaTarget, FalconH1Target, GraniteMoeHybridTarget, JambaTarget, Lfm2Target, NemotronHTarget,
                     Zamba2Target)
from .mamba1 import FalconMambaTarget, MambaTarget, tree_selective_scan
from .mamba2 import Mamba2Target
from .qwen3_next import Qwen3NextTarget
from .static import FIXED_SHAPE_CLASSES as SSM_FIXED_SHAPE
from .static import StaticSSM
from .static_hybrid import FIXED_SHAPE_CLASSES as HYBRID_FIXED_SHAPE
from .static_hybrid import StaticHybrid
from .delta_rule import tree_gated_delta_rule
from .targets import SSMTarget
from .tree_scan import tree_conv1d, tree_ssd, tree_state
from .zoo_pair import zoo_entries


def _is(model_type: str):
    return lambda model: getattr(getattr(model, "config", None), "model_type", None) == model_type and \
        hasattr(model, "backbone")


def _is_type(model_type: str):
    return lambda model: getattr(getattr(model, "config", None), "model_type", None) == model_type


for _matches, _adapter, _cls in ((_is("mamba2"), Mamba2Target, "Mamba2ForCausalLM"),
                                 (_is("mamba"), MambaTarget, "MambaForCausalLM"),
                                 (_is("falcon_mamba"), FalconMambaTarget, "FalconMambaForCausalLM"),
                                 (_is_type("bamba"), BambaTarget, "BambaForCausalLM"),
                                 (_is_type("granitemoehybrid"), GraniteMoeHybridTarget,
                                  "GraniteMoeHybridForCausalLM"),
                                 (_is_type("nemotron_h"), NemotronHTarget, "NemotronHForCausalLM"),
                                 (_is_type("jamba"), JambaTarget, "JambaForCausalLM"),
                                 (_is_type("falcon_h1"), FalconH1Target, "FalconH1ForCausalLM"),
                                 (_is_type("lfm2"), Lfm2Target, "Lfm2ForCausalLM"),
                                 (_is_type("zamba2"), Zamba2Target, "Zamba2ForCausalLM"),
                                 (_is_type("qwen3_next"), Qwen3NextTarget, "Qwen3NextForCausalLM")):
    register_target_adapter(_matches, _adapter, serves=f"{_cls} (multispec.ssm)")
    register_draft_engine(_matches, lambda model, _adapter=_adapter: StatefulDraftEngine(_adapter(model)))
for _eager, _static in (SSM_FIXED_SHAPE | HYBRID_FIXED_SHAPE).items():  # `step="static"`: each adapter's own class
    register_fixed_shape(_eager, _static)
for _entry in zoo_entries():
    register_entry(_entry)

__all__ = ["BambaTarget", "FalconH1Target", "FalconMambaTarget", "GraniteMoeHybridTarget", "JambaTarget", "Lfm2Target",
           "NemotronHTarget", "Mamba2Target", "MambaTarget", "SSMTarget", "StatefulDraftEngine", "StaticHybrid", "StaticSSM", "tree_conv1d",
           "tree_selective_scan", "tree_ssd",
           "tree_state", "Zamba2Target", "Qwen3NextTarget", "tree_gated_delta_rule"]
