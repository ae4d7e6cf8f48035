"""The real-size GPU bench (`benchmarks/probes/real_sizes.py`), dry-run on the CPU at tiny shapes of the same
classes: it runs end to end, every speculative output equals `generate`, and each chain and tree row carries its
accepted length, limit and efficiency (the figures themselves are the GPU's; these are not timed); and its
rehearsal at the real widths in bf16."""

import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "real_sizes.py"


def test_dry_run_covers_every_shape(tmp_path):
    main = runpy.run_path(str(SCRIPT))["main"]
    out = tmp_path / "dry.json"
    assert main(["--dry-run", "--batches", "2", "--chains", "3", "--acceptances", "0.8", "--rounds", "1",
                 "--tree", "2,1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["dry_run"] and {r["shape"] for r in doc["results"]} == {
        "llama3-8b", "qwen2.5-vl-7b-lm", "janus-pro-7b-gpt", "mamba2-2.7b", "bamba-9b"}
    steps = {r["shape"]: r["step"] for r in doc["results"]}
    assert set(steps.values()) == {"static"}  # every class has its fixed-shape step
    for result in doc["results"]:
        rows = {r["method"]: r for r in result["rows"]}
        assert set(rows) == {"generate", "no_draft", "chain_k3_p0.8", "tree_2x1_p0.8"}
        assert all(r["identical"] for r in rows.values()), result
        assert set(result["verify_seconds"]) == {"1", "4", "5"}  # the tree's 4 nodes and its root: 5
        for row in (rows["chain_k3_p0.8"], rows["tree_2x1_p0.8"]):
            assert row["accepted_length"] > 1.5  # drafts accepted
            ratio = row["vs_no_draft"] / row["limit"]  # from rounded figures: within their rounding
            assert row["limit"] > 0 and abs(row["efficiency"] - ratio) <= 0.05 * ratio + 2e-3


@pytest.mark.slow
def test_a_rehearsal_runs_the_real_widths_in_bf16(tmp_path):
    """`--rehearse`: the real widths, vocabularies and prompts in bf16 with one layer, on the CPU (what only the
    real shapes or bf16 break, found before a device's minutes are spent). Speculation equals our step's own path
    without drafts (the drafter's continuation; `generate`'s may part from it at a bf16 near-tie) and accepts."""
    main = runpy.run_path(str(SCRIPT))["main"]
    out = tmp_path / "rehearsal.json"
    assert main(["--rehearse", "--shapes", "llama3-8b,mamba2-2.7b", "--batches", "1", "--chains", "2",
                 "--acceptances", "0.9", "--rounds", "1", "--tree", "2,1", "--new-tokens", "6", "--json",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    assert not doc["dry_run"] and [r["shape"] for r in doc["results"]] == ["llama3-8b", "mamba2-2.7b"]
    for result in doc["results"]:
        assert result["step"] == "static" and result["layers"] == 1 and result["new_tokens"] == 6
        rows = {r["method"]: r for r in result["rows"]}
        for name in ("no_draft", "chain_k2_p0.9", "tree_2x1_p0.9"):
            assert rows[name]["identical"], (result["shape"], name)
        assert rows["chain_k2_p0.9"]["accepted_length"] > 1.5
