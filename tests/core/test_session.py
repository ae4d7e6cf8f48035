"""Sessions keep the caches across calls: append, generate to a delimiter, score a span, roll back, continue;
the text equals decoding it from scratch, and the drafter after a rollback is the drafter started afresh."""

import pytest
import torch

from multispec import Chain, Prompt, SamplingConfig, Session, zoo
from multispec.drafters import ModelDrafter
from multispec.ssm.testing import make_mamba2
from multispec.testing import make_perturbed_copy, make_target, source_prompts


def _greedy(model, ids: list[int], n: int) -> list[int]:
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def _logprobs(model, context: list[int], span: list[int]) -> torch.Tensor:
    seq = torch.tensor([context + span])
    with torch.no_grad():
        logits = model(seq).logits[0].float()
    logp = torch.log_softmax(logits[len(context) - 1: -1], dim=-1)
    return logp.gather(1, torch.tensor(span)[:, None])[:, 0]


def _models(kind):
    if kind == "llama-model-draft":
        target = make_target("llama", seed=3)
        return target, ModelDrafter(make_perturbed_copy(target, noise=0.03))
    if kind == "llama-ngram":
        return make_target("llama", seed=3), "ngram"
    if kind == "mamba2-model-draft":
        target = make_mamba2(seed=2)
        return target, ModelDrafter(make_perturbed_copy(target, noise=0.03))
    pair = zoo.load("stdlib-bytes")
    return pair.target, pair.drafter  # an EAGLE head: the session keeps the target features it reads


@pytest.mark.parametrize("kind", ["llama-model-draft", "llama-ngram", "mamba2-model-draft", "bytes-eagle"])
def test_append_generate_score_rollback_equals_decoding_from_scratch(kind):
    target, drafter = _models(kind)
    if kind == "bytes-eagle":
        ids, mask = source_prompts((120,))
        prompt = ids[0].tolist()
    else:
        prompt = torch.randint(7, 128, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = _greedy(target, prompt, 30)
    stop = ref[8:10]  # a two-token delimiter the target writes
    first = next(j for j in range(2, 30) if ref[j - 2:j] == stop)
    session = Session(target, drafter, tree=3)
    session.append(torch.tensor([prompt]))
    step = session.generate(20, stop=[stop])[0]
    assert step == ref[:first]  # generation stops right after the delimiter
    extra = [11, 12, 13]  # text written elsewhere (e.g. a tool's answer)
    appended = session.append(torch.tensor([extra]))
    # the appending pass scores the appended tokens after the text before them
    assert torch.allclose(appended.logprobs[0], _logprobs(target, prompt + step, extra), atol=1e-4)
    assert bool((appended.top_logprobs >= appended.logprobs - 1e-6).all()) and appended.next_logits is None
    text = prompt + step + extra
    assert session.tokens[0] == text
    mark = session.checkpoint()
    span = [21, 22, 23, 24]
    scored = session.score(torch.tensor([span]))
    assert torch.allclose(scored.logprobs[0], _logprobs(target, text, span), atol=1e-4)
    with torch.no_grad():
        after_span = target(torch.tensor([text + span])).logits[0, -1]
    assert torch.allclose(scored.next_logits[0], after_span, atol=1e-4)
    wander = session.generate(7)[0]  # something we then take back
    assert session.tokens[0] == text + wander
    session.rollback(mark)
    assert session.tokens[0] == text
    more = session.generate(12)[0]
    assert more == _greedy(target, text, 12)
    assert session.stats.mean_accepted_length >= (1.2 if kind == "llama-ngram" else 1.5), session.stats


def test_a_drafter_after_rollback_is_the_drafter_started_afresh():
    """The EAGLE head restarted from the features the session kept proposes what a fresh start proposes."""
    pair = zoo.load("stdlib-bytes")
    ids, _ = source_prompts((150,))
    session = Session(pair.target, pair.drafter, tree=4)
    session.append(ids)
    session.generate(5)
    mark = session.checkpoint()
    session.generate(9)
    session.rollback(mark)
    text = torch.tensor([session.tokens[0]])
    fresh_target = Session(pair.target, type(pair.drafter)(pair.drafter.head, pair.target), tree=4)
    fresh_target.append(text)
    sample = SamplingConfig(do_sample=True)
    a = session.drafter.propose(session.roots, Chain(4), sample, torch.Generator().manual_seed(3))
    b = fresh_target.drafter.propose(fresh_target.roots, Chain(4), sample, torch.Generator().manual_seed(3))
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.draft_probs, b.draft_probs, atol=1e-4)


def test_rows_that_stop_together_stay_in_the_session():
    target = make_target("llama", seed=5)
    prompts = torch.randint(7, 128, (1, 6), generator=torch.Generator().manual_seed(0)).expand(2, -1)
    session = Session(target, "ngram", tree=3)
    session.append(prompts)
    first = session.generate(4)
    assert session.active == [0, 1] and all(len(t) == 4 for t in first.values())
    second = session.generate(5)
    for r in range(2):
        assert first[r] + second[r] == _greedy(target, prompts[r].tolist(), 9)


def test_bad_use_is_refused_by_name():
    target = make_target("llama")
    session = Session(target, "ngram")
    with pytest.raises(RuntimeError, match="generate: append a prompt first"):
        session.generate(3)
    session.append(torch.tensor([[9, 10, 11]]))
    with pytest.raises(ValueError, match="attention_mask: only the first append"):
        session.append(torch.tensor([[5]]), attention_mask=torch.ones(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids: expected \\[1, n\\] tokens"):
        session.append(torch.tensor([[5], [6]]))
    with pytest.raises(ValueError, match="stop: an empty stop sequence"):
        session.generate(3, stop=[[]])
    with pytest.raises(TypeError, match="mark: expected a Checkpoint"):
        session.rollback("start")
    one_shot = Session(target, "ngram", rollback=False)
    one_shot.append(torch.tensor([[9, 10, 11]]))
    with pytest.raises(RuntimeError, match="checkpoint: this session was created with rollback=False"):
        one_shot.checkpoint()
    assert Prompt.build(torch.tensor([1, 2])).input_ids.shape == (1, 2)
