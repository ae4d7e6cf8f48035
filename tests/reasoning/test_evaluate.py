"""`evaluate` runs every method on tiny random models and summarises them; the judge rule plugged into the
token-level rows counts its overrides."""

import pytest
import torch

from multispec.judge import JudgeHead
from multispec.reasoning import METHODS, Models, Settings, evaluate
from multispec.reasoning.data import Problem
from multispec.reasoning.evaluate import markdown


def test_every_method_runs_and_is_summarised(models, tok):
    base, small = models
    head = JudgeHead(base.config.hidden_size)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(4.0)  # approves every draft (no floor: random models rate no draft at 0.2)
    m = Models(base, small, tok, {"small": small, "base-as-expert": base}, head)
    problems = [Problem("What is 2 + 2?", 4), Problem("Compute 3 * 5.", 15)]
    results = evaluate(m, problems, METHODS, Settings(max_new_tokens=24, k=3, judge_min_prob=0.0), progress=False)
    assert set(results) == set(METHODS)
    for name, r in results.items():
        assert 0 <= r["accuracy"] <= 1 and r["latency_s"] > 0 and r["problems"] == 2, name
        assert r["speedup_vs_base"] > 0
    assert results["base"]["speedup_vs_base"] == 1.0
    assert results["judge"]["mean_accepted_length"] > results["exact"]["mean_accepted_length"]
    assert results["judge"]["overrides"] > 0 and results["exact"]["overrides"] == 0
    ratio = results["judge"]["mean_accepted_length"] / results["exact"]["mean_accepted_length"]
    assert results["judge"]["accepted_length_vs_exact"] == pytest.approx(ratio, abs=1e-3)
    assert results["specreason"]["steps_accepted"] + results["specreason"]["steps_rejected"] > 0
    assert "| judge |" in markdown(results)


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
