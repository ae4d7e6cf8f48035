"""`multispec train draft` for a Janus target saved to disk with its tokenizer: from text prompts, the target draws
its images guided, an EAGLE head learns the guided law at the image tokens and accepts more on held-out prompts
than the untrained head; the trained head drafts losslessly (guided greedy output equals Janus's own
`generate(generation_mode="image")`, a ragged batch); its embeddings follow the target's (text for the prompt
and the first root, image tokens after); a split batch (gradient accumulation) takes the steps of whole ones;
bad prompt files are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from multispec import speculative_generate
from multispec.cli import main
from multispec.prompt import Prompt
from multispec.drafters.eagle import EagleHead
from multispec.image_ar.janus_draft import (JanusEagleDrafter, janus_head, left_padded, prompt_ids, read_prompts,
                                            token_embeds)
from multispec.image_ar.targets import JanusImageTarget
from multispec.image_ar.testing import BOI, BOS, NUM_IMAGE_TOKENS, make_janus
from multispec.targets import GuidedTarget
from multispec.testing import save_checkpoint

SCALE = 3.0


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory):
    """A tiny random Janus with a word-level tokenizer, and 100 prompts of 1-4 random words (5 held out)."""
    folder = tmp_path_factory.mktemp("janus")
    save_checkpoint(folder / "janus", make_janus(seed=1))
    g = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(100):
        n = int(torch.randint(1, 5, (1,), generator=g))
        lines.append(" ".join(f"w{int(x)}" for x in torch.randint(7, 128, (n,), generator=g)))
    (folder / "prompts.txt").write_text("\n".join(lines) + "\n")
    return folder


def _train(folder, out, *extra):
    assert main(["train", "draft", "--target", str(folder / "janus"), "--data", str(folder / "prompts.txt"),
                 "--out", str(out), "--guidance-scale", str(SCALE), "--images-per-class", "4", "--batch-size", "8",
                 "--lr", "3e-3", "--warmup-steps", "5", "--threads", "2", *extra]) == 0
    return json.loads((out / "report.json").read_text()), json.loads((out / "history.json").read_text())


def _load(folder):
    from transformers import AutoTokenizer, JanusForConditionalGeneration

    model = JanusForConditionalGeneration.from_pretrained(folder / "janus").eval()
    JanusImageTarget(model)  # puts back the generation_kwargs transformers 5.24 drops on loading
    return model, AutoTokenizer.from_pretrained(folder / "janus")


@pytest.mark.slow
def test_a_trained_janus_head_accepts_more_and_drafts_losslessly(janus_folder, tmp_path):
    """400 steps on 95 prompts x 4 images: the held-out guided greedy accepted length went 1.0 -> 1.57 when
    written (a random model's image tokens hang on the prompt's words: 5 held-out prompts test generalisation)."""
    report, _ = _train(janus_folder, tmp_path / "head", "--steps", "400")
    assert report["finished"] and report["prompts"] == 95 and report["heldout_prompts"] == 5
    assert report["images"] == 380
    assert report["accepted_length"] > report["untrained_accepted_length"] + 0.3, report
    model, tokenizer = _load(janus_folder)
    prompts = [prompt_ids(tokenizer, model, p) for p in read_prompts(janus_folder / "prompts.txt")]
    ids, mask = left_padded([prompts[19], prompts[0]], 0, "cpu")  # one held out, one trained on
    drafter = JanusEagleDrafter(EagleHead.load(tmp_path / "head"), model)
    out = speculative_generate(GuidedTarget(model, SCALE), drafter, ids, attention_mask=mask,
                               max_new_tokens=NUM_IMAGE_TOKENS, tree=4)
    for r in range(2):
        alone = ids[r, mask[r].bool()][None]
        with torch.no_grad():
            want = model.generate(alone, attention_mask=torch.ones_like(alone), generation_mode="image",
                                  do_sample=False, guidance_scale=SCALE)
        assert torch.equal(out.sequences[r, -NUM_IMAGE_TOKENS:], want[0]), r
    assert out.stats.mean_accepted_length > 1.3, out.stats


def test_gradient_accumulation_takes_the_steps_of_whole_batches(janus_folder, tmp_path):
    _, whole = _train(janus_folder, tmp_path / "whole", "--steps", "4")
    _, split = _train(janus_folder, tmp_path / "split", "--steps", "4", "--grad-accum", "2")
    assert [h["total"] for h in split] == pytest.approx([h["total"] for h in whole], rel=1e-5)


def test_the_drafter_embeds_as_the_target_does(janus_folder, monkeypatch):
    """The prompt with the text table (in `start`), the first root too (the begin-of-image token), every later
    token with the image table: a drafter that embedded the root as an image token would fail here."""
    from multispec.image_ar import janus_draft

    model, tokenizer = _load(janus_folder)
    drafter = JanusEagleDrafter(janus_head(model), model)
    fused, calls = [], []
    real_fuse = drafter.head.fuse
    monkeypatch.setattr(drafter.head, "fuse", lambda embeds, feats: (fused.append(embeds.clone()),
                                                                     real_fuse(embeds, feats))[1])
    monkeypatch.setattr(janus_draft, "token_embeds", lambda m, ids, text: (calls.append(text),
                                                                            token_embeds(m, ids, text))[1])
    ids, mask = left_padded([prompt_ids(tokenizer, model, "w9 w10")], 0, "cpu")
    assert ids[0, 0] == BOS and ids[0, -1] == BOI
    speculative_generate(GuidedTarget(model, SCALE), drafter, ids, attention_mask=mask, max_new_tokens=6, tree=2)
    text = model.get_input_embeddings()
    with torch.no_grad():
        assert torch.equal(fused[0], text(ids[:, 1:]))  # start: the prompt after BOS, as text
        assert torch.equal(fused[1][:, :1], text(ids[:, -1:]))  # the first root, BOI, as text
        assert not torch.equal(fused[1][:, :1], token_embeds(model, ids[:, -1:], 0))
    assert calls[0] == 1 and len(calls) > 2 and set(calls[1:]) == {0}  # later: image tokens only


def test_prompt_files_are_read_and_bad_ones_refused_by_name(tmp_path, janus_folder):
    (tmp_path / "p.jsonl").write_text('{"prompt": "w9 w10"}\n{"text": "w11"}\n')
    assert read_prompts(tmp_path / "p.jsonl") == ["w9 w10", "w11"]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "w9"}\n{"caption": "w11"}\n')
    with pytest.raises(ValueError, match=r"--data: .*bad.jsonl:2: expected a 'prompt' or 'text' field"):
        read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="--data: .* holds no prompt"):
        read_prompts(tmp_path / "empty.txt")
    model, tokenizer = _load(janus_folder)
    assert prompt_ids(tokenizer, model, "w9 w10") == [BOS, 9, 10, BOI]
    model.generation_config.generation_kwargs = {}
    with pytest.raises(ValueError, match="--target: .*boi_token_id"):
        prompt_ids(tokenizer, model, "w9")


def test_a_janus_loaded_from_a_folder_gets_back_its_generation_kwargs(janus_folder):
    """transformers 5.24 drops `generation_kwargs` (Janus's `boi_token_id`) when it loads a checkpoint; the target
    adapter reads them back from the folder, so guidance builds its unconditional prompt; a model without them and
    without a folder is refused by name."""
    from transformers import JanusForConditionalGeneration

    model = JanusForConditionalGeneration.from_pretrained(janus_folder / "janus").eval()
    model.generation_config.generation_kwargs = {}  # as 5.24 leaves it (older releases kept it)
    target = JanusImageTarget(model)
    assert model.generation_config.generation_kwargs["boi_token_id"] == BOI
    ids = torch.tensor([[BOS, 9, 10, BOI]])
    assert target.unconditional_prompt(Prompt(ids, torch.ones_like(ids), {})).input_ids[0].tolist() == [
        BOS, model.generation_config.pad_token_id, model.generation_config.pad_token_id, BOI]
    bare = make_janus(seed=1)
    bare.generation_config.generation_kwargs = {}
    with pytest.raises(ValueError, match="guidance_scale: .*generation_kwargs"):
        JanusImageTarget(bare).unconditional_prompt(Prompt(ids, torch.ones_like(ids), {}))
