"""`multispec train draft` on a tiny random Llama saved to disk with its tokenizer: each kind (EAGLE, EAGLE-3, a
draft model) trains from the command line, then drafts losslessly (greedy output equals the target's own
`generate`) and accepts more per step than the same drafter untrained; the data formats (text, ShareGPT
conversations with self-distillation); a run halted at step N continues at N and ends where an uninterrupted
run ends; the trained EAGLE-3 head loads from its EAGLE-3 layout through `--draft eagle:DIR`."""

from __future__ import annotations

import json

import pytest
import torch

from multispec import StoppingConfig, speculative_generate
from multispec.cli import main
from multispec.drafters.formats import layout, load_eagle
from multispec.testing import make_target, save_checkpoint
from multispec.training.data import read_documents, split
from multispec.training.loop import LoopConfig, batch_items

STEPS = ["--batch-size", "8", "--lr", "3e-3", "--warmup-steps", "5", "--seq-len", "64", "--checkpoint-every", "50",
         "--eval-prompts", "4", "--threads", "2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A target folder, and data: a folder of 60 documents, the target's own greedy text from random prompts as
    the words its tokenizer reads (a self-distilled corpus; three documents are held out)."""
    folder = tmp_path_factory.mktemp("target")
    model = make_target("llama", seed=3)
    save_checkpoint(folder, model)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 128, (60, 6), generator=g)
    with torch.no_grad():
        text = model.generate(prompts, max_new_tokens=90, do_sample=False, eos_token_id=None, pad_token_id=0)
    data = folder.parent / "data"
    data.mkdir()
    for i, row in enumerate(text):
        (data / f"{i:02d}.txt").write_text(" ".join(f"w{int(t)}" for t in row if t >= 3))
    return folder, data, model


def _train(tmp_path, checkpoint, kind, *extra):
    folder, data, _ = checkpoint
    out = tmp_path / kind
    assert main(["train", "draft", "--target", str(folder), "--data", str(data), "--out", str(out), "--kind", kind,
                 *STEPS, *extra]) == 0
    return out, json.loads((out / "report.json").read_text())


def _lossless(model, drafter):
    ids = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 8], [3, 3, 90, 11, 12, 40, 41, 42]])
    out = speculative_generate(model, drafter, ids, max_new_tokens=24, tree=4, stopping=StoppingConfig.never())
    want = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences, want)
    return out.stats.mean_accepted_length


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle", "eagle3", "draft-model"])
def test_each_kind_trains_from_the_command_line_and_drafts_losslessly(tmp_path, checkpoint, kind):
    steps = "60" if kind == "draft-model" else "200"
    extra = {"eagle": [], "eagle3": ["--ttt-steps", "3"], "draft-model": ["--draft-layers", "1"]}[kind]
    out, report = _train(tmp_path, checkpoint, kind, "--steps", steps, *extra)
    assert report["finished"] and report["steps"] == int(steps) and report["eval"]["prompts"] == 3  # one per held-out document
    # untrained: eagle and eagle3 1.0, the layer-skip student 1.2; trained: 1.78, 2.06, 1.35 when written
    assert report["accepted_length"] > report["untrained_accepted_length"] + 0.1, report
    assert report["final_loss"] < json.loads((out / "history.json").read_text())[0]["total"]
    model = checkpoint[2]
    if kind == "draft-model":
        from multispec.drafters import ModelDrafter
        from transformers import AutoModelForCausalLM

        drafter = ModelDrafter(AutoModelForCausalLM.from_pretrained(out).eval())
    else:
        assert layout(out) == ("eagle3" if kind == "eagle3" else "multispec")
        drafter = load_eagle(out, model)
    assert _lossless(model, drafter) > 1.0  # drafts accepted: speculation, not plain decoding


def test_an_eagle3_head_is_written_in_speculators_layout_on_request(tmp_path, checkpoint, capsys):
    """`--format speculators`: speculators' config (the verifier named by the `--target` given) and tensor names,
    read back here and drafting losslessly; the option is refused for other kinds."""
    folder, data, model = checkpoint
    out, report = _train(tmp_path, checkpoint, "eagle3", "--steps", "3", "--ttt-steps", "2", "--format", "speculators")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and "layers.0.fc.weight" not in config
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(folder)
    assert "speculators" in report["layout"] and layout(out) == "eagle3"
    _lossless(model, load_eagle(out, model))
    assert main(["train", "draft", "--target", str(folder), "--data", str(data), "--out", str(tmp_path / "e"),
                 "--kind", "eagle", "--format", "speculators"]) == 2
    assert "--format: a layout of EAGLE-3 heads (--kind eagle3), not of --kind eagle" in capsys.readouterr().err


def test_ctrl_c_in_training_says_where_the_run_continues_from(tmp_path, checkpoint, capsys, monkeypatch):
    from multispec.training.loop import TrainLoop

    folder, data, _ = checkpoint
    step = TrainLoop.train_step

    def interrupted_at_three(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(TrainLoop, "train_step", interrupted_at_three)
    assert main(["train", "draft", "--target", str(folder), "--data", str(data), "--out", str(tmp_path / "run"),
                 "--steps", "6", "--seq-len", "32", "--checkpoint-every", "2", "--eval-prompts", "1"]) == 130
    err = capsys.readouterr().err
    assert "training interrupted at step 3 of 6; its checkpoint at step 2 is in" in err and "Traceback" not in err
    assert err.strip().endswith("multispec: interrupted")


def test_the_capture_is_bounded_by_what_the_steps_read(tmp_path, checkpoint):
    """`--steps 2 --batch-size 4` reads 8 sequences: the target's features are captured for those (drawn by the
    seed), not for all of `--data`; the report says how many there were."""
    _, report = _train(tmp_path, checkpoint, "eagle", "--steps", "2", "--batch-size", "4", "--seq-len", "32")
    assert report["sequences"] == 8 and report["sequences_available"] > 8 and report["finished"]


def test_sharegpt_conversations_are_rendered_and_regenerated_by_the_target(tmp_path, checkpoint):
    folder, _, model = checkpoint
    data = tmp_path / "chat.jsonl"
    rows = [{"conversations": [{"from": "human", "value": f"w{5 + i} w{9 + i} w{30 + i}"},
                               {"from": "gpt", "value": "w50 w51 w52 w53"}]} for i in range(6)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + json.dumps({"text": "w7 w8 w9 w10"}) + "\n")
    from transformers import AutoTokenizer

    docs = read_documents(data, AutoTokenizer.from_pretrained(folder))
    assert len(docs) == 7 and docs[0].messages[1] == {"role": "assistant", "content": "w50 w51 w52 w53"}
    assert split(docs).heldout  # one in twenty held out, at least one
    out = tmp_path / "out"
    assert main(["train", "draft", "--target", str(folder), "--data", str(data), "--out", str(out), "--seq-len", "8",
                 "--steps", "3", "--batch-size", "2", "--self-distill", "4", "--eval-prompts", "1"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["self_distilled"] == 4 and report["finished"]


def test_bad_data_is_refused_by_name(tmp_path, checkpoint, capsys):
    folder = checkpoint[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w5"}\n')
    args = ["train", "draft", "--target", str(folder), "--out", str(tmp_path / "o"), "--steps", "1"]
    assert main([*args, "--data", str(bad)]) == 2
    assert "expected a 'text', 'messages' or 'conversations' field" in capsys.readouterr().err
    assert main([*args, "--data", str(tmp_path / "missing.txt")]) == 2
    assert "--data:" in capsys.readouterr().err
    assert main(["train", "draft", "--target", str(tmp_path), "--data", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "--target: no config.json" in capsys.readouterr().err


def test_a_halted_run_resumes_where_it_stopped_and_ends_where_an_uninterrupted_one_does(tmp_path, checkpoint):
    folder, data, _ = checkpoint
    short = ["--steps", "12", "--batch-size", "4", "--seq-len", "32", "--checkpoint-every", "4", "--eval-prompts", "1",
             "--threads", "1"]
    whole, halted = tmp_path / "whole", tmp_path / "halted"
    assert main(["train", "draft", "--target", str(folder), "--data", str(data), "--out", str(whole), *short]) == 0
    base = ["train", "draft", "--target", str(folder), "--data", str(data), "--out", str(halted), *short]
    assert main([*base, "--halt-after", "5"]) == 0
    first = json.loads((halted / "report.json").read_text())
    assert first["steps"] == 5 and not first["finished"] and not (halted / "eagle.safetensors").exists()
    assert main(base) == 0
    second = json.loads((halted / "report.json").read_text())
    assert second["steps"] == 12 and second["finished"]
    a, b = json.loads((whole / "history.json").read_text()), json.loads((halted / "history.json").read_text())
    assert [h["step"] for h in b] == list(range(1, 13))
    assert [h["total"] for h in a] == pytest.approx([h["total"] for h in b], rel=1e-5)
    from safetensors.torch import load_file

    wa, wb = load_file(whole / "eagle.safetensors"), load_file(halted / "eagle.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_global_batch_does_not_depend_on_the_launch():
    """Step s's items are fixed by the seed and s: any split over processes and micro-batches covers them."""
    first = batch_items(0, 8, 20, 0)
    assert len(set(first)) == 8 and batch_items(0, 8, 20, 0) == first
    assert len(batch_items(2, 8, 20, 0)) == 8  # crosses into the second epoch's permutation
    with pytest.raises(ValueError, match="batch_size"):
        LoopConfig(steps=1, batch_size=0)


@pytest.mark.slow
def test_two_processes_follow_the_loss_curve_of_one_at_the_same_global_batch(tmp_path, checkpoint):
    """`accelerate launch` with two CPU processes (gloo): each takes half of every global batch and the gradients
    are averaged; the loss curve is one process's within 1e-4 relative (float sums in another order), and the
    trained heads agree to within 1e-4."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder, data, _ = checkpoint
    args = ["train", "draft", "--target", str(folder), "--data", str(data), "--steps", "10", "--batch-size", "4",
            "--seq-len", "32", "--eval-prompts", "1", "--kind", "eagle3", "--ttt-steps", "2"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    accelerate = Path(sys.executable).with_name("accelerate")
    run = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                          "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "multispec", *args,
                          "--out", str(tmp_path / "two")], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    one, two = (json.loads((tmp_path / d / "history.json").read_text()) for d in ("one", "two"))
    assert [h["step"] for h in two] == list(range(1, 11))
    assert [h["total"] for h in two] == pytest.approx([h["total"] for h in one], rel=1e-4)
    assert json.loads((tmp_path / "two" / "report.json").read_text())["processes"] == 2
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert all(torch.allclose(a[k].float(), b[k].float(), rtol=1e-4, atol=1e-4) for k in a)


def test_bf16_autocast_trains_on_the_cpu_too(tmp_path, checkpoint):
    """`--autocast bf16` (the default on a GPU) runs the losses under bf16 autocast; the parameters and the
    optimiser stay float32, the loss stays finite and falls."""
    folder, data, _ = checkpoint
    out = tmp_path / "bf16"
    assert main(["train", "draft", "--target", str(folder), "--data", str(data), "--out", str(out), "--steps", "12",
                 "--batch-size", "4", "--seq-len", "32", "--lr", "3e-3", "--warmup-steps", "2", "--eval-prompts", "1",
                 "--autocast", "bf16"]) == 0
    history = json.loads((out / "history.json").read_text())
    assert all(torch.isfinite(torch.tensor(h["total"])) for h in history)
    assert history[-1]["total"] < history[0]["total"]
    from safetensors.torch import load_file

    assert all(v.dtype in (torch.float16, torch.int64) for v in load_file(out / "eagle.safetensors").values())


def test_a_tokenizer_without_a_template_gets_the_turn_format_eval_chat_writes():
    """Training text for a template-less tokenizer is what `multispec.chat` renders (Gemma's markers when its
    vocabulary has them); a system message goes before the next user turn instead of failing."""
    from multispec.training.data import render

    class Vocab:
        chat_template = None

        def __init__(self, words):
            self.words = words

        def get_vocab(self):
            return {w: i for i, w in enumerate(self.words)}

    talk = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}]
    assert render(talk, Vocab(["a"])) == "user: Be brief.\n\nhi\nassistant: yo\n"
    gemma = render(talk[1:], Vocab(["<start_of_turn>", "<end_of_turn>"]), add_generation_prompt=True)
    assert gemma == ("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
                     "<start_of_turn>model\n")
