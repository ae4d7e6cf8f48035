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
    """Each speculative row's limit is recomputed from the verify times the result stores (accepted length x
    verify[1] / verify[k + 1], the (k+1)-node verify no cheaper than a 1-node one) and never exceeds the accepted
    length; its efficiency is its speedup over no drafts divided by that limit. Mutation it must catch (checked by
    hand): the limit inverted (verify[k + 1] / verify[1]), which the old test, recomputing efficiency from the row's
    own limit, let through."""
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
        verify = {int(k): v for k, v in result["verify_seconds"].items()}
        for row, nodes in ((rows["chain_k3_p0.8"], 3), (rows["tree_2x1_p0.8"], 4)):
            assert row["accepted_length"] > 1.5  # drafts accepted
            limit = row["accepted_length"] * verify[1] / max(verify[1], verify[nodes + 1])
            assert row["limit"] == pytest.approx(limit, rel=1e-2, abs=2e-3)  # from rounded figures
            assert 0 < row["limit"] <= row["accepted_length"] + 1e-3
            ratio = row["vs_no_draft"] / row["limit"]
            assert abs(row["efficiency"] - ratio) <= 0.05 * ratio + 2e-3


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
