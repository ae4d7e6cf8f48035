"""Judge training data: every first rejected draft token of a greedy speculative run is labelled by whether the
base model's continuation after it checks out; its feature is the base's hidden state at that token (what the
judge reads during verification)."""

import pytest
import torch

from multispec import EngineConfig
from multispec.drafters import ModelDrafter
from multispec.reasoning.data import Problem
from multispec.reasoning.judge_data import divergences, judge_input_at, label_divergences

from reasoning_models import greedy


def test_divergences_are_the_tokens_the_exact_rule_rejected(models, prompt):
    base, small = models
    found, own = divergences(base, small, prompt, k=3, max_new_tokens=30, eos=2)
    assert found and own == greedy(base, prompt, len(own))
    for d in found:
        assert greedy(base, d.prefix, 1) == [d.target_token] and d.token != d.target_token
        assert d.prefix[: len(prompt)] == prompt
        assert 2 not in d.prefix[len(prompt):]  # nothing past the end of the text (eos = 2)


def test_labels_follow_the_checker_and_features_are_the_verification_states(models, tok):
    base, small = models
    problems = [Problem("What is 1 + 1?", 2), Problem("Compute 4 * 2.", 8)]
    own = {tok.decode(divergences(base, small, tok.encode(p.prompt()), 3, 24, 2)[1]) for p in problems}
    # a checker that passes the base's own answers and likes even-length ones: both labels occur
    data = label_divergences(base, small, problems, tok, k=3, max_new_tokens=24,
                             check=lambda text, answer: text in own or len(text) % 2 == 0, progress=False)
    assert data["features"].shape == (len(data["labels"]), base.config.hidden_size)
    assert set(data["labels"].tolist()) == {0, 1}
    prompt = tok.encode(problems[0].prompt())
    d = divergences(base, small, prompt, 3, 24, 2)[0][0]
    assert torch.allclose(data["features"][0], judge_input_at(base, d.prefix + [d.token]))
    # the same state the verification pass hands the judge
    with torch.no_grad():
        h = base(torch.tensor([d.prefix + [d.token]]), output_hidden_states=True).hidden_states[-1][0, -1]
    assert torch.allclose(data["features"][0], h, atol=1e-4)


def test_problems_the_base_gets_wrong_are_skipped(models, tok):
    base, small = models
    problems = [Problem("What is 1 + 1?", 2)]
    with pytest.raises(ValueError, match="1 of 1 problems skipped"):
        label_divergences(base, small, problems, tok, k=3, max_new_tokens=24, check=lambda text, answer: False,
                          progress=False)


def test_context_inputs_are_what_the_judge_reads_during_verification(models, prompt, monkeypatch):
    """`judge_input_at(..., context=True)` for a drafted token equals the vector a context judge is handed for
    that node in the verification pass (state at the node, at its parent, the parent's distribution)."""
    from multispec import speculative_generate
    from multispec.rules import CONTEXT_SCALARS, Judge, JudgeHead

    base, small = models
    head = JudgeHead(base.config.hidden_size, context=True)
    seen = []
    original = JudgeHead.forward
    monkeypatch.setattr(JudgeHead, "forward", lambda self, x: seen.append(x.clone()) or original(self, x))
    drafts = []
    speculative_generate(base, ModelDrafter(small), torch.tensor([prompt]), max_new_tokens=4, tree=3,
                         rule=Judge(head, threshold=1.0),
                         engine=EngineConfig(on_step=lambda tree, v, rows: drafts.append(tree.tokens[0])))
    first, second = int(drafts[0][0]), int(drafts[0][1])
    x = seen[0][0]  # [N, 2H + 3] for the first step's chain
    assert x.shape[-1] == 2 * base.config.hidden_size + CONTEXT_SCALARS
    assert torch.allclose(x[0], judge_input_at(base, prompt + [first], context=True), atol=1e-4)
    assert torch.allclose(x[1], judge_input_at(base, prompt + [first, second], context=True), atol=1e-4)


def test_on_policy_divergences_are_judge_decodings_own(models, prompt, tok):
    """With a judge rule the labelled runs are judge decoding: approved tokens that are not the base's greedy
    choice are listed with the run's own prefix, and prefixes an earlier approval already broke are skipped."""
    from multispec.rules import Judge, JudgeHead

    base, small = models
    rule = Judge(JudgeHead.approve_all(base.config.hidden_size))  # approves every draft token
    found, out = divergences(base, small, prompt, k=3, max_new_tokens=20, eos=2, rule=rule)
    text = prompt + out
    assert found and out != greedy(base, prompt, len(out))  # the run left the base's greedy path
    for d in found:
        assert d.prefix == text[: len(d.prefix)] and text[len(d.prefix)] == d.token  # approved, on the run's path
        assert greedy(base, d.prefix, 1) == [d.target_token] != [d.token]
    problem = Problem("What is 1 + 1?", 2)
    p = tok.encode(problem.prompt())
    own = tok.decode(greedy(base, p, 24))
    own = own[: own.index(tok.decode([2])) + 1] if tok.decode([2]) in own else own
    data = label_divergences(base, small, [problem], tok, k=3, max_new_tokens=24, rule=rule, progress=False,
                             check=lambda t, answer: own.startswith(t) or t.startswith(own))
    # only the base's own text passes: the first divergence (on the base's path) is labelled bad, the later
    # ones sit after an approval the base cannot recover from and are skipped
    assert data["labels"].tolist() and set(data["labels"].tolist()) == {0}
    assert data["skipped_prefixes"] > 0


def test_a_drafted_end_of_text_is_labelled_by_the_text_it_ends(models, tok, monkeypatch):
    """An approved EOS ends the generation, so a divergent EOS is good only if the text up to it checks out;
    the base's continuation past it (which real decoding never writes) must not decide its label."""
    from multispec.reasoning import judge_data

    base, small = models
    problem = Problem("What is 1 + 1?", 2)
    prompt = tok.encode(problem.prompt())
    own = divergences(base, small, prompt, 3, 24, 2)[1]
    early = judge_data.Divergence(prompt + own[:3], token=2, target_token=own[3])  # stops after 3 tokens
    monkeypatch.setattr(judge_data, "divergences", lambda *a, **kw: ([early], own))
    checked = []

    def check(text, answer):
        checked.append(text)
        return text == tok.decode(own)  # only the base's whole text is right

    data = label_divergences(base, small, [problem], tok, k=3, max_new_tokens=24, check=check, progress=False)
    assert checked[-1] == tok.decode(own[:3]) and data["labels"].tolist() == [0]
    data = label_divergences(base, small, [problem], tok, k=3, max_new_tokens=24, progress=False,
                             check=lambda text, answer: text in (tok.decode(own), tok.decode(own[:3])))
    assert data["labels"].tolist() == [1]


def test_batched_continuations_are_the_base_s_own_greedy_ones(models, prompt, tok):
    """`finish_all` continues texts of several lengths in left-padded batches: each continuation is the one the
    base writes for that text alone (the checker sees the same text), and a text ending in EOS is read as is."""
    from multispec.reasoning.judge_data import finish_all

    base, _ = models
    texts = [prompt + (greedy(base, prompt, n) if n else []) + [t] for n, t in ((0, 70), (3, 80), (5, 90), (7, 100))]
    texts.append(prompt + [65, 2])
    seen = []
    out = finish_all(base, texts, prompt, 0, tok, max_new_tokens=16, batch_size=3,
                     check=lambda text, answer: seen.append(text) or len(text) % 2 == 0)
    expected = []
    for t in texts[:-1]:
        new = greedy(base, t, 16 - (len(t) - len(prompt)))
        new = new[: new.index(2)] if 2 in new else new
        expected.append(tok.decode(t[len(prompt):] + new))
    expected.insert(0, tok.decode([65]))  # read first, as it is (no continuation past an EOS)
    assert seen == expected and out == [len(e) % 2 == 0 for e in [expected[1], expected[2], expected[3],
                                                                   expected[4], expected[0]]]


def test_labelled_tokens_carry_the_base_s_probability_of_them(models, tok):
    """What a `min_target_prob` floor would read for each labelled token rides with its label."""
    from multispec.reasoning.judge_data import token_prob

    base, small = models
    problem = Problem("What is 1 + 1?", 2)
    data = label_divergences(base, small, [problem], tok, k=3, max_new_tokens=24, progress=False,
                             check=lambda text, answer: True)
    prompt = tok.encode(problem.prompt())
    d = divergences(base, small, prompt, 3, 24, 2)[0][0]
    assert data["target_probs"].shape == data["labels"].shape
    with torch.no_grad():
        p = torch.softmax(base(torch.tensor([d.prefix])).logits[0, -1], -1)[d.token]
    assert data["target_probs"][0] == pytest.approx(float(p), abs=1e-6) == token_prob(base, d.prefix, d.token)


def test_an_on_policy_round_runs_judge_decoding_at_the_given_floor(models, tmp_path, monkeypatch):
    """`train_zoo_judge(on_policy=..., on_policy_floor=...)`: the runs it labels are judge decoding with the first
    head at that threshold and floor (a DAgger round at the floor the judge will be used with)."""
    from multispec.reasoning import zoo_pair
    from multispec.rules import JudgeHead

    base, small = models
    seen = {}

    def fake_labels(b, s, problems, tokenizer, **kw):
        seen["rule"] = kw["rule"]
        return {"features": torch.randn(8, base.config.hidden_size), "labels": torch.tensor([0, 1] * 4),
                "target_probs": torch.rand(8), "skipped_problems": 0, "skipped_prefixes": 0}

    monkeypatch.setattr(zoo_pair, "load_model", lambda folder: base if folder.name == "base" else small)
    monkeypatch.setattr(zoo_pair, "label_divergences", fake_labels)
    JudgeHead(base.config.hidden_size).save(tmp_path / "first", target=base)
    report = zoo_pair.train_zoo_judge(tmp_path, problems=2, drafter="small", out="second",
                                      on_policy=zoo_pair.OnPolicy("first", threshold=0.7, floor=0.05))
    rule = seen["rule"]
    assert (rule.threshold, rule.min_target_prob) == (0.7, 0.05)
    assert report["on_policy_floor"] == 0.05 and (tmp_path / "second" / "judge_config.json").exists()


def test_further_heads_train_on_the_same_labels_labelled_once(models, tmp_path, monkeypatch):
    """`train_zoo_judge(also=...)`: one labelling (with the context inputs, when any head reads them), a linear
    head on the state at the token (the context vector's first H columns) and a context head beside it."""
    from multispec.reasoning import zoo_pair
    from multispec.rules import JudgeHead

    base, small = models
    h = base.config.hidden_size
    calls = []
    features = torch.randn(8, 2 * h + 3)

    def fake_labels(b, s, problems, tokenizer, **kw):
        calls.append(kw["context"])
        return {"features": features, "labels": torch.tensor([0, 1] * 4), "target_probs": torch.rand(8),
                "skipped_problems": 0, "skipped_prefixes": 0}

    trained = []
    real_train = zoo_pair.train_judge_head

    def spy(x, y, **kw):
        trained.append((x, kw["context"]))
        return real_train(x, y, progress=False, epochs=3, **kw)

    monkeypatch.setattr(zoo_pair, "load_model", lambda folder: base if folder.name == "base" else small)
    monkeypatch.setattr(zoo_pair, "label_divergences", fake_labels)
    monkeypatch.setattr(zoo_pair, "train_judge_head", spy)
    report = zoo_pair.train_zoo_judge(tmp_path, problems=2, drafter="small", out="linear",
                                      also={"ctx": (True, 4)})
    assert calls == [True]  # labelled once, with the context inputs
    (lin_x, lin_ctx), (ctx_x, ctx_ctx) = trained
    assert not lin_ctx and torch.equal(lin_x, features[:, :h]) and ctx_ctx and torch.equal(ctx_x, features)
    assert not JudgeHead.load(tmp_path / "linear").context and JudgeHead.load(tmp_path / "ctx").context
    assert report["labelled"] == 8 and report["also"]["ctx"]["labelled"] == 8
