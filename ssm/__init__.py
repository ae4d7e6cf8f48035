"""multispec.ssm: speculative decoding for state-space models (STree-style tree verification).

Importing this package registers its target adapters with the core, so `multispec.speculative_generate`
accepts `transformers`' `Mamba2ForCausalLM`, `MambaForCausalLM` and the hybrid `BambaForCausalLM` directly (the core imports this
package by itself when it meets a stateful model).
"""

from multispec.targets import register_target_adapter

from .hybrid import BambaTarget
from .mamba1 import MambaTarget, tree_selective_scan
from .mamba2 import Mamba2Target
from .target import SSMTarget
from .tree_scan import tree_conv1d, tree_ssd, tree_state


def _is(model_type: str):
    return lambda model: getattr(getattr(model, "config", None), "model_type", None) == model_type and \
        hasattr(model, "backbone")


register_target_adapter(_is("mamba2"), Mamba2Target)
register_target_adapter(_is("mamba"), MambaTarget)
register_target_adapter(lambda model: getattr(getattr(model, "config", None), "model_type", None) == "bamba",
                        BambaTarget)

__all__ = ["BambaTarget", "Mamba2Target", "MambaTarget", "SSMTarget", "tree_conv1d", "tree_selective_scan", "tree_ssd",
           "tree_state"]
