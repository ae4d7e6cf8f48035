"""`accelerate launch` with two CPU processes (gloo): `eval reasoning`, `eval vqa` and `eval image` split their
inputs across the processes and rank 0 reports what one process would have: the same answers, accuracies,
token counts, accepted lengths and image scores (times differ; each is a ratio pooled over the processes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multispec.cli import main

ACCELERATE = Path(sys.executable).with_name("accelerate")


def _launch(args: list[str], json_path: Path) -> dict:
    # --multi_gpu is accelerate's name for its torchrun launcher; on a machine without GPUs the processes run on
    # the CPU and join a gloo group (multispec.shards)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                          "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "multispec", *args,
                          "--json", str(json_path)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(json_path.read_text())


def _rows(payload: dict) -> dict:
    return payload["tables"]["greedy"]["methods"] if "tables" in payload else payload["table"]["methods"]


@pytest.mark.parametrize("command, quality", [
    (["eval", "reasoning", "--limit", "4", "--methods", "base,exact", "--rounds", "2"],
     ("problems", "accuracy", "tokens", "mean_accepted_length", "acceptance_rate")),  # problems: none twice
    (["eval", "vqa", "--limit", "3", "--max-new-tokens", "8"], ("quality", "tokens", "mean_accepted_length", "outputs")),
])
def test_two_processes_report_what_one_does(tmp_path, command, quality):
    assert main([*command, "--json", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    two = _launch(command, tmp_path / "two.json")
    assert _rows(one).keys() == _rows(two).keys()
    for method, row in _rows(one).items():
        for key in quality:
            assert row.get(key) == _rows(two)[method].get(key), (method, key)
        assert "speedup" in _rows(two)[method]
    if "predictions" in one:
        assert one["predictions"] == two["predictions"]
    else:
        assert two["settings"]["processes"] == 2


def test_two_processes_draw_the_same_images_and_scores(tmp_path):
    command = ["eval", "image", "--num", "20", "--method", "exact", "--seeds", "1"]
    assert main([*command, "--json", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    two = _launch(command, tmp_path / "two.json")
    for key in ("fid", "precision", "recall", "class_accuracy", "class_confidence", "max_tvd", "images"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key
