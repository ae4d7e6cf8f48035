"""`multispec generate` on the image AR pairs: digits drawn speculatively into PNGs (exact, LANTERN with
--delta, continuous tokens), the plain run beside them with --compare; bad options named before loading."""

import json

import pytest
from PIL import Image

from multispec import zoo
from multispec.cli import main


def test_lantern_digits_are_written_with_their_figures(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["generate", "--pair", "mnist-vq-gpt", "--class", "3,7", "--delta", "0.2", "--compare", "--seed", "4",
                 "--out", str(tmp_path / "png"), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["classes"] == [3, 7] and record["method"] == "EAGLE chain k=6, LANTERN delta=0.2"
    assert 0 < record["max_tvd"] <= 0.2 + 1e-6  # the relaxation moved mass, within its budget
    assert record["mean_accepted_length"] > 1.5 and record["speedup"] > 0
    for i, c in enumerate([3, 7]):
        for suffix in ("", "_plain"):
            assert Image.open(tmp_path / "png" / f"mnist-vq-gpt_{i}_class{c}{suffix}.png").size == (224, 224)
    assert "2 images in" in capsys.readouterr().out


def test_the_static_step_draws_the_same_digits(tmp_path):
    """`--step static` (the guided image GPT on the fixed-shape step): the same codes as the eager step for the
    same seed, and so the same PNG."""
    for step in ("eager", "static"):
        assert main(["generate", "--pair", "mnist-vq-gpt", "--class", "5", "--seed", "2", "--step", step,
                     "--out", str(tmp_path / step)]) == 0
    eager, static = (Image.open(tmp_path / s / "mnist-vq-gpt_0_class5.png") for s in ("eager", "static"))
    assert list(eager.getdata()) == list(static.getdata())


def test_exact_and_continuous_runs_move_no_mass(tmp_path, capsys):
    out = tmp_path / "exact.json"
    assert main(["generate", "--pair", "mnist-vq-gpt", "--class", "1", "--out", str(tmp_path), "--json",
                 str(out)]) == 0
    assert json.loads(out.read_text())["max_tvd"] == 0.0  # exact: the target's own distribution
    assert main(["generate", "--pair", "mnist-patch-diffusion", "--class", "4", "--tree", "3", "--out", str(tmp_path),
                 "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["method"] == "continuous speculative decoding, chain k=3 (exact)" and record["drafted"] > 0
    assert (tmp_path / "mnist-patch-diffusion_0_class4.png").is_file()
    # the fixed-shape step (`image_ar/continuous/static.py`): the same law on other draws, drafts accepted
    assert main(["generate", "--pair", "mnist-patch-diffusion", "--class", "4", "--tree", "3", "--step", "static",
                 "--out", str(tmp_path / "static"), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["method"] == "continuous speculative decoding, chain k=3 (exact, static step)"
    assert record["accepted"] > 0 and (tmp_path / "static" / "mnist-patch-diffusion_0_class4.png").is_file()


def test_bad_image_options_name_themselves_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(zoo, "load", lambda *a, **k: pytest.fail("a model loaded before the check"))
    for args, message in [(["--pair", "mnist-vq-gpt"], "--class: mnist-vq-gpt draws digits"),
                          (["--pair", "mnist-patch-diffusion", "--class", "3", "--delta", "0.2"], "--delta: LANTERN"),
                          (["--pair", "mnist-vq-gpt", "--class", "3", "--delta", "1.5"], "--delta: expected"),
                          (["--pair", "mnist-vq-gpt", "--class", "3", "--tree", "4/4/15"], "--tree: the image pairs"),
                          (["--pair", "mnist-vq-gpt", "--class", "3", "--sample"], "--sample: the image pairs"),
                          (["--pair", "mnist-vq-gpt", "--class", "3", "--prompt", "a three"], "--prompt: the image"),
                          (["--pair", "stdlib-bytes", "--prompt", "x", "--class", "3"], "--class: only for image AR")]:
        assert main(["generate", "--out", str(tmp_path), *args]) == 2, args
        assert message in capsys.readouterr().err, args
    with pytest.raises(SystemExit):
        main(["generate", "--pair", "mnist-vq-gpt", "--class", "12"])
    assert "--class" in capsys.readouterr().err
