"""SpecReason's limits (tested on tiny random models, steps cut at a separator the models write): a threshold
above 9 rejects every small step, so the text is the base model's own greedy generation (also with the base's
steps drafted by the small model); threshold 0 accepts every step, so it is the small model's. Scorers equal
their definitions computed from a plain forward."""

import pytest
import torch

from multispec.drafters import ModelDrafter
from multispec.reasoning import LogLikelihoodScorer, PromptScorer, SpecReason, SpecReasonConfig, Writer

from reasoning_models import frequent, greedy

BUDGET = 48


def _config(separator: int, threshold: float, **kw) -> SpecReasonConfig:
    return SpecReasonConfig(threshold=threshold, separator=chr(separator), max_step_tokens=9, token_budget=BUDGET,
                            markers=(), stop_on_repeat=False, **kw)


@pytest.mark.parametrize("base_drafter", [None, "small"], ids=["plain", "small-drafts-base-steps"])
def test_threshold_above_nine_gives_the_base_models_own_text(models, tok, prompt, base_drafter):
    base, small = models
    ref = greedy(base, prompt, BUDGET)
    sep = frequent(ref)
    sr = SpecReason(small, base, tok, "likelihood", _config(sep, 10.0),
                    base_drafter=ModelDrafter(small) if base_drafter else None, base_tree=3)
    out = sr.run(prompt)
    assert out.tokens == ref[: len(out.tokens)] and len(out.tokens) >= BUDGET - 1
    assert out.stop_reason == "budget"
    assert all(s.author == "base" and s.rejected is not None for s in out.steps)
    assert any(s.tokens[-1] == sep and len(s.tokens) < 9 for s in out.steps)  # steps cut at the separator
    assert out.counters["accepted"] == 0 and out.counters["rejected"] == len(out.steps)


@pytest.mark.parametrize("keep_agreed", [True, False])
def test_a_rejected_step_starts_with_the_draft_prefix_the_base_agrees_with(models, tok, prompt, keep_agreed):
    base, _ = models
    ref = greedy(base, prompt, BUDGET)
    # the base as its own small model: every step is rejected (threshold 10), yet the base agrees with all of it
    sr = SpecReason(base, base, tok, "likelihood", _config(frequent(ref), 10.0), keep_agreed=keep_agreed)
    out = sr.run(prompt)
    assert out.tokens == ref[: len(out.tokens)] and out.counters["rejected"] == len(out.steps)
    kept = out.counters["base_tokens_kept_from_drafts"]
    assert kept == (len(out.tokens) if keep_agreed else 0)
    assert out.counters["base_tokens_written"] == len(out.tokens) - kept


def test_kept_prefixes_never_split_a_multi_token_separator(models, tok, prompt):
    base, small = models
    ref = greedy(base, prompt, 96)
    pairs = [tuple(ref[i: i + 2]) for i in range(len(ref) - 1) if max(ref[i: i + 2]) < 128]
    sep = max(set(pairs), key=pairs.count)  # a two-token separator the base writes
    config = SpecReasonConfig(threshold=10.0, separator=chr(sep[0]) + chr(sep[1]), max_step_tokens=20,
                              token_budget=96, markers=(), stop_on_repeat=False)
    for drafter in (small, base):
        out = SpecReason(drafter, base, tok, "likelihood", config).run(prompt)
        assert out.tokens == ref[: len(out.tokens)]
        for step in out.steps[:-1]:  # each step ends at the first separator in it, or at max_step_tokens
            body = step.tokens[:-2] if tuple(step.tokens[-2:]) == sep else step.tokens
            assert all(tuple(body[i: i + 2]) != sep for i in range(len(body) - 1))
            assert tuple(step.tokens[-2:]) == sep or len(step.tokens) == 20
        assert any(tuple(step.tokens[-2:]) == sep for step in out.steps)


def test_threshold_zero_gives_the_small_models_own_text(models, tok, prompt):
    base, small = models
    ref = greedy(small, prompt, BUDGET)
    out = SpecReason(small, base, tok, "likelihood", _config(frequent(ref), 0.0)).run(prompt)
    assert out.tokens == ref[: len(out.tokens)] and len(out.tokens) >= BUDGET - 1
    assert all(s.author == "small" and s.score is not None for s in out.steps)
    assert out.rejected_steps == 0 and out.accepted_steps == len(out.steps)


def test_first_steps_are_the_base_models(models, tok, prompt):
    base, small = models
    ref = greedy(base, prompt, BUDGET)
    out = SpecReason(small, base, tok, "likelihood", _config(frequent(ref), 0.0, first_n_steps_base=2)).run(prompt)
    assert [s.author for s in out.steps[:3]] == ["base", "base", "small"]
    assert out.tokens[: len(out.steps[0].tokens)] == ref[: len(out.steps[0].tokens)]


def _forward(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("reduce", ["min_ratio", "min_prob", "mean"])
def test_likelihood_scorer_is_its_definition(models, prompt, reduce):
    base, _ = models
    step = [50, 61, 72, 83, 94]
    writer = Writer.open(base)
    writer.start(prompt)
    got = LogLikelihoodScorer(reduce).score(writer, step)
    logp = torch.log_softmax(_forward(base, prompt + step)[len(prompt) - 1: -1], -1)
    mine = logp.gather(1, torch.tensor(step)[:, None])[:, 0]
    expected = {"min_ratio": (mine - logp.max(-1).values).min().exp(), "min_prob": mine.min().exp(),
                "mean": mine.mean().exp()}[reduce]
    assert got == pytest.approx(9 * float(expected), rel=1e-4)
    assert writer.text == prompt + step  # the scored step stays in the base's session


@pytest.mark.parametrize("method", ["greedy", "expected"])
def test_prompt_scorer_reads_the_digit_tokens_after_the_judging_prompt(models, tok, prompt, method):
    base, _ = models
    step = [50, 61, 72]
    scorer = PromptScorer.plain(tok, method)
    writer = Writer.open(base)
    writer.start(prompt)
    got = scorer.score(writer, step)
    logits = _forward(base, prompt + step + scorer.suffix())[-1]
    assert got == pytest.approx(scorer.from_logits(logits), abs=1e-4)
    assert writer.text == prompt + step  # the judging prompt is not committed


def test_prompt_scores_on_known_logits(tok):
    scorer = PromptScorer.plain(tok, "greedy")
    logits = torch.zeros(256)
    logits[ord("7")] = 5.0
    assert scorer.from_logits(logits) == 7.0
    logits[ord("x")] = 9.0  # a non-digit argmax scores 0 (reject), as the reference does
    assert scorer.from_logits(logits) == 0.0
    flat = torch.zeros(256)
    assert PromptScorer.plain(tok, "expected").from_logits(flat) == pytest.approx(4.5)


def test_bad_arguments_name_themselves(models, tok):
    base, small = models
    from multispec.testing import make_target

    with pytest.raises(ValueError, match="small"):
        SpecReason(make_target("llama", vocab=128), base, tok)
    with pytest.raises(ValueError, match="max_step_tokens"):
        SpecReasonConfig(max_step_tokens=0)
    with pytest.raises(ValueError, match="scorer"):
        SpecReason(small, base, tok, scorer="vibes")
    with pytest.raises(ValueError, match="reduce"):
        LogLikelihoodScorer("max")
    with pytest.raises(ValueError, match="digits"):
        PromptScorer(lambda: [1], [1, 2, 3])


def _chat_tokenizer():
    """A character-level `PreTrainedTokenizerFast` with a chat template (built offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                          "{% if not loop.last %}</{{ m['role'] }}>\n{% endif %}{% endfor %}")
    return fast


def test_chat_prompt_scorer_appends_the_templates_judging_turn():
    from multispec.testing import make_target

    fast = _chat_tokenizer()
    model = make_target("llama", seed=13, vocab=len(fast), layers=2)
    steps = ["2 + 3 = 5."]
    scorer = PromptScorer.chat(fast, "What is 2 + 3?", lambda: "\n\n".join(steps), method="expected")
    suffix = "".join(fast.convert_ids_to_tokens(scorer.suffix()))
    expected = ("</assistant>\n<user>Evaluate the last reasoning step solely based on factual correctness and "
                "logical validity. Ignore style, phrasing, or overall usefulness—only judge whether the step is "
                "objectively correct and logically follows from prior steps. Assign a score from 0 to 9."
                "</user>\n<assistant><think>I think the quality score is: ")
    assert suffix == expected.replace("—", "<unk>")  # the character vocabulary has no dash
    before = fast.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"},
                                       {"role": "assistant", "content": "<think>2 + 3 = 5."}],
                                      tokenize=False, continue_final_message=True)
    ids = fast.encode(before, add_special_tokens=False)
    writer = Writer.open(model, eos_token_id=2)
    writer.start(ids[:-3])
    got = scorer.score(writer, ids[-3:])  # the step's last tokens are appended by the scorer
    with torch.no_grad():
        logits = model(torch.tensor([ids + scorer.suffix()])).logits[0, -1].float()
    assert got == pytest.approx(scorer.from_logits(logits), abs=1e-4)
