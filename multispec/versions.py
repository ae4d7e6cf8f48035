"""The lowest dependency versions multispec works with, and the check that names them.

`pyproject.toml` declares the floors of the whole package (`FLOORS`) and, as extras, those of paths that
need a newer release (a modality declares its own `Requirement`, e.g. the state-space adapters read
`transformers` APIs that arrived after the rest of the code's). Such a path calls `require` where it is
used (when an adapter is built), not at import time: the package and the CLI still import with an older
release, and the user gets one error naming the version instead of an AttributeError deep inside a forward.
tests/test_versions.py checks that these constants and pyproject.toml agree.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class Requirement:
    """`package>=minimum`, needed for `feature` (what the newer release brings, for the error)."""

    package: str
    minimum: str
    feature: str


# The package's own floors (pyproject.toml's `dependencies`), each the release that brought what the code uses:
FLOORS = {
    # Qwen2-VL / Qwen2.5-VL `get_rope_index(mm_token_type_ids=...)` (5.3.0); Qwen2.5-VL's rope index gives
    # still images the right temporal positions from 5.5.4 (huggingface/transformers#45325)
    "transformers": Requirement("transformers", "5.5.4", "Qwen2-VL get_rope_index(mm_token_type_ids=...), "
                                                         "Qwen2.5-VL still-image positions"),
    "torch": Requirement("torch", "2.5", "F.scaled_dot_product_attention(enable_gqa=...)"),  # F.rms_norm: 2.4
    # the first release that imports without huggingface_hub's `cached_download` (gone from the hub releases
    # transformers 5 needs); DDPMScheduler.set_timesteps(timesteps=[...]) is older
    "diffusers": Requirement("diffusers", "0.29", "imports with huggingface_hub>=1"),
    # tl.dot(input_precision="tf32x3") and tl.static_range are in 3.0, but the kernels run in the interpreter
    # (CPU) from 3.4 (3.3's lacks ops they use; with numpy>=2.4 the interpreter needs 3.7)
    "triton": Requirement("triton", "3.4", "the Triton interpreter running the kernels"),
}

class DependencyVersionError(ImportError):
    """An installed dependency is older than a multispec feature needs."""


def installed_version(package: str) -> str | None:
    """The installed version of `package` (its distribution's metadata, else the module's `__version__`);
    None if it is not installed."""
    try:
        return version(package)
    except PackageNotFoundError:
        pass
    try:
        return str(importlib.import_module(package).__version__)
    except (ImportError, AttributeError):
        return None


def satisfies(found: str, minimum: str) -> bool:
    """Whether release `found` is at least `minimum`. Pre-releases, dev and local builds count as their
    release (a 5.23.0.dev0 checkout has 5.23's APIs); an unparsable version is given the benefit of the doubt."""
    try:
        return Version(found).release >= Version(minimum).release
    except InvalidVersion:
        return True


def require(requirement: Requirement, who: str = "multispec") -> None:
    """Raise `DependencyVersionError` naming the package, the version needed and the one found, unless the
    installed `requirement.package` is at least `requirement.minimum`."""
    found = installed_version(requirement.package)
    if found is not None and satisfies(found, requirement.minimum):
        return
    spec = f"{requirement.package}>={requirement.minimum}"
    raise DependencyVersionError(
        f"{who} needs {spec} ({requirement.feature}); found {found or 'none installed'}. "
        f"pip install -U '{spec}'")
