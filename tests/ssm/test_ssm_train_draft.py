"""`multispec train draft` for a state-space target, from the command line: the zoo's byte Mamba-2 written out
as a user's checkpoint (`multispec zoo export`), a draft model distilled from its first layers on text it never
trained on; the trained draft accepts more per step than the untrained one and drafts losslessly. An EAGLE head
over the target's final hidden state (which the Mamba-2 adapter returns) trains and drafts losslessly too; an
EAGLE-3 head, which reads inner layers the adapter does not return, is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from multispec import ModelDrafter, StoppingConfig, speculative_generate
from multispec.cli import main
from multispec.drafters.formats import load_eagle
from multispec.zoo.data import read_source, stdlib_files

ARGS = ["--batch-size", "8", "--lr", "3e-3", "--warmup-steps", "5", "--seq-len", "64", "--eval-prompts", "1",
        "--threads", "2"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("mamba2")
    assert main(["zoo", "export", "stdlib-mamba2", str(root / "pair")]) == 0
    data = root / "data"
    data.mkdir()
    for f in stdlib_files("validation")[:20]:  # files no zoo recipe trained on
        (data / f"{f.name}.txt").write_text(read_source(f)[:1500])
    return root


def _lossless(folder, drafter):
    target = AutoModelForCausalLM.from_pretrained(folder / "pair" / "target").eval()
    ids = torch.tensor([list(b"import os\n\ndef main(argv):\n    ")])
    out = speculative_generate(target, drafter(target), ids, max_new_tokens=24, tree=3, stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None,
                                                      pad_token_id=0))
    return out.stats.mean_accepted_length


@pytest.mark.slow
def test_a_distilled_state_space_draft_model_accepts_more_than_its_untrained_start(exported):
    out = exported / "draft"
    assert main(["train", "draft", "--target", str(exported / "pair" / "target"), "--data", str(exported / "data"),
                 "--out", str(out), "--kind", "draft-model", "--draft-layers", "2", "--steps", "30", *ARGS]) == 0
    report = json.loads((out / "report.json").read_text())
    # when written: 1.64 untrained (the target's first two layers and its head), 3.2 after 40 steps
    assert report["accepted_length"] > report["untrained_accepted_length"] + 0.5, report
    assert _lossless(exported, lambda _: ModelDrafter(AutoModelForCausalLM.from_pretrained(out).eval())) > 1.5


@pytest.mark.slow
def test_an_eagle_head_over_a_state_space_target_trains_and_drafts_losslessly(exported, capsys):
    out = exported / "eagle"
    target = str(exported / "pair" / "target")
    assert main(["train", "draft", "--target", target, "--data", str(exported / "data"), "--out", str(out),
                 "--kind", "eagle", "--steps", "20", *ARGS]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["finished"] and report["final_loss"] < json.loads((out / "history.json").read_text())[0]["total"]
    _lossless(exported, lambda target: load_eagle(out, target))
    assert main(["train", "draft", "--target", target, "--data", str(exported / "data"), "--out",
                 str(exported / "e3"), "--kind", "eagle3", "--steps", "1"]) == 2
    assert "eagle3 reads the target's layers, which its adapter (Mamba2Target) does not return" in \
        capsys.readouterr().err
