"""The reasoning pair's training: a run cut off mid-way resumes from its checkpoint to the same weights as an
uninterrupted run; a finished stage is not retrained; a checkpoint of another recipe is refused."""

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


def test_training_batches_mask_the_prompt_and_never_hold_a_test_question():
    held_out = {p.question for p in zoo_pair.test_split()}
    batch = next(Batches(replace(SMALL, batch_size=16), held_out))
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    tok = zoo_pair.ByteTokenizer()
    kinds = set()
    for row in range(16):
        real = ids[row][mask[row].bool()]
        text = tok.decode(real)
        read = labels[row][mask[row].bool()] != -100
        assert int(real[-1]) == zoo_pair.EOS and bool(read[-1])
        if text.startswith(zoo_pair.DRILL_HEADER):  # practice: the loss reads the results only
            kinds.add("drill")
            results = tok.decode(real[read])
            assert results.split() == [line.split(" = ")[1] for line in text.split("\n")[1:] if " = " in line]
            continue
        kinds.add("problem")
        first = int(read.nonzero()[0])
        assert tok.decode(real[:first]).endswith("Solution:\n")  # the loss starts at the solution
        assert bool(read[first:].all())
        assert text.split("\n")[0][len("Question: "):] not in held_out
    assert kinds == {"drill", "problem"}
