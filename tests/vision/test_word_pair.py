"""The word-level VLM pair's pieces: its processor (the generator's language in, exactly out; 256 image tokens),
training rows in words, its staged recipe in the quick form, and the data-level image-reliance measure."""

import json

import pytest

from multispec import StoppingConfig, zoo
from multispec.cli import main

from multispec.vision.answer_change import answer_change, first_change, lcs_length, text_change
from multispec.vision.vqa_synth import generate_vqa
from multispec.vision.word_vqa import SPECIALS, WordVQAProcessor
from multispec.vision.zoo_vlm import VQAProcessor, training_batch, vlm_config


def test_every_generated_text_is_in_the_vocabulary_and_decodes_exactly():
    """A word the generator starts using would become <unk>: scan questions and answers of every style."""
    p = WordVQAProcessor()
    for s in generate_vqa(400, seed=3, long_fraction=0.5):
        for text in (s.question, s.answer):
            ids = p.encode(text)
            assert p.unk_token_id not in ids, (text, [t for t in p.tokens(text) if t not in p.ids])
            assert p.decode(ids) == text
    assert len(set(p.vocab)) == p.vocab_size  # no word twice


def test_words_are_single_tokens_and_unknown_text_is_unk():
    p = WordVQAProcessor()
    assert p.encode("A bar chart with 5 bars: blue 1, orange 13.") == [
        p.ids[w] for w in ["A", "bar", "chart", "with", "5", "bars", ":", "blue", "1", ",", "orange", "13", "."]]
    assert p.encode("zebra") == [p.unk_token_id] and p.decode([p.unk_token_id]) == "<unk>"
    assert p.decode([p.bos_token_id, p.ids["red"], p.eos_token_id]) == "red"  # specials skipped
    with pytest.raises(ValueError, match="ids: .*outside"):
        p.decode([p.vocab_size])


def test_prompt_has_256_image_tokens_and_the_tower_reads_4x4_patches():
    p = WordVQAProcessor()
    samples = generate_vqa(2, seed=1)
    batch = p([s.image for s in samples], [s.question for s in samples])
    row = batch["input_ids"][1][batch["attention_mask"][1].bool()].tolist()
    assert row[0] == p.bos_token_id and row[1:257] == [p.image_token_id] * 256 and p.image_token_id not in row[257:]
    assert p.decode(row) == f"Q: {samples[1].question} A:"
    config = vlm_config(2, 64, p)
    patches = (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    assert patches == 256 == p.num_image_tokens
    assert config.text_config.vocab_size == p.vocab_size and config.image_token_id == p.image_token_id
    assert VQAProcessor().num_image_tokens == 64  # the byte pair's layout is unchanged


def test_training_rows_label_the_answer_words_and_eos_only():
    p = WordVQAProcessor()
    s = generate_vqa(1, seed=2)[0]
    batch = training_batch([s], p)
    labels = batch["labels"][0]
    answer = p.encode(s.answer) + [p.eos_token_id]
    assert labels[labels != -100].tolist() == answer
    assert batch["input_ids"][0, -len(answer):].tolist() == answer
    assert len(SPECIALS) == 5 and p.pad_token_id == 0


def test_the_quick_word_pair_trains_in_stages_and_benches(tmp_path):
    from multispec.vision.zoo_vlm import load_vlm
    from multispec.vision.zoo_words import STAGES, train_stages

    with pytest.raises(ValueError, match="until"):
        train_stages(tmp_path, until="eagle")
    report = train_stages(tmp_path, until="target", quick=True)
    assert set(report) == {"tower", "target"} and report["target"]["processor"] == "WordVQAProcessor"
    assert not (tmp_path / "assistant").exists()  # stopped where asked
    target = load_vlm(tmp_path / "target")
    assert target.config.text_config.vocab_size == WordVQAProcessor.vocab_size
    report = train_stages(tmp_path, quick=True)  # resumes: the tower and target are read back, not retrained
    assert {"tower", "target", "assistant", "eagle", "vispec", "specvlm"} <= set(report)
    assert STAGES[-1] == "drafters" and (tmp_path / "pair_report.json").exists()
    # `bench vision --pair` runs it with its own processor's ids (EOS, pad): every output equals plain decoding
    out = tmp_path / "bench.json"
    assert main(["bench", "vision", "--pair", "vqa-words-llava", "--weights", str(tmp_path), "--quick",
                 "--max-new-tokens", "8", "--chain-k", "2", "--rounds", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["pair"] == "vqa-words-llava" and res["outputs_identical"] is True
    assert {"eagle_chain_k2", "vispec_chain_k2", "specvlm_chain_k2", "hf_assisted_small_vlm"} <= set(
        res["tables"]["greedy"]["methods"])
    with pytest.raises(FileNotFoundError, match="zoo train vqa-words-llava"):
        zoo.load("vqa-words-llava", tmp_path / "empty")


def test_answer_change_counts_by_hand():
    assert lcs_length(list("abcde"), list("axcye")) == 3 and lcs_length([], [1]) == 0
    assert first_change([1, 2, 3], [1, 2, 4]) == 2 and first_change([1, 2], [1, 2, 3]) == 2
    # words: "red" vs "blue" is one changed token of three; bytes: "red 1 ." vs "blue 1 ." keeps "e 1 ."
    pairs = [("red 1 .", "blue 1 .")]
    assert text_change(pairs, WordVQAProcessor().encode) == {"tokens_per_answer": 3.0, "changed": round(1 / 3, 4),
                                                             "before_first_change": 0.0}
    assert text_change(pairs, VQAProcessor().encode)["changed"] == round(2 / 7, 4)  # r, d of "red 1 ."
    with pytest.raises(ValueError, match="pairs"):
        answer_change([])


def test_the_shipped_word_pair_is_lossless_and_its_three_drafters_are_accepted():
    """The shipped `vqa-words-llava` (int8 target, int8 heads): every drafter's chain equals the target's own
    greedy `generate` on long answers, batched, and accepts several words a step."""
    import torch

    from multispec import speculative_generate
    from multispec.vision.bench import bench_items
    from multispec.vision.zoo_pair import load_drafters

    pair = zoo.load("vqa-words-llava")
    model, processor = pair.target, pair.tokenizer
    assert processor.num_image_tokens == 256
    items = bench_items(2, answers="long")
    inputs = processor([i.image for i in items], [i.question for i in items])
    ids = dict(eos_token_id=processor.eos_token_id, pad_token_id=processor.pad_token_id)
    n = 32
    wants = []
    for item in items:
        alone = processor(item.image, item.question)
        with torch.no_grad():
            full = model.generate(**alone, max_new_tokens=n, do_sample=False, **ids)
        wants.append(full[0, alone["input_ids"].shape[1]:])
    for name, drafter in load_drafters(model, zoo.path("vqa-words-llava")).items():
        out = speculative_generate(model, drafter, max_new_tokens=n, tree=8, stopping=StoppingConfig(**ids), **inputs)
        for r, want in enumerate(wants):
            assert torch.equal(out.sequences[r, inputs["input_ids"].shape[1]:][:len(want)], want), (name, r)
        assert out.stats.mean_accepted_length > 3.0, (name, out.stats)
