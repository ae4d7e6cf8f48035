"""Judge verification: with nothing approved it is Exact draw for draw (greedy and sampling, chains and
trees); an approving judge lengthens the accepted runs and counts every emitted token the target would not
have chosen; the judge head trains, saves and loads; bad input names itself."""

import pytest
import torch

from multispec import DynamicTree, EngineConfig, SamplingConfig, speculative_generate
from multispec.drafters import ModelDrafter
from multispec.rules import Judge, JudgeHead, JudgeStats, train_judge_head
from multispec.testing import make_perturbed_copy, make_target


@pytest.fixture(scope="module")
def pair():
    target = make_target("llama", seed=5)
    return target, make_perturbed_copy(target, noise=0.05)


def _head(hidden: int, bias: float) -> JudgeHead:
    head = JudgeHead(hidden)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(bias)
    return head


def _run(pair, rule, tree=4, do_sample=False, seed=0, on_step=None):
    target, draft = pair
    ids = torch.randint(5, 120, (3, 7), generator=torch.Generator().manual_seed(2))
    return speculative_generate(target, ModelDrafter(draft), ids, max_new_tokens=40, tree=tree, rule=rule,
                                generator=torch.Generator().manual_seed(seed), engine=EngineConfig(on_step=on_step),
                                sampling=SamplingConfig(do_sample=do_sample, temperature=0.9))


@pytest.mark.parametrize("tree", [4, DynamicTree(depth=3, topk=2, total=6)], ids=["chain", "tree"])
@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
def test_a_judge_that_approves_nothing_is_exact(pair, tree, do_sample):
    hidden = pair[0].config.hidden_size
    exact = _run(pair, None, tree, do_sample)
    for rule in (Judge(None), Judge(_head(hidden, 5.0), threshold=1.0)):  # disabled; threshold 1
        judged = _run(pair, rule, tree, do_sample)
        assert torch.equal(judged.sequences, exact.sequences)
        assert judged.stats.mean_accepted_length == exact.stats.mean_accepted_length
    assert exact.stats.mean_accepted_length > 1.3  # drafts are accepted: the comparison is not trivial


def test_an_approving_judge_accepts_every_draft_and_counts_its_overrides(pair):
    hidden = pair[0].config.hidden_size
    exact = _run(pair, None)
    tally = JudgeStats()
    judged = _run(pair, Judge(_head(hidden, 5.0), threshold=0.5), on_step=tally)
    steps = judged.stats.steps
    # every chain is accepted whole: 4 drafts + the target's token per step (the last step may be cut short)
    assert all(s.accepted == s.drafted for s in steps[:-1])
    assert judged.stats.mean_accepted_length > exact.stats.mean_accepted_length
    assert tally.overrides > 0
    assert not torch.equal(judged.sequences, exact.sequences)  # the departures the count reports


def test_overrides_are_the_drafts_the_target_would_not_have_chosen(pair):
    """Greedy, one row: replay each step's approved chain against the target's argmax."""
    target, draft = pair
    hidden = target.config.hidden_size
    records = []

    def record(tree, verdict, rows):
        records.append((tree.tokens[0].clone(), int(verdict.num_accepted[0]), int(verdict.overrides[0]),
                        verdict.overridden[0].clone()))

    ids = torch.randint(5, 120, (1, 6), generator=torch.Generator().manual_seed(4))
    out = speculative_generate(target, ModelDrafter(draft), ids, max_new_tokens=20, tree=3,
                               rule=Judge(_head(hidden, 5.0)), engine=EngineConfig(on_step=record))
    text = ids[0].tolist()
    for tokens, accepted, overrides, overridden in records:
        with torch.no_grad():
            logits = target(torch.tensor([text + tokens[:accepted].tolist()])).logits[0]
        own = logits[len(text) - 1: len(text) - 1 + accepted].argmax(-1)
        assert overrides == int((own != tokens[:accepted]).sum())
        assert overridden[:accepted].tolist() == (own != tokens[:accepted]).tolist()  # position by position
        assert not overridden[accepted:].any()
        text += tokens[:accepted].tolist()
        text.append(int(logits[len(text) - 1].argmax()))  # the correction / bonus is the target's choice
    assert text[: out.sequences.shape[1]] == out.sequences[0].tolist()[: len(text)]


def test_training_separates_good_from_bad_tokens_and_round_trips(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 16, generator=g) * 3 + 1
    w = torch.randn(16, generator=g)
    y = (x @ w > 2.0).long()  # imbalanced, linearly separable
    head, report = train_judge_head(x, y, epochs=400, progress=False)
    assert report["recall_good"] > 0.95 and report["recall_bad"] > 0.95, report
    head.save(tmp_path / "judge", note="test")
    again = JudgeHead.load(tmp_path / "judge")
    assert torch.allclose(again(x), head(x))
    with pytest.raises(ValueError, match="labels"):
        train_judge_head(x, torch.ones(600, dtype=torch.long), progress=False)


def test_bad_input_names_itself(pair):
    with pytest.raises(ValueError, match="hidden_size"):
        JudgeHead(0)
    with pytest.raises(ValueError, match="hidden"):
        JudgeHead(8)(torch.zeros(2, 9))
    with pytest.raises(TypeError, match="head"):
        Judge(torch.nn.Linear(4, 1))
    for bad in (float("nan"), -0.1, 1.5):  # a negative threshold would approve everything silently
        with pytest.raises(ValueError, match="threshold"):
            Judge(None, threshold=bad)
    from multispec.tree import DraftTree

    tree = DraftTree.chain(torch.tensor([[3, 4]]))
    with pytest.raises(ValueError, match="features"):
        Judge(_head(8, 0.0)).approvals(tree, None)


def test_a_context_head_with_a_hidden_layer_trains_and_round_trips(tmp_path):
    """Labels that need both the node state and the parent's distribution (an XOR of two signs: no linear
    head separates them, one hidden layer does); saved and loaded with its shape."""
    from multispec.rules import CONTEXT_SCALARS, judge_inputs

    g = torch.Generator().manual_seed(1)
    n, h, v = 800, 6, 11
    node, parent = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    logits, tokens = torch.randn(n, v, generator=g) * 2, torch.randint(0, v, (n,), generator=g)
    x = judge_inputs(node, parent, logits, tokens)
    assert x.shape == (n, 2 * h + CONTEXT_SCALARS)
    lp = torch.log_softmax(logits, -1)
    assert torch.allclose(x[:, -3], lp.gather(1, tokens[:, None])[:, 0]) and torch.allclose(x[:, -2], lp.max(-1).values)
    y = ((node[:, 0] > 0) ^ (x[:, -3] > x[:, -3].median())).long()
    linear, lin_report = train_judge_head(x, y, context=True, epochs=400, progress=False)
    mlp, report = train_judge_head(x, y, context=True, width=32, epochs=600, lr=0.02, progress=False)
    assert min(report["recall_good"], report["recall_bad"]) > 0.9, report
    assert min(lin_report["recall_good"], lin_report["recall_bad"]) < 0.8, lin_report  # the control
    mlp.save(tmp_path / "judge")
    again = JudgeHead.load(tmp_path / "judge")
    assert (again.context, again.width) == (True, 32) and torch.allclose(again(x), mlp(x), atol=1e-5)
    with pytest.raises(ValueError, match="features"):
        train_judge_head(x[:, :-1], y, context=True, progress=False)


def test_a_context_judge_needs_the_logits(pair):
    from multispec.targets.base import Features
    from multispec.tree import DraftTree

    tree = DraftTree.chain(torch.tensor([[3, 4]]))
    head = JudgeHead(8, context=True)
    with pytest.raises(ValueError, match="target_logits"):
        Judge(head).approvals(tree, Features(hidden=torch.zeros(1, 3, 8)))
    approved = Judge(head, threshold=0.0).approvals(tree, Features(hidden=torch.zeros(1, 3, 8)), torch.zeros(1, 3, 20))
    assert approved.tolist() == [[True, True]]


def _departures(target, sequences: torch.Tensor, start: int) -> list[float]:
    """The target's probability of every generated token (up to the row's EOS) that is not its own greedy
    choice."""
    with torch.no_grad():
        probs = torch.softmax(target(sequences).logits.float(), -1)
    out = []
    for row in range(sequences.shape[0]):
        for i in range(start, sequences.shape[1]):
            if i > start and int(sequences[row, i - 1]) == target.config.eos_token_id:
                break  # the row ended: padding follows
            p = probs[row, i - 1]
            if int(p.argmax()) != int(sequences[row, i]):
                out.append(float(p[sequences[row, i]]))
    return out


def test_the_probability_floor_bounds_every_departure(pair):
    """With `min_target_prob` ρ every emitted token the target would not have chosen has target probability
    >= ρ (greedy, a judge that approves everything); ρ = 1 leaves the exact rule."""
    target, _ = pair
    hidden = target.config.hidden_size
    free = _departures(target, _run(pair, Judge(_head(hidden, 5.0))).sequences, 7)
    rho = sorted(free)[len(free) // 2]  # half the unfloored departures fall below it
    floored = _departures(target, _run(pair, Judge(_head(hidden, 5.0), min_target_prob=rho)).sequences, 7)
    assert floored and min(floored) >= rho - 1e-6 and min(free) < rho
    exact = _run(pair, None)
    assert torch.equal(_run(pair, Judge(_head(hidden, 5.0), min_target_prob=1.0)).sequences, exact.sequences)
    with pytest.raises(ValueError, match="min_target_prob"):
        Judge(None, min_target_prob=1.5)
    from multispec.targets.base import Features
    from multispec.tree import DraftTree

    with pytest.raises(ValueError, match="target_logits"):
        Judge(_head(8, 5.0), min_target_prob=0.1).approvals(DraftTree.chain(torch.tensor([[3, 4]])),
                                                             Features(hidden=torch.zeros(1, 3, 8)))


def _siblings(rows: int):
    """Two children of the root, tokens [4, 7] in draft order, and one grandchild (token 9) under each; the
    judge's features approve the nodes of token 7 and 9 only."""
    from multispec.targets.base import Features
    from multispec.tree import DraftTree

    tree = DraftTree(tokens=torch.tensor([[4, 7, 9, 9]] * rows), parents=torch.tensor([[-1, -1, 0, 1]] * rows),
                     valid=torch.ones(rows, 4, dtype=torch.bool))
    hidden = torch.tensor([0.0, -1.0, 1.0, 1.0, 1.0])[None, :, None].expand(rows, 5, 1).contiguous()
    head = JudgeHead(1)
    with torch.no_grad():
        head.linear.weight.fill_(8.0)
        head.linear.bias.zero_()
    return tree, Features(hidden=hidden), head


def test_a_judge_never_displaces_a_sibling_the_exact_rule_accepts():
    """Greedy: the root's argmax is 4, the first child; the judge approves only its sibling 7. Exact accepts
    4 (and its child 9 through the judge, after exact rejects it), never 7. Where the argmax is no child,
    the judge takes 7."""

    tree, features, head = _siblings(1)
    logits = torch.full((1, 5, 12), -5.0)
    logits[0, 0, 4] = 5.0  # after the root: 4
    logits[0, 1, 3] = 5.0  # after 4: 3 (not the drafted 9)
    verdict = Judge(head).accept(tree, logits, SamplingConfig(), features=features)
    assert verdict.tokens[0, :2].tolist() == [4, 9] and verdict.path[0, :3].tolist() == [0, 1, 3]
    assert verdict.overridden[0, :2].tolist() == [False, True] and int(verdict.overrides[0]) == 1
    logits[0, 0, 4] = -5.0
    logits[0, 0, 5] = 5.0  # the argmax is no child: exact rejects both, the judge takes 7, then its 9
    verdict = Judge(head).accept(tree, logits, SamplingConfig(), features=features)
    assert verdict.tokens[0, :2].tolist() == [7, 9] and verdict.path[0, :3].tolist() == [0, 2, 4]
    assert int(verdict.overrides[0]) == 2


def test_when_sampling_the_judge_only_takes_what_exact_rejects():
    """Target p(4) = p(5) = 0.5 after the root, drafts one-hot: exact accepts 4 with probability 0.5 and then
    rejects 7 (the residual holds only 5); the judge takes 7 in every other row, never displacing 4. The old
    rule (approved nodes forced) gave 7 in every row. 8,000 rows: 4's share within 0.5 +- 0.025 (4.5 sd)."""

    n = 8000
    tree, features, head = _siblings(n)
    logits = torch.full((n, 5, 12), -30.0)
    logits[:, 0, 4] = logits[:, 0, 5] = 0.0
    logits[:, 1:, 9] = 0.0  # below: the grandchildren 9 are the target's own
    verdict = Judge(head).accept(tree, logits, SamplingConfig(do_sample=True), torch.Generator().manual_seed(0),
                                 features)
    first = verdict.tokens[:, 0]
    share = float((first == 4).float().mean())
    assert abs(share - 0.5) < 0.025, share
    assert set(first.tolist()) == {4, 7}  # never 5: where exact rejects both, the judge's 7 replaces the draw
    assert torch.equal(verdict.overridden[:, 0], first == 7)
    assert (verdict.tokens[:, 1] == 9).all() and not verdict.overridden[:, 1].any()  # exact accepts the 9s
