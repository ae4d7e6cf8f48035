"""`multispec train draft` for a class-conditional image GPT saved to disk: the head distilled at the guidance
scale it drafts under accepts more than the untrained head, and drafts losslessly (guided greedy)."""

import json

import pytest
import torch

from multispec import SamplingConfig
from multispec.cli import main
from multispec.image_ar.generate import generate_ar, generate_images
from multispec.image_ar.testing import make_image_gpt
from multispec.image_ar.train_draft import read_labels
from multispec.drafters.eagle import EagleDrafter, EagleHead


def test_read_labels_names_the_argument_on_bad_input(tmp_path):
    (tmp_path / "ok.txt").write_text("0, 1\n3")
    assert read_labels(tmp_path / "ok.txt", 4) == [0, 1, 3]
    (tmp_path / "ok.json").write_text("[2, 2]")
    assert read_labels(tmp_path / "ok.json", 4) == [2, 2]
    (tmp_path / "big.txt").write_text("0 9")
    with pytest.raises(ValueError, match=r"--data: expected class labels in \[0, 4\), got \[9\]"):
        read_labels(tmp_path / "big.txt", 4)
    (tmp_path / "words.txt").write_text("cat dog")
    with pytest.raises(ValueError, match="--data: .* must hold class labels"):
        read_labels(tmp_path / "words.txt", 4)
    with pytest.raises(FileNotFoundError, match="--data"):
        read_labels(tmp_path / "missing.txt", 4)


def test_train_draft_for_an_image_gpt_accepts_more_than_the_untrained_head(tmp_path):
    """A tiny random GPT (32 codes, 4x4 grid) saved to disk; 128 images it drew at scale 2; 400 steps: the held-out
    guided greedy accepted length went 1.02 -> 3.37 when written."""
    model = make_image_gpt(seed=3, codebook_size=32, grid_size=4)
    model.save_pretrained(tmp_path / "gpt")
    (tmp_path / "labels.txt").write_text("0 1 2 3")
    out = tmp_path / "draft"
    assert main(["train", "draft", "--target", str(tmp_path / "gpt"), "--data", str(tmp_path / "labels.txt"),
                 "--out", str(out), "--guidance-scale", "2", "--images-per-class", "32", "--steps", "400",
                 "--batch-size", "16", "--lr", "3e-3", "--warmup-steps", "10"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["finished"] and report["images"] == 128 and report["guidance_scale"] == 2.0
    assert report["accepted_length"] > report["untrained_accepted_length"] + 1.0, report
    # the saved head drafts losslessly: guided greedy codes equal plain guided greedy AR
    drafter = EagleDrafter(EagleHead.load(out).eval(), model)
    labels = [0, 1, 2, 3]
    got = generate_images(model, labels, drafter=drafter, tree=4, guidance_scale=2.0, sampling=SamplingConfig())
    want = generate_ar(model, labels, guidance_scale=2.0, sampling=SamplingConfig())
    assert torch.equal(got.codes, want.codes)
    assert got.stats.mean_accepted_length > 1.5


def test_train_draft_refuses_text_options_for_an_image_gpt(tmp_path, capsys):
    make_image_gpt().save_pretrained(tmp_path / "gpt")
    (tmp_path / "labels.txt").write_text("0 1")
    code = main(["train", "draft", "--target", str(tmp_path / "gpt"), "--data", str(tmp_path / "labels.txt"),
                 "--out", str(tmp_path / "o"), "--seq-len", "64"])
    assert code != 0
    assert "--seq-len: not an option for this target (image generator)" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
