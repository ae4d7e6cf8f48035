"""`multispec train draft` for a VLM on the shared training loop: two processes under `accelerate launch` (gloo on
the CPU) follow one process's loss curve at the same global batch, gradient accumulation gives the same steps as
whole batches, and a run halted at step N continues at N to the uninterrupted run's head. SpecVLM's kind is used
throughout: its gate draws Gumbel noise, which each row takes from its own generator (a draw per batch would differ
between the launches, and these tests would fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from multispec.cli import main
from multispec.vision.cli import SHIPPED

RUN = ["--data", str(SHIPPED / "jsonl" / "questions.jsonl"), "--kind", "specvlm", "--steps", "6", "--batch-size", "4",
       "--limit", "12", "--max-new-tokens", "10", "--warmup-steps", "2", "--lr", "3e-3", "--threads", "1"]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from transformers import LlavaForConditionalGeneration

    from multispec.vision.zoo_vlm import vlm_config

    folder = tmp_path_factory.mktemp("vlm")
    torch.manual_seed(0)
    LlavaForConditionalGeneration(vlm_config(layers=1, hidden=64)).eval().save_pretrained(folder)
    return folder


def _train(vlm, out, *extra) -> list[dict]:
    assert main(["train", "draft", "--target", str(vlm), "--out", str(out), *RUN, *extra]) == 0
    return json.loads((out / "history.json").read_text())


def _weights(folder):
    return {k: v.float() for k, v in load_file(next(Path(folder).glob("*.safetensors"))).items()
            if v.is_floating_point()}


def test_gradient_accumulation_takes_the_steps_of_whole_batches(vlm, tmp_path):
    """The loss of a batch is the mean of its rows' losses (each row's noise its own), so two micro-batches of
    two average to the loss and gradient of the batch of four."""
    whole = _train(vlm, tmp_path / "whole")
    split = _train(vlm, tmp_path / "split", "--grad-accum", "2")
    assert [h["total"] for h in split] == pytest.approx([h["total"] for h in whole], rel=1e-4)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "split")
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-4) for k in a)  # fp16 storage: an ulp
    assert whole[-1]["total"] < whole[0]["total"]


def test_a_halted_run_resumes_to_the_uninterrupted_head(vlm, tmp_path):
    whole = _train(vlm, tmp_path / "whole", "--checkpoint-every", "2")
    first = _train(vlm, tmp_path / "halted", "--checkpoint-every", "2", "--halt-after", "3")
    report = json.loads((tmp_path / "halted" / "report.json").read_text())
    assert len(first) == 3 and not report["finished"] and "accepted_length" not in report
    resumed = _train(vlm, tmp_path / "halted", "--checkpoint-every", "2")
    assert [h["step"] for h in resumed] == list(range(1, 7))
    assert [h["total"] for h in resumed] == pytest.approx([h["total"] for h in whole], rel=1e-5)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "halted")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_processes_follow_the_loss_curve_of_one(vlm, tmp_path):
    """Each process answers every second question (gathered back in order) and trains on half of every global
    batch; the gradients are averaged. Tolerance 1e-4 relative: the same sums in another order."""
    one = _train(vlm, tmp_path / "one")
    accelerate = Path(sys.executable).with_name("accelerate")
    run = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                          "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "multispec", "train", "draft",
                          "--target", str(vlm), "--out", str(tmp_path / "two"), *RUN],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "history.json").read_text())
    assert [h["step"] for h in two] == list(range(1, 7))
    assert [h["total"] for h in two] == pytest.approx([h["total"] for h in one], rel=1e-4)
    report = json.loads((tmp_path / "two" / "report.json").read_text())
    assert report["processes"] == 2 and report["questions"] == 11
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-4) for k in a)  # fp16 storage: an ulp
