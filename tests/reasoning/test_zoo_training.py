"""The reasoning pair's training: a run cut off mid-way resumes from its checkpoint to the same weights as an
uninterrupted run; a finished stage is not retrained; a checkpoint of another recipe is refused."""

import re
from dataclasses import replace

import pytest
import torch

from multispec.reasoning import zoo_pair
from multispec.reasoning.zoo_pair import SMALL, Batches, load_model, train_model

TINY = replace(SMALL, steps=6, batch_size=3)


def test_a_cut_off_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    train_model(TINY, tmp_path / "whole", "whole", checkpoint_every=2)
    calls = {"n": 0}
    original = Batches.__next__

    def cut(self):
        calls["n"] += 1
        if calls["n"] == 5:  # after the checkpoint at step 4
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(Batches, "__next__", cut)
    with pytest.raises(KeyboardInterrupt):
        train_model(TINY, tmp_path / "cut", "cut", checkpoint_every=2)
    assert (tmp_path / "cut" / "resume.pt").exists()
    monkeypatch.setattr(Batches, "__next__", original)
    report = train_model(TINY, tmp_path / "cut", "cut", checkpoint_every=2)
    assert not (tmp_path / "cut" / "resume.pt").exists() and report["recipe"]["steps"] == 6
    a, b = load_model(tmp_path / "whole"), load_model(tmp_path / "cut")
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    again = train_model(TINY, tmp_path / "cut", "cut")  # finished: read back, not retrained
    assert again == report


def test_a_checkpoint_of_another_recipe_is_refused(tmp_path, monkeypatch):
    calls = {"n": 0}
    original = Batches.__next__

    def cut(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(Batches, "__next__", cut)
    with pytest.raises(KeyboardInterrupt):
        train_model(TINY, tmp_path, "cut", checkpoint_every=2)
    monkeypatch.setattr(Batches, "__next__", original)
    with pytest.raises(ValueError, match="recipe"):
        train_model(replace(TINY, lr=1e-2), tmp_path, "other", checkpoint_every=2)


@pytest.mark.parametrize("drill", ["symbols", "mixed"])
def test_training_batches_mask_the_prompt_and_never_hold_a_test_question(drill):
    held_out = {p.question for p in zoo_pair.test_split()}
    batch = next(Batches(replace(SMALL, batch_size=16, drill=drill), held_out))
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    tok = zoo_pair.ByteTokenizer()
    kinds, phrasings = set(), set()
    for row in range(16):
        real = ids[row][mask[row].bool()]
        text = tok.decode(real)
        read = labels[row][mask[row].bool()] != -100
        assert int(real[-1]) == zoo_pair.EOS and bool(read[-1])
        if text.startswith(zoo_pair.DRILL_HEADER):  # practice: the loss reads the results only
            kinds.add("drill")
            results = tok.decode(real[read])
            lines = [line for line in text.split("\n")[1:] if line[:1].isalnum()]
            assert results.split() == [re.search(r"(\d+)$", line).group(1) for line in lines]
            phrasings.update("=" if " = " in line else "is" if " is " in line else ":" for line in lines)
            continue
        kinds.add("problem")
        first = int(read.nonzero()[0])
        assert tok.decode(real[:first]).endswith("Solution:\n")  # the loss starts at the solution
        assert bool(read[first:].all())
        assert text.split("\n")[0][len("Question: "):] not in held_out
    assert kinds == {"drill", "problem"}
    # practice in the solutions' phrasings when asked, else the symbolic lines only
    assert phrasings == ({"=", "is", ":"} if drill == "mixed" else {"="})


def test_a_stage_can_continue_another_models_weights(tmp_path):
    """`init`: the shipped base is `BASE` continued by a practice stage; the stage starts from the stored
    weights (its first loss is the trained model's, not a fresh one's) and refuses another architecture."""
    first = train_model(replace(TINY, steps=12, lr=1e-2), tmp_path / "first", "first")
    stage = replace(TINY, steps=2, lr=1e-9, drill="mixed", seed=1)
    report = train_model(stage, tmp_path / "second", "second", init=tmp_path / "first")
    assert report["continues"] == first
    a, b = load_model(tmp_path / "first"), load_model(tmp_path / "second")
    for p, q in zip(a.parameters(), b.parameters()):  # lr ~0: the stage kept the weights it started from
        assert torch.allclose(p, q, atol=0.05)
    fresh = train_model(stage, tmp_path / "fresh", "fresh")
    assert fresh["final_loss"] > report["final_loss"] + 0.5
    with pytest.raises(ValueError, match="init"):
        train_model(replace(stage, layers=3), tmp_path / "third", "third", init=tmp_path / "first")


def test_the_pair_recipe_trains_the_base_in_stages(tmp_path, monkeypatch):
    """`train_pair`: the shipped base is the pretrained base continued by each practice stage in turn; the
    intermediates are not kept, and a finished base is not trained again (smoke budgets; judge and experts
    left out)."""
    monkeypatch.setattr(zoo_pair, "EXPERTS", {})
    monkeypatch.setattr(zoo_pair, "train_zoo_judge", lambda folder, problems, **kw: {"skipped": True})
    report = zoo_pair.train_pair(tmp_path, quick=True)
    assert report["base_pretrain"]["recipe"]["drill"] == "symbols"
    assert report["base_practice"]["recipe"]["drill"] == "mixed"
    assert report["base_practice"]["continues"] == report["base_pretrain"]
    assert report["base_words"]["recipe"]["drill"] == "words"
    assert report["base_words"]["continues"] == report["base_practice"]
    assert report["base"]["recipe"]["drill"] == "words" and report["base"]["continues"] == report["base_words"]
    assert report["base"]["recipe"]["seed"] != report["base_words"]["recipe"]["seed"]  # fresh drills
    assert not any((tmp_path / name).exists() for name in ("base-pretrain", "base-practice", "base-words"))
    assert (tmp_path / "base" / "config.json").exists()
    # Speculative Thinking's writer: the small model continued on traces with reflective cues
    assert report["small_reflective"]["continues"] == report["small"]
    assert report["small_reflective"]["recipe"]["reflect"] and not report["small"]["recipe"]["reflect"]
    again = zoo_pair.train_pair(tmp_path, quick=True)
    assert "base_pretrain" not in again and again["base"] == report["base"]
