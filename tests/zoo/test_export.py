"""`multispec zoo export`: a text pair written as checkpoint folders loads back identical through the Auto
classes (the same logits, the same token ids from the exported tokenizer) and its drafters draft the same tokens
from the folders as from the zoo; pairs whose target the Auto classes cannot load are refused by name."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.cli import main
from multispec.drafters.formats import load_eagle


def test_an_exported_pair_loads_back_identical(tmp_path):
    assert main(["zoo", "export", "stdlib-bytes", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "export.json").read_text())["pair"] == "stdlib-bytes"
    pair = zoo.load("stdlib-bytes")
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "target")
    text = "def parse(line: str) -> dict:\n    return {'é': line}\n"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert torch.equal(ids, pair.tokenizer(text, return_tensors="pt")["input_ids"]) and tokenizer.decode(ids[0]) == text
    with torch.no_grad():
        assert torch.equal(target(ids).logits, pair.target(ids).logits)
    runs = [speculative_generate(t, d, ids, max_new_tokens=32, tree=4, stopping=StoppingConfig.never())
            for t, d in ((pair.target, pair.drafter), (target, load_eagle(tmp_path / "eagle", target)))]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert [s.accepted for s in runs[0].stats.steps] == [s.accepted for s in runs[1].stats.steps]
    assert runs[0].stats.mean_accepted_length > 1.5


def test_a_pair_the_auto_classes_cannot_load_is_refused_by_name(tmp_path, capsys):
    assert main(["zoo", "export", "mnist-vq-gpt", str(tmp_path)]) == 2
    assert "NAME: mnist-vq-gpt's target" in capsys.readouterr().err
    assert main(["zoo", "export", "no-such-pair", str(tmp_path)]) == 2
    assert "NAME: no zoo pair 'no-such-pair'" in capsys.readouterr().err
