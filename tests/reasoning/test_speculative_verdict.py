"""Speculative Verdict: the consensus score is the reference's formula on a hand-made matrix; top-k keeps the
lowest, ties broken by the seed; a run on tiny random experts scores every answer under every expert and hands
the chosen experts' reasoning to the verdict."""

import math

import pytest
import torch

from multispec.reasoning import (LikelihoodVerdict, PromptVerdict, SpeculativeVerdict, TextExpert, consensus_scores,
                                 top_k)
from multispec.reasoning.speculative_verdict import ExpertAnswer
from multispec.testing import make_target


def test_consensus_is_the_sum_of_absolute_log_ppl_gaps():
    # cross[a][b] = log PPL_b(y_a)
    cross = {"a": {"a": 1.0, "b": 2.0, "c": 3.0},
             "b": {"a": 1.5, "b": 1.0, "c": 2.5},
             "c": {"a": 4.0, "b": 4.0, "c": 1.0}}
    got = consensus_scores(cross)
    assert got["a"] == pytest.approx(abs(2.0 - 1.0) + abs(3.0 - 1.0))
    assert got["b"] == pytest.approx(abs(1.5 - 1.0) + abs(2.5 - 1.0))
    assert got["c"] == pytest.approx(abs(4.0 - 1.0) + abs(4.0 - 1.0))
    assert top_k(got, 2) == ["b", "a"]


def test_ties_are_broken_by_the_seed():
    scores = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.5}
    picks = {tuple(top_k(scores, 2, seed=s)) for s in range(20)}
    assert all(p[0] == "d" for p in picks) and len(picks) > 1  # d always first, the tie drawn at random
    assert top_k(scores, 2, seed=3) == top_k(scores, 2, seed=3)


class Tok:
    eos_token_id = 2

    def encode(self, text):
        return [min(ord(c), 255) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i > 2)


def test_a_run_scores_every_answer_under_every_expert(monkeypatch):
    tok = Tok()
    experts = {f"e{i}": TextExpert(make_target("llama", seed=20 + i, vocab=256, layers=1), tok, max_new_tokens=8)
               for i in range(3)}
    verdict = LikelihoodVerdict(TextExpert(make_target("llama", seed=30, vocab=256, layers=2), tok, max_new_tokens=8))
    out = SpeculativeVerdict(experts, verdict, k=2).run("What is 2 + 3?")
    for a in experts:
        for b, expert in experts.items():
            assert out.cross_log_ppl[a][b] == pytest.approx(expert.log_ppl("What is 2 + 3?", out.answers[a].text))
    assert out.chosen == top_k(out.consensus, 2)
    best = max(out.chosen, key=lambda n: -verdict.expert.log_ppl("What is 2 + 3?", out.answers[n].text))
    assert out.text == out.answers[best].text and len(out.chosen) == 2


def test_log_ppl_is_the_mean_negative_log_likelihood():
    tok = Tok()
    model = make_target("llama", seed=40, vocab=256, layers=1)
    expert = TextExpert(model, tok, prompt=lambda q: f"Q: {q}\nA:")
    context, span = tok.encode("Q: hi\nA:"), tok.encode(" 42")
    with torch.no_grad():
        logits = model(torch.tensor([context + span])).logits[0, len(context) - 1: -1]
    nll = -torch.log_softmax(logits, -1).gather(1, torch.tensor(span)[:, None]).mean()
    assert expert.log_ppl("hi", " 42") == pytest.approx(float(nll), rel=1e-5)


def test_prompt_verdict_lays_out_the_experts_and_reads_the_boxed_answer():
    tok = Tok()
    v = PromptVerdict(make_target("llama", seed=41, vocab=256, layers=1), tok)
    answers = {"x": ExpertAnswer("12 + 30 = 42", 42.0), "y": ExpertAnswer("12 + 30 = 52", 52.0)}
    text = v.prompt("What is 12 + 30?", {"x": "12 + 30 = 42", "y": "12 + 30 = 52"}, answers)
    assert "--- Model 1 (x) ---\nReasoning:\n12 + 30 = 42\nProposed Answer: 42" in text
    assert "--- Model 2 (y) ---" in text and text.endswith("enclosed within \\boxed{}.")
    from multispec.reasoning import extract_answer

    assert extract_answer("so it is \\boxed{42}.") == 42


def test_bad_arguments_name_themselves():
    tok = Tok()
    one = {"a": TextExpert(make_target("llama", vocab=256, layers=1), tok)}
    with pytest.raises(ValueError, match="experts"):
        SpeculativeVerdict(one, None)
    with pytest.raises(ValueError, match="k"):
        SpeculativeVerdict(one | {"b": one["a"]}, None, k=3)


def test_vision_experts_answer_image_questions_through_multispec_vision():
    """The zoo VLM and its small assistant as experts on a procedural chart question; the VLM decides."""
    from multispec.vision.vqa_synth import generate_vqa
    from multispec.vision.zoo_pair import NAME, load_assistant
    from multispec.vision.zoo_vlm import VQAProcessor, load_vlm
    from multispec import zoo

    from multispec.reasoning import VisionExpert

    target = load_vlm(zoo.path(NAME) / "target")
    assistant = load_assistant()
    sample = generate_vqa(1, seed=3, long_fraction=0.0)[0]
    experts = {"vlm": VisionExpert(target, VQAProcessor(), 16), "assistant": VisionExpert(assistant, VQAProcessor(), 16)}
    out = SpeculativeVerdict(experts, LikelihoodVerdict(experts["vlm"]), k=2).run(sample.question, sample.image)
    for a in experts:
        for b, e in experts.items():
            assert out.cross_log_ppl[a][b] == pytest.approx(e.log_ppl(sample.question, out.answers[a].text, sample.image))
    assert out.answer in {e.answer for e in out.answers.values()} and set(out.chosen) == set(experts)
    with pytest.raises(ValueError, match="image"):
        experts["vlm"].answer(sample.question)
