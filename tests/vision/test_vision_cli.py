"""The vision commands end to end: `multispec eval vqa` on the shipped procedural sets (every layout) with
the zoo VLM and its three drafters, `multispec bench vision --quick`, `multispec train vision-draft` on a
user checkpoint, malformed files refused with the line or record named, and the zoo pair's losslessness."""

import json

import pytest
import torch

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.cli import main
from multispec.vision.cli import SHIPPED
from multispec.vision.vqa_data import read_vqa

@pytest.fixture(scope="module")
def pair():
    from multispec.vision.zoo_pair import load_drafters

    p = zoo.load("vqa-llava")
    return p.target, p.tokenizer, load_drafters(p.target)


def test_shipped_sets_hold_the_same_questions_in_every_layout():
    found = {}
    for layout in ("vqav2", "textvqa", "docvqa", "chartqa", "jsonl"):
        files = [p for p in (SHIPPED / layout).iterdir() if p.suffix in (".json", ".jsonl")
                 and "annotations" not in p.name]
        assert len(files) == 1, (layout, files)
        records = read_vqa(files[0])
        assert all(r.image is not None for r in records)
        found[layout] = [(r.question, r.answers[0]) for r in records]
    first = found.pop("jsonl")
    assert len(first) >= 40
    for layout, got in found.items():
        assert got == first, layout


@pytest.mark.parametrize("layout", ["jsonl", "vqav2"])
def test_eval_vqa_on_the_shipped_set(tmp_path, layout):
    data = next(p for p in (SHIPPED / layout).iterdir() if p.suffix in (".json", ".jsonl")
                and "annotations" not in p.name)
    out = tmp_path / "eval.json"
    assert main(["eval", "vqa", "--data", str(data), "--limit", "6", "--max-new-tokens", "24",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["outputs_identical"] is True
    rows = res["table"]["methods"]
    assert {"plain", "eagle_chain_k8", "vispec_dynamic_tree", "specvlm_chain_k8"} <= set(rows)
    for name, r in rows.items():
        q = r["quality"]
        assert 0.0 <= q["vqa_accuracy"] <= 1.0 and 0.0 <= q["anls"] <= 1.0
        assert q["vqa_accuracy"] == rows["plain"]["quality"]["vqa_accuracy"]  # lossless: the same answers
        if name != "plain":
            assert r["outputs"] == {"identical": 6}
    assert rows["plain"]["quality"]["vqa_accuracy"] > 0.3  # the zoo VLM reads its own kind of image


def test_eval_vqa_rejects_a_malformed_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q?", "image": "a.png", "answers": ["1"]}\n{"question": "oops"\n')
    assert main(["eval", "vqa", "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and str(bad) in err


def test_zoo_pair_is_lossless_batched_and_its_drafters_are_accepted(pair):
    model, processor, drafters = pair
    from multispec.vision.bench import bench_items
    from multispec.vision.zoo_vlm import EOS, PAD

    items = [i for i in bench_items(12) if not i.short][:3]
    inputs = processor([i.image for i in items], [i.question for i in items])
    n = 40
    for name, drafter in drafters.items():
        out = speculative_generate(model, drafter, max_new_tokens=n, tree=4, **inputs,
                                   stopping=StoppingConfig(eos_token_id=EOS, pad_token_id=PAD))
        for r, item in enumerate(items):
            alone = processor(item.image, item.question)
            with torch.no_grad():
                want = model.generate(**alone, max_new_tokens=n, do_sample=False, eos_token_id=EOS,
                                      pad_token_id=PAD)[0, alone["input_ids"].shape[1]:]
            got = out.sequences[r, inputs["input_ids"].shape[1]:][:len(want)]
            assert torch.equal(got, want), (name, r)
        assert out.stats.mean_accepted_length > 2.0, (name, out.stats)


def test_bench_vision_quick(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "vision", "--quick", "--max-new-tokens", "16", "--chain-k", "2,4", "--rounds", "2",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["schema"] == "multispec.bench/1" and res["benchmark"] == "vision"
    assert res["outputs_identical"] is True and res["settings"]["chain_k"] == [2, 4]
    table = res["tables"]["greedy"]
    assert table["rounds"] == 2 and table["round_inputs"] == "partition" and sum(table["inputs_per_round"]) == 8
    rows = table["methods"]
    for name in ("plain", "eagle_chain_k2", "eagle_chain_k4", "eagle_dynamic_tree", "vispec_chain_k4",
                 "vispec_dynamic_tree", "specvlm_chain_k2", "specvlm_dynamic_tree", "hf_assisted_small_vlm",
                 "small_vlm_chain_k2", "small_vlm_chain_k4"):
        r = rows[name]
        assert r["tokens_per_s"] > 0 and len(r["speedup_rounds"]) == 2
        assert r["speedup_spread"][0] <= r["speedup"] <= r["speedup_spread"][1]
    assert 0.0 <= res["vqa_accuracy"] <= 1.0
    # the SpecVLM gate's choice per question is recorded, and it never means "no image"
    gate = res["specvlm_gate_choices"]
    assert sum(gate.values()) == 8 and set(gate) <= {"prune", "pool", "conv", "resampler"}
    assert res["mean_accepted_length_definition"].startswith("tokens committed per target forward")


def test_bench_vision_rejects_bad_chain_lengths(capsys):
    from multispec.vision.evaluate import chain_lengths

    for bad in ("0,4", "four"):
        with pytest.raises(SystemExit):
            main(["bench", "vision", "--chain-k", bad])
        assert "--chain-k" in capsys.readouterr().err
    with pytest.raises(ValueError, match="chain_k"):
        chain_lengths(())
    assert chain_lengths(4) == (4,) and chain_lengths([4, 8]) == (4, 8)


def test_train_vision_draft_on_a_user_checkpoint(tmp_path):
    from transformers import LlavaForConditionalGeneration

    from multispec.vision import VisionEagleDrafter, VisionEagleHead
    from multispec.vision.zoo_vlm import vlm_config

    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(vlm_config(layers=1, hidden=64)).eval()
    model.save_pretrained(tmp_path / "vlm")
    data = SHIPPED / "jsonl" / "questions.jsonl"
    out = tmp_path / "draft"
    args = ["train", "draft", "--target", str(tmp_path / "vlm"), "--data", str(data), "--out", str(out),
            "--kind", "specvlm", "--steps", "4", "--batch-size", "2", "--limit", "4", "--max-new-tokens", "8"]
    assert main(args) == 0
    head = VisionEagleHead.load(out)
    assert head.vision.mode == "specvlm" and head.vision.branches == ("prune", "pool", "conv", "resampler")
    VisionEagleDrafter(head, model)  # fits the checkpoint it was trained for
    assert main(args) == 0  # a finished run found in --out is resumed (nothing left to do) and saved again
    for option, bad in (("--ratio", "2"), ("--branches", "pool,magic"), ("--branches", "pool,pool")):
        with pytest.raises(SystemExit):  # refused by argparse, before any model loads
            main([*args[:-2], option, bad])


def _char_tokenizer(bos: str, eos: str):
    """(vocabulary, a character-level fast tokenizer built offline): pad, BOS, EOS, the image token, unknown,
    then printable ASCII."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", bos, eos, "<image>", "<unk>"] + [chr(c) for c in range(32, 127)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return words, PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token=bos, eos_token=eos,
                                          unk_token="<unk>", additional_special_tokens=["<image>"])


def _checkpoint_with_processor(folder):
    """A tiny Llava saved with its own `LlavaProcessor` (a character-level tokenizer built offline, a SigLIP
    image processor): the layout of a user's checkpoint."""
    from transformers import (LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor,
                              SiglipImageProcessor, SiglipVisionConfig)

    words, fast = _char_tokenizer("<s>", "</s>")
    processor = LlavaProcessor(image_processor=SiglipImageProcessor(size={"height": 32, "width": 32}),
                               tokenizer=fast, patch_size=8, vision_feature_select_strategy="full",
                               image_token="<image>", num_additional_image_tokens=0)
    torch.manual_seed(0)
    text = LlamaConfig(vocab_size=len(words), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                       tie_word_embeddings=False)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    model = LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_id=3,
                                                      vision_feature_select_strategy="full",
                                                      tie_word_embeddings=False)).eval()
    with torch.no_grad():  # answers stay text: no special token (EOS, image) can win the argmax
        model.lm_head.weight[:5] = 0
        model.lm_head.weight.mul_(8)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)


def _paligemma_checkpoint_with_processor(folder):
    """A tiny PaliGemma 2 (Gemma 2 text, SigLIP tower) saved with its own `PaliGemmaProcessor` (a
    character-level tokenizer built offline): the processor writes the prefix and its `token_type_ids`."""
    from transformers import (Gemma2Config, PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor,
                              SiglipImageProcessor, SiglipVisionConfig)

    words, fast = _char_tokenizer("<bos>", "<eos>")
    images = SiglipImageProcessor(size={"height": 32, "width": 32})
    images.image_seq_length = 16
    torch.manual_seed(0)
    text = Gemma2Config(vocab_size=len(words), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=2, head_dim=32, bos_token_id=1, eos_token_id=2,
                        pad_token_id=0, tie_word_embeddings=False)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8, projection_dim=64)
    model = PaliGemmaForConditionalGeneration(PaliGemmaConfig(vision_config=vision, text_config=text,
                                                              image_token_index=3, projection_dim=64,
                                                              tie_word_embeddings=False)).eval()
    with torch.no_grad():  # answers stay text: no special token (EOS, image) can win the argmax
        model.lm_head.weight[:5] = 0
        model.lm_head.weight.mul_(8)
    model.save_pretrained(folder)
    PaliGemmaProcessor(image_processor=images, tokenizer=fast).save_pretrained(folder)


@pytest.mark.parametrize("make,mode", [(_checkpoint_with_processor, "vispec"),
                                       (_paligemma_checkpoint_with_processor, "specvlm")], ids=["llava", "paligemma"])
def test_train_and_eval_with_a_checkpoints_own_processor(tmp_path, make, mode):
    """`train vision-draft` and `eval vqa` on a checkpoint that brings its own processor (AutoProcessor): a
    Llava, and a PaliGemma (a prefix LM whose answers the teacher reads as suffix, type 1)."""
    make(tmp_path / "vlm")
    data = SHIPPED / "jsonl" / "questions.jsonl"
    draft = tmp_path / "draft"
    assert main(["train", "draft", "--target", str(tmp_path / "vlm"), "--data", str(data), "--out",
                 str(draft), "--kind", mode, "--steps", "3", "--batch-size", "2", "--limit", "4",
                 "--max-new-tokens", "8"]) == 0
    out = tmp_path / "eval.json"
    assert main(["eval", "vqa", "--data", str(data), "--target", str(tmp_path / "vlm"), "--draft", str(draft),
                 "--limit", "3", "--max-new-tokens", "8", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["outputs_identical"] is True
    assert {"plain", "draft_chain_k8", "draft_dynamic_tree"} <= set(res["table"]["methods"])
    assert all(len(p) > 0 for p in res["predictions"]["plain"])  # decoded by the checkpoint's tokenizer


def test_bench_items_splits_and_answer_kinds():
    from multispec.bench.options import BenchOptions
    from multispec.vision.bench import SPLITS, bench_items, run

    test, validation = (bench_items(8, SPLITS[s]) for s in ("test", "validation"))
    assert not {i.image.tobytes() for i in test} & {i.image.tobytes() for i in validation}  # other images
    assert any(i.short for i in test) and any(not i.short for i in test)
    long = bench_items(8, SPLITS["test"], "long")
    short = bench_items(8, SPLITS["test"], "short")
    assert len(long) == len(short) == 8 and not any(i.short for i in long) and all(i.short for i in short)
    # the long questions of the plain split come first, in order, in the long-only list
    assert [i.question for i in test if not i.short] == [i.question for i in long][:sum(not i.short for i in test)]
    with pytest.raises(ValueError, match="answers"):
        bench_items(8, answers="medium")
    with pytest.raises(ValueError, match="split"):
        run(BenchOptions(split="train"))


@pytest.mark.slow
def test_train_draft_for_a_vlm_accepts_more_than_the_untrained_drafter(tmp_path):
    """`multispec train draft --kind vispec` on a tiny random Llava saved to disk: the accepted length on the
    held-out question rises from the untrained head's (1.0 when written) to 2.4, and the trained head drafts
    losslessly."""
    from transformers import LlavaForConditionalGeneration

    from multispec.vision import VisionEagleDrafter, VisionEagleHead
    from multispec.vision.vqa_synth import generate_vqa
    from multispec.vision.zoo_vlm import EOS, PAD, VQAProcessor, vlm_config

    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(vlm_config(layers=1, hidden=64)).eval()
    model.save_pretrained(tmp_path / "vlm")
    out = tmp_path / "draft"
    assert main(["train", "draft", "--target", str(tmp_path / "vlm"), "--data", str(SHIPPED / "jsonl" / "questions.jsonl"),
                 "--out", str(out), "--kind", "vispec", "--steps", "150", "--batch-size", "8", "--lr", "3e-3",
                 "--limit", "24", "--max-new-tokens", "24"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["heldout_questions"] == 1 and report["questions"] == 23
    assert report["accepted_length"] > report["untrained_accepted_length"] + 0.5, report
    sample = generate_vqa(1, seed=9)[0]
    inputs = VQAProcessor()(sample.image, sample.question)
    drafter = VisionEagleDrafter(VisionEagleHead.load(out), model)
    got = speculative_generate(model, drafter, max_new_tokens=16, tree=4,
                               stopping=StoppingConfig(eos_token_id=EOS, pad_token_id=PAD), **inputs)
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=16, do_sample=False, eos_token_id=EOS, pad_token_id=PAD)
    assert torch.equal(got.sequences[0, : want.shape[1]], want[0])
