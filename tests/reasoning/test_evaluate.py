"""`evaluate` runs every method on tiny random models through the benchmark recorder and summarises them;
the judge rule plugged into the token-level rows counts its overrides."""

import statistics

import pytest
import torch

from multispec.rules import JudgeHead
from multispec.reasoning import METHODS, Models, Settings, evaluate
from multispec.reasoning.data import Problem
from multispec.reasoning.evaluate import evaluate_table, markdown


def test_every_method_runs_and_is_summarised(models, tok):
    base, small = models
    head = JudgeHead(base.config.hidden_size)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(4.0)  # approves every draft (no floor: random models rate no draft at 0.2)
    m = Models(base, small, tok, {"small": small, "base-as-expert": base}, head)
    problems = [Problem("What is 2 + 2?", 4), Problem("Compute 3 * 5.", 15)]
    table = evaluate_table(m, problems, METHODS, Settings(max_new_tokens=24, k=3, judge_min_prob=0.0,
                                                          control_min_prob=0.0))
    # one problem per round (fewer problems than the 3 default rounds), the base the baseline
    assert table["baseline"] == "base" and table["unit"] == "problems" and table["round_inputs"] == "partition"
    assert table["rounds"] == 2 and table["inputs_per_round"] == [1, 1]
    results = table["methods"]
    assert set(results) == set(METHODS)
    for name, r in results.items():
        assert 0 <= r["accuracy"] <= 1 and r["quality"]["accuracy"] == r["accuracy"], name
        assert r["latency_s"] > 0 and r["problems"] == 2
        assert r["latency_s"] == pytest.approx(r["seconds"] / 2, abs=1e-3)
        assert len(r["speedup_rounds"]) == 2 and r["speedup_vs_base"] == r["speedup"] > 0
        lo, hi = r["speedup_spread"]
        assert lo <= r["speedup"] <= hi
        assert r["speedup"] == pytest.approx(statistics.median(r["speedup_rounds"]), abs=1e-3)
    assert results["base"]["speedup"] == 1.0 and results["base"]["speedup_spread"] == [1.0, 1.0]
    assert results["judge"]["mean_accepted_length"] > results["exact"]["mean_accepted_length"]
    assert results["judge"]["overrides"] > 0 and results["exact"]["overrides"] == 0
    ratio = results["judge"]["mean_accepted_length"] / results["exact"]["mean_accepted_length"]
    assert results["judge"]["accepted_length_vs_exact"] == pytest.approx(ratio, abs=1e-3)
    assert results["specreason"]["steps_accepted"] + results["specreason"]["steps_rejected"] > 0
    assert results["verdict"]["tokens"] > 0  # the experts' answers (it used to report 0)
    for name, r in results.items():  # what every row of the JSON carries
        assert r["method"] == name and r["control"] == {"judge_approve_all": "approve_all_floor",
                                                        "judge_no_floor": "no_floor",
                                                        "judge_floor_matched": "approve_all_matched"}.get(name)
        assert (r["mean_accepted_length"] is not None) == (name in ("exact", "judge", "judge_approve_all",
                                                                    "judge_no_floor", "judge_floor_matched"))
    for name in ("verdict", "verdict_likelihood"):  # each expert alone, beside the verdict
        assert set(results[name]["expert_accuracy"]) == {"small", "base-as-expert"}
        assert results[name]["best_expert_accuracy"] == max(results[name]["expert_accuracy"].values())
    assert 0 <= results["spec_thinking"]["takeover_share"] <= 1
    assert results["specreason_likelihood"]["steps_accepted"] + results["specreason_likelihood"]["steps_rejected"] > 0
    assert "| judge |" in markdown(table) and "| judge |" in markdown(results)
    assert "2 rounds" in markdown(table)


def test_without_the_base_the_first_method_is_the_baseline(models, tok):
    base, small = models
    problems = [Problem("What is 2 + 2?", 4), Problem("Compute 3 * 5.", 15), Problem("Compute 1 + 1.", 2)]
    table = evaluate_table(Models(base, small, tok), problems, ["small", "exact"], Settings(max_new_tokens=12, k=3),
                           rounds=2, warmup=False)
    assert table["baseline"] == "small" and table["inputs_per_round"] == [2, 1]
    assert table["methods"]["small"]["speedup"] == 1.0 and "speedup_vs_base" not in table["methods"]["exact"]
    with pytest.raises(ValueError, match="rounds"):
        evaluate_table(Models(base, small, tok), problems, ["small"], rounds=0)


def test_bad_method_lists_are_refused(models, tok):
    base, small = models
    m = Models(base, small, tok)
    with pytest.raises(ValueError, match="methods"):
        evaluate(m, [Problem("q", 1)], ["tea_leaves"], progress=False)
    with pytest.raises(ValueError, match="judge"):
        evaluate(m, [Problem("q", 1)], ["judge"], progress=False)


def test_the_token_level_rows_use_the_token_drafter(models, tok):
    base, small = models
    m = Models(base, small, tok, token_drafter=base)  # the base drafting for itself: every draft is accepted
    r = evaluate(m, [Problem("What is 2 + 2?", 4)], ["exact"], Settings(max_new_tokens=24, k=3), progress=False)
    assert r["exact"]["acceptance_rate"] == 1.0
    r = evaluate(Models(base, small, tok), [Problem("What is 2 + 2?", 4)], ["exact"], Settings(max_new_tokens=24, k=3),
                 progress=False)
    assert r["exact"]["acceptance_rate"] < 1.0


def test_the_matched_control_runs_at_its_own_floor_and_only_when_set(models, tok):
    """`judge_floor_matched`: the approve-all head at `control_min_prob`, brought along with `judge` only when that
    floor is set; at floor 1 it approves nothing a random model does not rate 1, so it is exact decoding."""
    base, small = models
    head = JudgeHead(base.config.hidden_size)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(4.0)
    m = Models(base, small, tok, judge=head)
    problems = [Problem("What is 2 + 2?", 4)]
    plain = evaluate(m, problems, ["exact", "judge"], Settings(max_new_tokens=24, k=3, judge_min_prob=0.0),
                     progress=False, warmup=False)
    assert "judge_floor_matched" not in plain
    rows = evaluate(m, problems, ["exact", "judge"], Settings(max_new_tokens=24, k=3, judge_min_prob=0.0,
                                                             control_min_prob=1.0), progress=False, warmup=False)
    matched, judge = rows["judge_floor_matched"], rows["judge"]
    assert matched["control"] == "approve_all_matched" and matched["overrides"] == 0
    assert matched["mean_accepted_length"] == rows["exact"]["mean_accepted_length"] < judge["mean_accepted_length"]
    assert judge["accepted_length_vs_matched_control"] == pytest.approx(
        judge["mean_accepted_length"] / matched["mean_accepted_length"], abs=1e-3)
    assert "the control at its own floor" in markdown(rows)
    with pytest.raises(ValueError, match="control_min_prob"):
        evaluate(m, problems, ["judge_floor_matched"], Settings(max_new_tokens=8, k=3), progress=False)
