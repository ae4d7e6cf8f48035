"""multispec.ssm: speculative decoding for state-space models (STree-style tree scan for Mamba-2).

Importing this package registers its target adapters with the core, so `multispec.speculative_generate`
accepts `transformers`' `Mamba2ForCausalLM` directly.
"""

from multispec.targets import register_target_adapter

from .mamba2 import Mamba2Target, is_mamba2
from .tree_scan import tree_conv1d, tree_ssd, tree_state

register_target_adapter(is_mamba2, Mamba2Target)

__all__ = ["Mamba2Target", "is_mamba2", "tree_conv1d", "tree_ssd", "tree_state"]
