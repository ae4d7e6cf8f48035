"""The real-size GPU bench (`benchmarks/probes/real_sizes.py`), dry-run on the CPU at tiny shapes of the same
classes: it runs end to end, every speculative output equals `generate`, and each chain row carries its
accepted length, limit and efficiency (the figures themselves are the GPU's; these are not timed)."""

import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "real_sizes.py"


def test_dry_run_covers_every_shape(tmp_path):
    main = runpy.run_path(str(SCRIPT))["main"]
    out = tmp_path / "dry.json"
    assert main(["--dry-run", "--batches", "2", "--chains", "3", "--acceptances", "0.8", "--rounds", "1",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["dry_run"] and {r["shape"] for r in doc["results"]} == {
        "llama3-8b", "qwen2.5-vl-7b-lm", "janus-pro-7b-gpt", "mamba2-2.7b", "bamba-9b"}
    steps = {r["shape"]: r["step"] for r in doc["results"]}
    assert steps["llama3-8b"] == steps["qwen2.5-vl-7b-lm"] == "static" and steps["mamba2-2.7b"] == "eager"
    for result in doc["results"]:
        rows = {r["method"]: r for r in result["rows"]}
        assert set(rows) == {"generate", "no_draft", "chain_k3_p0.8"}
        assert all(r["identical"] for r in rows.values()), result
        chain = rows["chain_k3_p0.8"]
        assert chain["accepted_length"] > 1.5  # drafts accepted
        ratio = chain["vs_no_draft"] / chain["limit"]  # from rounded figures: within their rounding
        assert chain["limit"] > 0 and abs(chain["efficiency"] - ratio) <= 0.05 * ratio + 2e-3
