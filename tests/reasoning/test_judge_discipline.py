"""Judge decoding's discipline: a judge records the target it was trained for and refuses another one before
any forward; `train judge` never labels the pair's test problems; the validation split shares no problem with
the test split or the judges' labelling problems."""

import json

import pytest
import torch

from multispec import speculative_generate
from multispec.drafters import ModelDrafter
from multispec.rules import Judge, JudgeHead, target_fingerprint
from multispec.reasoning import load_pair
from multispec.reasoning.zoo_pair import JUDGE_SEED, test_split, validation_split
from multispec.reasoning.data import make_problems


@pytest.fixture(scope="module")
def pair():
    return load_pair()


def test_a_judge_refuses_another_target_of_the_same_width(pair, tmp_path):
    """The shipped judges record the base; the small model has the same hidden size (128), so a shape check
    alone would let the judge run on it."""
    assert pair.judge.trained_for == target_fingerprint(pair.target)
    assert pair.small.config.hidden_size == pair.target.config.hidden_size
    ids = torch.tensor([pair.tokenizer.encode(pair.test[0].prompt())])
    forward = pair.small.forward
    pair.small.forward = lambda *a, **k: pytest.fail("a forward ran before the refusal")
    try:
        with pytest.raises(ValueError, match="judge: trained for another target .*num_layers, weights"):
            speculative_generate(pair.small, ModelDrafter(pair.small), ids, max_new_tokens=4,
                                 rule=Judge(pair.judge))
    finally:
        pair.small.forward = forward
    # saved with its target and loaded again, the record survives; a head without one is not checked
    head = JudgeHead(128)
    head.save(tmp_path / "j", target=pair.target)
    assert json.loads((tmp_path / "j" / "judge_config.json").read_text())["trained_for"]["num_layers"] == 12
    assert JudgeHead.load(tmp_path / "j").trained_for == pair.judge.trained_for
    JudgeHead(128).check_target(pair.small)


def test_the_approve_all_control_approves_every_token():
    head = JudgeHead.approve_all(16)
    assert bool((torch.sigmoid(head(torch.randn(50, 16) * 100)) > 0.999).all())
    assert JudgeHead.approve_all(16, context=True).in_features == 2 * 16 + 3


def test_train_judge_never_labels_test_problems(pair, tmp_path, monkeypatch, capsys):
    """Given problems that include test ones (and by default), the labelled set holds no test question."""
    from multispec.cli import main
    from multispec.reasoning import cli, write_problems

    seen = []

    def fake_label(base, small, problems, tokenizer, **kw):  # what would be labelled; synthetic labels
        seen.append([p.question for p in problems])
        g = torch.Generator().manual_seed(0)
        return {"features": torch.randn(40, 128, generator=g), "labels": torch.arange(40) % 2}

    monkeypatch.setattr(cli, "label_divergences", fake_label)
    test = {p.question for p in pair.test}
    mixed = tmp_path / "mixed.jsonl"
    write_problems(pair.test[:5] + make_problems(5, seed=99), mixed)
    assert main(["train", "judge", "--data", str(mixed), "--problems", "10", "--out", str(tmp_path / "a")]) == 0
    assert main(["train", "judge", "--problems", "20", "--out", str(tmp_path / "b")]) == 0
    assert len(seen[0]) == 5 and len(seen[1]) == 20
    assert not (set(seen[0]) | set(seen[1])) & test
    only_test = tmp_path / "test.jsonl"
    write_problems(pair.test[:3], only_test)
    assert main(["train", "judge", "--data", str(only_test), "--out", str(tmp_path / "c")]) == 2
    assert "--data: no problems left" in capsys.readouterr().err


def test_the_validation_split_is_disjoint_from_test_and_judge_problems():
    val = {p.question for p in validation_split(120)}
    assert len(val) >= 110  # a few questions may repeat within the split; none outside it
    assert not val & {p.question for p in test_split()}
    assert not val & {p.question for p in make_problems(800, JUDGE_SEED, 0.25)}


def test_labels_are_binned_by_the_base_s_probability_of_the_token():
    """What a floor can tell apart: a judge's training report counts good and bad tokens per probability bin
    (the top bin holds probability 1)."""
    from multispec.reasoning.zoo_pair import PROB_BINS, by_target_prob

    bins = by_target_prob(torch.tensor([1, 0, 1, 0]), torch.tensor([0.005, 0.3, 1.0, 0.3]))
    assert len(bins) == len(PROB_BINS) - 1
    assert bins["[0.0, 0.01)"] == {"good": 1, "bad": 0} and bins["[0.3, 0.5)"] == {"good": 0, "bad": 2}
    assert bins["[0.5, 1.0]"] == {"good": 1, "bad": 0}
    assert sum(b["good"] + b["bad"] for b in bins.values()) == 4
