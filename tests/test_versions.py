"""Dependency floors: pyproject.toml and `multispec.versions` agree, and a path that needs a newer release
than the one installed says which, by name and version, when it is used (not when it is imported)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement as PipRequirement

from multispec import versions
from multispec.ssm.testing import make_bamba, make_mamba, make_mamba2  # importing needs no recent transformers
from multispec.targets import as_target, stateful_draft_engine
from multispec.ssm.versions import SSM_TRANSFORMERS
from multispec.versions import FLOORS, DependencyVersionError, require

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]


def _floors(requirements: list[str]) -> dict[str, str]:
    """package -> the version its `>=` clause names, for each requirement string that has one."""
    out = {}
    for line in requirements:
        req = PipRequirement(line)
        lows = [spec.version for spec in req.specifier if spec.operator == ">="]
        if lows:
            out[req.name.lower()] = lows[0]
    return out


def test_pyproject_floors_are_the_version_modules():
    declared = _floors(PYPROJECT["dependencies"])
    for package, requirement in FLOORS.items():
        assert requirement.package == package
        assert declared.get(package) == requirement.minimum, (package, declared.get(package), requirement.minimum)


def test_pyproject_ssm_extra_is_the_ssm_requirement():
    extra = _floors(PYPROJECT["optional-dependencies"]["ssm"])
    assert extra == {SSM_TRANSFORMERS.package: SSM_TRANSFORMERS.minimum}
    # the extra raises the floor (never below the package's own) and keeps the package's ceiling
    core = _floors(PYPROJECT["dependencies"])[SSM_TRANSFORMERS.package]
    assert versions.satisfies(SSM_TRANSFORMERS.minimum, core)
    ceilings = [{str(spec) for spec in PipRequirement(line).specifier if spec.operator == "<"}
                for line in (*PYPROJECT["optional-dependencies"]["ssm"], *PYPROJECT["dependencies"])
                if PipRequirement(line).name == SSM_TRANSFORMERS.package]
    assert len(ceilings) == 2 and ceilings[0] == ceilings[1], ceilings


@pytest.mark.parametrize("found, minimum, ok", [
    ("5.23.0", "5.23", True), ("5.24.0", "5.23", True), ("5.23.0.dev0", "5.23", True), ("6.0.0", "5.23", True),
    ("5.22.2", "5.23", False), ("5.17.0", "5.23", False), ("4.57.6", "5.0", False), ("2.14.1+cu130", "2.5", True),
])
def test_satisfies(found, minimum, ok):
    assert versions.satisfies(found, minimum) is ok


def test_require_names_package_needed_and_found_versions(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda package: "5.17.0")
    with pytest.raises(DependencyVersionError) as err:
        require(SSM_TRANSFORMERS, "multispec.ssm")
    message = str(err.value)
    assert message.startswith(f"multispec.ssm needs transformers>={SSM_TRANSFORMERS.minimum} (")
    assert "found 5.17.0" in message and "get_conv_state" in message and "group_size" in message
    assert f"pip install -U 'transformers>={SSM_TRANSFORMERS.minimum}'" in message
    assert isinstance(err.value, ImportError)


def test_require_passes_a_recent_enough_version_and_reports_a_missing_package(monkeypatch):
    for found in (SSM_TRANSFORMERS.minimum, "5.24.0", "5.99.1.dev0"):
        monkeypatch.setattr(versions, "installed_version", lambda package, found=found: found)
        require(SSM_TRANSFORMERS)
    monkeypatch.undo()
    assert versions.installed_version("torch") is not None
    assert versions.installed_version("multispec-no-such-package") is None
    with pytest.raises(DependencyVersionError, match="found none installed"):
        require(versions.Requirement("multispec-no-such-package", "1.0", "nothing"))


def test_ssm_targets_and_drafts_refuse_an_old_transformers_when_built(monkeypatch):
    models = [make_mamba2(layers=1), make_mamba(layers=1), make_bamba(layers=2, attention_layers=(1,))]
    monkeypatch.setattr(versions, "installed_version", lambda package: "5.17.0")
    want = rf"^multispec\.ssm needs transformers>={re.escape(SSM_TRANSFORMERS.minimum)} \(.*\); found 5\.17\.0\."
    for model in models:  # the core's own entry points: a target, a draft model
        for build in (as_target, stateful_draft_engine):
            with pytest.raises(DependencyVersionError, match=want):
                build(model)
