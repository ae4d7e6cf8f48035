"""The core names no modality: importing every core module loads no modality package, and no core source
file mentions one (DESIGN.md, section 1: a modality package imports the core, never the reverse; the core
finds modality packages through the `multispec.adapters` entry points)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "multispec"
MODALITIES = ("ssm", "vision", "image_ar", "reasoning")
NAMED = re.compile(r"multispec\.(ssm|vision|image_ar|reasoning)\b")

# Run in a fresh interpreter: this test session has imported modality packages already. The walk skips the
# modality packages (they sit in the `multispec` namespace through setuptools' package-dir) and
# `multispec.zoo.weights` (data).
_IMPORT_ALL = f"""
import importlib, json, pkgutil, sys
import multispec

modalities = {tuple(f"multispec.{m}" for m in MODALITIES)!r}
skip = modalities + ("multispec.zoo.weights",)
failed = {{}}
for info in pkgutil.walk_packages(multispec.__path__, "multispec.",
                                  onerror=lambda name: failed.setdefault(name, "failed in the walk")):
    if info.name.startswith(skip):
        continue
    try:
        importlib.import_module(info.name)
    except Exception as error:
        failed[info.name] = f"{{type(error).__name__}}: {{error}}"
print(json.dumps({{"failed": failed, "modalities": sorted(m for m in sys.modules if m.startswith(modalities)),
                   "core": sorted(m for m in sys.modules if m.startswith("multispec."))}}))
"""


def test_importing_the_core_loads_no_modality():
    run = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert not report["failed"], f"core modules that fail to import: {report['failed']}"
    assert len(report["core"]) > 20, f"the walk found too few core modules: {report['core']}"
    assert not report["modalities"], f"importing the core loaded modality packages: {report['modalities']}"


def _relative_imports_of_modalities(path: Path, tree: ast.Module) -> list[str]:
    """`from .ssm import x`, `from .. import vision`, ... anywhere in a core module."""
    package = path.relative_to(CORE.parent).parts[:-1]  # a module's package, or an __init__'s own
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = list(package[:len(package) - (node.level - 1)])
        names = [".".join([*base, node.module])] if node.module else [".".join([*base, a.name]) for a in node.names]
        if node.module:
            names += [f"{names[0]}.{a.name}" for a in node.names]
        if any(NAMED.match(name) for name in names):
            hits.append(f"{path.relative_to(CORE.parent)}:{node.lineno}: relative import of a modality")
    return hits


def test_no_core_source_names_a_modality():
    planted = ast.parse("from ..ssm import bench\nfrom .. import vision\nfrom . import tally\nfrom .text import run")
    assert len(_relative_imports_of_modalities(CORE / "bench" / "planted.py", planted)) == 2  # the check works
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        if path.is_relative_to(CORE / "zoo" / "weights"):
            continue
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            if NAMED.search(line):
                offenders.append(f"{path.relative_to(CORE.parent)}:{number}: {line.strip()}")
        offenders += _relative_imports_of_modalities(path, ast.parse(text, str(path)))
    assert not offenders, ("core sources that name a modality package (the core reaches modalities only through "
                           "registries and entry points):\n" + "\n".join(offenders))
