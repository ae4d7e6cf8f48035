"""What the state-space adapters need of `transformers` (pyproject.toml's `ssm` extra; checked by
`multispec.versions.require` when an adapter is built, and against pyproject.toml by tests/test_versions.py)."""

from multispec.plugin import Requirement

# DynamicCache.get_conv_state / get_recurrent_state (5.21.0), the Mamba-2 / Bamba gated norm's `group_size` (5.23.0)
SSM_TRANSFORMERS = Requirement("transformers", "5.23", "Mamba-2 gated norm group_size, DynamicCache.get_conv_state")
