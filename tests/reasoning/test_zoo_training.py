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
    batch = next(Batches(replace(SMALL, batch_size=8), held_out))
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    tok = zoo_pair.ByteTokenizer()
    for row in range(8):
        text = tok.decode(ids[row][mask[row].bool()])
        first = int((labels[row] != -100).nonzero()[0])
        assert tok.decode(ids[row, :first]).endswith("Solution:\n")  # the loss starts at the solution
        question = text.split("\n")[0][len("Question: "):]
        assert question not in held_out
        assert int(ids[row][mask[row].bool()][-1]) == zoo_pair.EOS
