"""`multispec bench all`: benchmarks run through their own parsers into one document, and the report regenerated
from it: BENCHMARKS.md's generated section (tables, plot links), README's summary (the fastest speculative row of
each table, never a baseline or a control), PNG plots; rewriting replaces the blocks, never duplicates them."""

import argparse
import json

import pytest

from multispec.bench import report
from multispec.bench.recorder import results, row_output
from multispec.cli import main


def _row(speedup, spread, length=None, hist=None, split=None, **extra):
    row = {"speedup": speedup, "speedup_spread": spread, "tokens_per_s": 10.0 * speedup, "seconds": 1.0,
           "tokens": 10, "mean_accepted_length": length, **extra}
    if hist:
        row["accepted_length_histogram"] = hist
    if split:
        row["per_step_ms"] = split
    return row


def _table(rows):
    return {"baseline": next(iter(rows)), "unit": "tokens", "rounds": 2, "round_inputs": "repeat", "inputs_per_round": [2, 2],
            "methods": rows}


def _fake_bench(name, tables):
    parser = argparse.ArgumentParser(prog=f"bench {name}")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")

    def run(args):
        assert args.quick and args.rounds == 2  # bench all passes its options through
        with open(args.json, "w") as f:
            json.dump(results(name, {"pair": f"{name}-pair"}, tables), f)
        return 0

    parser.set_defaults(func=run)
    return parser


SPLIT = {"draft": 1.0, "verify": 4.0, "commit": 0.5, "other": 0.2}
SAME = {"outputs": {"identical": 4}}
TEXT = {"greedy": _table({"plain": _row(1.0, [1.0, 1.0]), "no_draft": _row(1.2, [1.1, 1.3], role="control", **SAME),
                          "eagle_chain_k8": _row(2.7, [2.5, 2.9], 7.1, {"6": 3, "9": 5}, SPLIT, **SAME),
                          "hybrid_chain_k8": _row(2.6, [2.5, 2.8], 4.0, {"3": 2, "5": 4}, SPLIT, **SAME)}),
        "sampling": _table({"plain": _row(1.0, [1.0, 1.0]),
                            "eagle_chain_k8": _row(2.1, [1.7, 2.4], 6.1, {"6": 8}, SPLIT)})}
REASONING = {"greedy": _table({"base": _row(1.0, [1.0, 1.0], lossless=True),
                               "judge_approve_all": _row(3.0, [2.9, 3.1], 4.3, control="approve_all_floor",
                                                         role="control", lossless=False),
                               "exact": _row(1.5, [1.4, 1.6], 4.0, control=None, lossless=True),
                               "judge": _row(2.5, [2.4, 2.6], 4.2, control=None, lossless=False)})}


def test_bench_all_runs_each_benchmark_and_regenerates_the_report(tmp_path):
    parsers = {"text": _fake_bench("text", TEXT), "reasoning": _fake_bench("reasoning", REASONING)}
    doc = report.run_all(parsers, report.bench_names(list(parsers), None), quick=True, rounds=2, progress=False)
    assert list(doc["benches"]) == ["text", "reasoning"] and doc["quick"]
    md, readme = tmp_path / "BENCHMARKS.md", tmp_path / "README.md"
    md.write_text("# Benchmarks\n\nhand-written text\n")
    readme.write_text("# multispec\n\n" + report.SUMMARY_BEGIN + "\nold\n" + report.SUMMARY_END + "\n\nmore\n")
    json_path = tmp_path / "results" / "all_quick.json"
    json_path.parent.mkdir()
    json_path.write_text(json.dumps(doc))
    for _ in range(2):  # a second run replaces the blocks
        report.write_report(doc, json_path, md, readme, tmp_path / "plots")
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written text\n") and text.count(report.BEGIN) == 1
    assert "| `eagle_chain_k8` | 27.00 | 2.70x [2.50-2.90] |" in text and "results/all_quick.json" in text
    assert "![text: accepted_lengths](plots/text_accepted_lengths.png)" in text
    summary = readme.read_text()
    assert summary.count(report.SUMMARY_BEGIN) == 1 and "old" not in summary and summary.endswith("more\n")
    assert "| text (text-pair) | greedy | `eagle_chain_k8` | 2.70x [2.50-2.90] over `plain` | 7.10 |" in summary
    # the best lossless row, and the faster lossy one under it; the control row is faster still, but a control is
    # not a method under test
    assert "| reasoning (reasoning-pair) | greedy | `exact` | 1.50x" in summary
    assert "| reasoning (reasoning-pair) | greedy | `judge` | 2.50x" in summary and "judge_approve_all" not in summary
    for name in ("text_speedup", "text_accepted_lengths", "text_step_split", "reasoning_speedup"):
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "plots" / "reasoning_step_split.png").exists()  # no step split in that bench


def test_bench_all_options_are_checked_before_anything_runs(tmp_path, capsys):
    assert main(["bench", "all", "--only", "text,nope"]) == 2
    assert "--only: expected some of core, text" in capsys.readouterr().err
    assert main(["bench", "all", "--from-json", str(tmp_path / "missing.json")]) == 2
    assert "--from-json" in capsys.readouterr().err


def test_a_stored_run_regenerates_the_report_without_running(tmp_path, capsys):
    doc = {"schema": "multispec.bench/1", "benchmark": "all", "quick": True, "machine": results("x", {}, {})["machine"],
           "benches": {"text": results("text", {"pair": "p"}, TEXT)}}
    stored = tmp_path / "all.json"
    stored.write_text(json.dumps(doc))
    md = tmp_path / "B.md"
    md.write_text("")
    assert main(["bench", "all", "--from-json", str(stored), "--benchmarks-md", str(md), "--readme", "none",
                 "--plots", str(tmp_path / "plots")]) == 0
    assert "eagle_chain_k8" in md.read_text() and "| text (p) | sampling |" in capsys.readouterr().out


@pytest.mark.parametrize("only, expected", [(None, ["core", "text", "ssm"]), ("ssm,core", ["core", "ssm"])])
def test_benchmarks_run_in_the_reports_order(only, expected):
    assert report.bench_names(["ssm", "text", "core"], only) == expected


def test_the_summary_says_what_the_fastest_row_gives_up():
    table = _table({"ar": _row(1.0, [1.0, 1.0], max_tvd=0.0, accuracy=0.99),
                    "lantern": _row(2.0, [1.9, 2.1], 6.0, max_tvd=0.4)})
    assert row_output(table["methods"]["lantern"], table, "sampling") == "lossy: max TVD 0.400 per token"
    table = _table({"base": _row(1.0, [1.0, 1.0], accuracy=0.99), "judge": _row(2.0, [1.9, 2.1], accuracy=0.95),
                    "exact": _row(1.5, [1.4, 1.6], accuracy=0.99, lossless=True)})
    assert row_output(table["methods"]["judge"], table, "greedy") == "lossy: accuracy 0.950 (`base` 0.990)"
    assert row_output(table["methods"]["exact"], table, "greedy") == "accuracy 0.990 (`base` 0.990)"
    table = _table({"plain": _row(1.0, [1.0, 1.0]), "eagle": _row(2.0, [1.9, 2.1], outputs={"identical": 3})})
    assert row_output(table["methods"]["eagle"], table, "greedy") == "3 identical to the baseline's"


def test_the_summary_picks_rows_by_role_and_shows_a_lossy_row_only_beside_a_lossless_one():
    """Mutations caught: the fastest row of a table whatever it is (LANTERN delta 0.4 headed the image table with no
    lossless row beside it), and rows skipped by name prefix (`small_vlm_chain_k8`, a method under test, was
    dropped as if it were the reference small model)."""
    image = _table({"ar": _row(1.0, [1.0, 1.0], max_tvd=0.0), "ar_hf": _row(1.1, [1.0, 1.2], role="control"),
                    "exact_chain_k6": _row(1.4, [1.3, 1.5], 3.0, max_tvd=0.0),
                    "lantern_d0.4_chain_k6": _row(2.9, [2.7, 3.0], 6.0, max_tvd=0.4),
                    "lantern_d0.1_chain_k6": _row(1.2, [1.1, 1.3], 3.5, max_tvd=0.1)})
    vision = _table({"plain": _row(1.0, [1.0, 1.0]), "hf_assisted_small_vlm": _row(1.5, [1.4, 1.6], role="peer", **SAME),
                     "small_vlm_chain_k8": _row(2.2, [2.1, 2.3], 5.0, **SAME),
                     "eagle_chain_k8": _row(2.0, [1.9, 2.1], 6.0, **SAME)})
    doc = {"machine": results("x", {}, {})["machine"], "benches": {
        "image-ar": results("image-ar", {"pair": "img"}, {"sampling": image}),
        "vision": results("vision", {"pair": "vqa"}, {"greedy": vision})}}
    lines = report.summary_table(doc).splitlines()
    image_lines = [line for line in lines if line.startswith("| image-ar")]
    assert len(image_lines) == 2 and "`exact_chain_k6` | 1.40x" in image_lines[0]
    assert "`lantern_d0.4_chain_k6` | 2.90x" in image_lines[1] and "lossy: max TVD 0.400" in image_lines[1]
    assert [line for line in lines if line.startswith("| vision")] == [
        "| vision (vqa) | greedy | `small_vlm_chain_k8` | 2.20x [2.10-2.30] over `plain` | 5.00 | 4 identical to the "
        "baseline's |"]


def test_only_reruns_replace_their_benchmarks_in_the_stored_run(tmp_path, monkeypatch):
    """`bench all --only vision` on a stored document reruns vision alone, keeps the others, and the report
    names the rerun's own machine line; a stored run of the other --quick setting is refused before running."""
    old_machine = dict(results("x", {}, {})["machine"], git_commit="aaaaaaa", date_utc="2026-01-01 00:00")
    earlier = dict(old_machine, date_utc="2025-12-31 23:40")  # a benchmark of that run, ended before the run did
    stored = {"schema": "multispec.bench/1", "benchmark": "all", "quick": True, "machine": old_machine,
              "benches": {"text": dict(results("text", {"pair": "p"}, TEXT), machine=earlier),
                          "reasoning": dict(results("reasoning", {"pair": "r"}, REASONING), machine=old_machine)}}
    new = {"schema": "multispec.bench/1", "benchmark": "all", "quick": True, "machine": results("x", {}, {})["machine"],
           "benches": {"reasoning": results("reasoning", {"pair": "r2"}, REASONING)}}
    merged = report.merge(stored, new)
    assert list(merged["benches"]) == ["text", "reasoning"] and merged["machine"] == old_machine
    assert merged["benches"]["reasoning"]["settings"]["pair"] == "r2" and merged["benches"]["text"] == stored["benches"]["text"]
    section = report.render_section(merged, "all.json", "plots")
    assert section.count("This benchmark was rerun alone:") == 1
    assert "; reasoning rerun alone:" in report.summary_table(merged)
    with pytest.raises(ValueError, match="--quick"):
        report.merge(stored, dict(new, quick=False))
    path = tmp_path / "all.json"
    path.write_text(json.dumps(stored))
    ran = []
    monkeypatch.setattr(report, "run_all", lambda *a, **k: ran.append(a) or new)
    assert main(["bench", "all", "--only", "reasoning", "--json", str(path), "--benchmarks-md", str(tmp_path / "B.md"),
                 "--readme", "none", "--plots", str(tmp_path / "plots")]) == 2  # not --quick: refused
    assert not ran
    (tmp_path / "B.md").write_text("")
    assert main(["bench", "all", "--quick", "--only", "reasoning", "--json", str(path), "--benchmarks-md",
                 str(tmp_path / "B.md"), "--readme", "none", "--plots", str(tmp_path / "plots")]) == 0
    assert list(json.loads(path.read_text())["benches"]) == ["text", "reasoning"]
