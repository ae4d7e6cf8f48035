"""`multispec generate --pair vqa-llava --image PATH --prompt QUESTION`: the zoo VLM's answer streamed as the
drafter's tokens are verified, equal to the model's own `generate` with drafts accepted; a bad image is named
before any model loads."""

import json

import pytest

from multispec import zoo
from multispec.cli import main
from multispec.vision.vqa_synth import generate_vqa


def test_the_zoo_vlm_answers_about_an_image_as_its_own_generate_does(tmp_path, capsys):
    sample = generate_vqa(1, seed=3, kinds=("bar",), long_fraction=1.0)[0]
    sample.image.save(tmp_path / "chart.png")
    out = tmp_path / "answer.json"
    assert main(["generate", "--pair", "vqa-llava", "--image", str(tmp_path / "chart.png"), "--prompt",
                 sample.question, "--vlm-drafter", "specvlm", "--max-new-tokens", "48", "--compare",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    payload = json.loads(out.read_text())
    record = payload["records"][0]
    assert payload["drafter"] == "specvlm" and payload["tree"] == "8"
    assert printed.startswith(sample.question + "\n" + record["text"] + "\n")  # streamed as committed
    assert record["identical_to_plain"] is True and record["new_tokens"] > 8
    assert record["mean_accepted_length"] > 1.5  # drafts accepted: speculation, not plain decoding


def test_a_bad_image_is_named_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(zoo, "load", lambda *a, **k: pytest.fail("a model loaded before the check"))
    (tmp_path / "notes.txt").write_text("not an image")
    for args, message in [([], "--image: vqa-llava answers questions about an image"),
                          (["--image", str(tmp_path / "missing.png")], "is not a file"),
                          (["--image", str(tmp_path / "notes.txt")], "notes.txt is not an image"),
                          (["--image", str(tmp_path / "notes.txt"), "--method", "judge"],
                           "--method: only for reasoning pairs")]:
        assert main(["generate", "--pair", "vqa-llava", "--prompt", "What is shown?", *args]) == 2, args
        assert message in capsys.readouterr().err, args
