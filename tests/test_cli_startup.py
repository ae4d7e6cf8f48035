"""The command line starts without loading what its command does not need: `multispec --help` and `multispec
generate --help` load no torch and no modality; the other commands load theirs. Checked in a fresh interpreter by
the modules it loaded, not by timing it (timings: benchmarks/probes/cli_startup.py, docs/cli.md)."""

import json
import subprocess
import sys

import pytest

PROBE = """
import contextlib, io, json, sys
from multispec.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main({argv!r})
    except SystemExit as done:
        code = done.code
heavy = sorted(m for m in ("torch", "transformers", "multispec.cli_commands", "multispec.vision", "multispec.ssm")
               if m in sys.modules)
print(json.dumps({{"code": code, "heavy": heavy, "help": out.getvalue()}}))
"""


def _run(argv: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"]], ids=["top", "generate"])
def test_help_loads_no_torch(argv):
    result = _run(argv)
    assert result["code"] == 0 and result["heavy"] == []
    assert "usage: multispec" in result["help"]
    if argv == ["--help"]:
        assert all(name in result["help"] for name in ("bench", "eval", "train", "generate", "zoo", "demo"))
    else:  # the core's options, and where the modalities' are
        assert "--max-new-tokens" in result["help"] and "--step {eager,static,compiled}" in result["help"]
        assert "multispec generate --pair NAME --help" in result["help"]


def test_a_modality_pairs_help_and_the_other_commands_load_what_they_need():
    """`generate --pair vqa-llava --help` lists the VLM pairs' own options (loading the modalities); `zoo --help`
    builds the whole command line (the negative control: the probe sees torch when it is loaded)."""
    result = _run(["generate", "--pair", "vqa-llava", "--help"])
    assert result["code"] == 0 and "torch" in result["heavy"] and "--image" in result["help"]
    result = _run(["zoo", "--help"])
    assert result["code"] == 0 and "multispec.cli_commands" in result["heavy"] and "tune" in result["help"]
