"""Speculative Thinking's limits on tiny random models: a trigger that never fires leaves the small model's own
greedy text (its look-aheads kept, not rewritten); one that always fires, with the large model beginning and
writing up to each delimiter, gives the large model's own text. The keyword rule, the verify extension and the
recap counters do what the reference does."""

import pytest

from multispec.reasoning import SpeculativeThinking, SpeculativeThinkingConfig, Triggers

from reasoning_models import frequent, greedy

BUDGET = 60


def _config(sep: int, triggers: Triggers, **kw) -> SpeculativeThinkingConfig:
    return SpeculativeThinkingConfig(**(dict(separator=chr(sep), triggers=triggers, lookahead_tokens=5,
                                             token_budget=BUDGET, markers=(), stop_on_repeat=False) | kw))


def test_no_trigger_gives_the_small_models_own_text(models, tok, prompt):
    base, small = models
    ref = greedy(small, prompt, BUDGET)
    out = SpeculativeThinking(small, base, tok, _config(frequent(ref), Triggers.never())).run(prompt)
    assert out.tokens == ref[: len(out.tokens)] and len(out.tokens) >= BUDGET - 1
    assert out.counters["triggers"] == 0 and out.counters["lookaheads_kept"] > 0
    assert out.counters["large_tokens_written"] == 0
    assert {s.kind for s in out.steps} == {"paragraph", "lookahead"}


def test_every_trigger_firing_gives_the_large_models_own_text(models, tok, prompt):
    base, small = models
    ref = greedy(base, prompt, BUDGET)
    config = _config(frequent(ref), Triggers.always(), begin=True, begin_tokens=None, takeover_tokens=None)
    out = SpeculativeThinking(small, base, tok, config).run(prompt)
    assert out.tokens == ref[: len(out.tokens)] and len(out.tokens) >= BUDGET - 1
    assert out.counters["triggers"] > 1 and {s.author for s in out.steps} == {"large"}


def test_keyword_rule():
    t = Triggers()
    assert t.sentiment("so the total is 12") == 0
    assert t.sentiment("Wait, that is off") == -1
    assert t.sentiment("Yes, the final answer") == 1
    assert t.sentiment("yes but wait") == -1  # a tie counts as negative, as in the reference
    assert t.sentiment("her eyes") == 0 and Triggers(substring=True).sentiment("her eyes") == 1
    assert t.has_verify("let me check") and not t.has_verify("let me look")


def test_verify_words_extend_the_takeover_and_negatives_bring_a_recap(models, tok, prompt):
    base, small = models
    ref = greedy(small, prompt, BUDGET)
    negative = Triggers(rule=lambda text: -1)  # every look-ahead reads as negative
    config = _config(frequent(ref), negative, takeover_tokens=4, recap_after_negative=2, recap_tokens=6,
                     recap_text="Let me check:", token_budget=120)
    out = SpeculativeThinking(small, base, tok, config).run(prompt)
    kinds = [s.kind for s in out.steps]
    assert out.counters["recaps"] >= 1 and "Let me check:" in out.text
    assert kinds.index("recap") > kinds.index("takeover")
    # a recap comes after every 2 negative spans at first
    assert out.counters["negative_spans"] >= 2 * out.counters["recaps"]
    # any printable character is a verify word: every look-ahead fires, and a takeover holding one gets
    # `verify_tokens` more from the large model
    printable = tuple(chr(c) for c in range(33, 127))
    verifying = Triggers(negative=(), positive=(), verify=printable, substring=True)
    out = SpeculativeThinking(small, base, tok, _config(frequent(ref), verifying, takeover_tokens=4, verify_tokens=3,
                                                        recap_text=None)).run(prompt)
    assert out.counters["verify_spans"] > 0
    for i, s in enumerate(out.steps):
        if s.kind == "verify":
            assert out.steps[i - 1].kind == "takeover" and verifying.has_verify(out.steps[i - 1].text)
            assert len(s.tokens) <= 3


def test_bad_config_names_itself():
    with pytest.raises(ValueError, match="lookahead_tokens"):
        SpeculativeThinkingConfig(lookahead_tokens=0)
    with pytest.raises(ValueError, match="takeover_tokens"):
        SpeculativeThinkingConfig(takeover_tokens=-3)
