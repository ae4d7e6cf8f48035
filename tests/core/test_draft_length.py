"""The chain length for this machine (`multispec.draft_length`): step profiles priced with a measured
verification cost."""

import json

import pytest
import torch

import multispec.draft_length as dl
from multispec import (DraftTree, DynamicTree, EngineConfig, NGramDrafter, SamplingConfig, StoppingConfig,
                       speculative_generate, zoo)
from multispec.draft_length import (ChainChoice, StepProfile, VerifyCost, calibrate, choose_chain_length,
                                    describe_choice, needed_widths)
from multispec.metrics import SpeculativeStats, StepStats
from multispec.testing import chi_square_pvalue, first_two_token_dists, make_perturbed_copy, make_target


def _profiles(t1=10.0, overhead=1.0):
    """Baseline: 100 one-node steps, 100 tokens. k=2: 50 steps of 3 nodes, 100 tokens. k=4: 40 steps of 5 nodes."""
    out = []
    for mode in ("greedy", "sampling"):
        out += [StepProfile(0, mode, {1: 100}, 100, overhead, t1), StepProfile(2, mode, {3: 50}, 100, overhead, t1),
                StepProfile(4, mode, {5: 40}, 100, overhead, t1)]
    return out


def test_the_choice_follows_the_machines_cost_curve():
    """The same profiles choose k=2 where 3 nodes cost little more than 1 (a cliff at 4) and k=4 where 3
    nodes are dear and 5 cheap: the case of the Gemma pair on the two CPUs in BENCHMARKS.md."""
    cheap_three = VerifyCost({1: 10.0, 3: 11.0, 5: 20.0})
    dear_three = VerifyCost({1: 10.0, 3: 25.0, 5: 15.0})
    a = choose_chain_length(_profiles(), cheap_three)
    b = choose_chain_length(_profiles(), dear_three)
    assert (a.chain_k, b.chain_k) == (2, 4)
    # by hand: baseline 100 * (10 + 1) / 100 = 11 ms a token; k=2 under the first curve 50 * (11 + 1) / 100 = 6
    assert a.predicted[2]["greedy"] == pytest.approx(11 / 6)
    assert a.predicted[4]["sampling"] == pytest.approx(11 / (40 * 21 / 100))
    assert b.predicted[4]["greedy"] == pytest.approx(11 / (40 * 16 / 100))
    assert a.score[2] == pytest.approx(11 / 6)


def test_overhead_scales_with_the_one_node_cost():
    """A profile recorded where one node cost 10 ms carries its 1 ms a step of overhead as 2 ms on a
    machine where one node costs 20 ms."""
    p = StepProfile(2, "greedy", {3: 50}, 100, 1.0, 10.0)
    assert p.ms_per_token(VerifyCost({1: 20.0, 3: 22.0})) == pytest.approx(50 * (22 + 2) / 100)


def test_prefill_is_priced_per_generation_and_can_change_the_choice():
    """Each generation's prefill (rescaled like the overhead) joins its steps: a long chain that saves a few
    steps stops paying once a fixed prefill dominates, the case of the main job's pair, where the 1200-byte
    prefill is a third of a chain's generation. Profiles without generations price no prefill."""
    p = StepProfile(2, "greedy", {3: 50}, 100, 1.0, 10.0, generations=2, prefill_ms=30.0)
    assert p.ms_per_token(VerifyCost({1: 20.0, 3: 22.0})) == pytest.approx((50 * (22 + 2) + 2 * 60) / 100)

    def profiles(prefill):
        return [StepProfile(0, "greedy", {1: 100}, 100, 0.0, 10.0, 1, prefill),
                StepProfile(4, "greedy", {5: 25}, 100, 0.0, 10.0, 1, prefill),
                StepProfile(8, "greedy", {9: 12}, 100, 0.0, 10.0, 1, prefill),
                StepProfile(0, "sampling", {1: 100}, 100, 0.0, 10.0, 1, prefill),
                StepProfile(4, "sampling", {5: 40}, 100, 0.0, 10.0, 1, prefill),
                StepProfile(8, "sampling", {9: 50}, 100, 0.0, 10.0, 1, prefill)]
    cost = VerifyCost({1: 10.0, 5: 12.0, 9: 14.0})
    # steps alone, greedy: baseline 1000 ms, k=4 25 * 12 = 300, k=8 12 * 14 = 168; sampling: k=4 480, k=8 700.
    # Mean of the ratios: k=4 (3.33 + 2.08) / 2 = 2.71, k=8 (5.95 + 1.43) / 2 = 3.69: greedy's large ratio
    # decides. With a 2000 ms prefill a generation: k=4 (3000/2300 + 3000/2480) / 2 = 1.257, k=8
    # (3000/2168 + 3000/2700) / 2 = 1.247: the sampled time k=8 loses now counts
    alone, prefilled = choose_chain_length(profiles(0.0), cost), choose_chain_length(profiles(2000.0), cost)
    assert alone.predicted[8]["greedy"] == pytest.approx(1000 / 168) and alone.chain_k == 8
    assert prefilled.predicted[8]["greedy"] == pytest.approx(3000 / 2168) and prefilled.chain_k == 4
    assert StepProfile.from_json({k: v for k, v in p.to_json().items() if k not in ("generations", "prefill_ms")}
                                 ).generations == 0


def test_mean_of_modes_decides_and_modes_missing_for_a_candidate_are_left_out():
    profiles = [p for p in _profiles() if not (p.chain_k == 4 and p.mode == "sampling")]
    choice = choose_chain_length(profiles, VerifyCost({1: 10.0, 3: 11.0, 5: 20.0}))
    assert set(choice.predicted[2]) == {"greedy"}  # sampling is not profiled for every candidate


def test_profile_from_stats():
    def st(drafted, committed, rows=1):
        return StepStats(rows=rows, drafted=drafted, accepted=committed - 1, committed=committed,
                         draft_s=0.001, verify_s=0.012, commit_s=0.002)

    runs = [SpeculativeStats([st(2, 3), st(2, 1), st(0, 1)], prefill_s=0.05), SpeculativeStats([st(2, 2)], 0.07)]
    cost = VerifyCost({1: 9.0, 3: 10.0})
    p = StepProfile.from_stats(2, "greedy", runs, cost)
    assert p.widths == {1: 1, 3: 3} and p.tokens == 7 and p.steps == 4 and p.t1_ms == 9.0
    assert p.generations == 2 and p.prefill_ms == pytest.approx(60.0)
    # a step's overhead: draft + commit + (in-loop verify - bare forward at its width): 3 + 2 for width 3, 3 + 3 for 1
    assert p.overhead_ms == pytest.approx((3 * 5 + 6) / 4)
    assert StepProfile.from_json(json.loads(json.dumps(p.to_json()))) == p
    with pytest.raises(ValueError, match="batch-1"):
        StepProfile.from_stats(2, "greedy", [SpeculativeStats([st(2, 3, rows=2)])], cost)
    with pytest.raises(ValueError, match="no steps"):
        StepProfile.from_stats(2, "greedy", [SpeculativeStats()], cost)
    with pytest.raises(KeyError, match="no verification cost measured for 5 nodes"):
        StepProfile.from_stats(4, "greedy", [SpeculativeStats([st(4, 5)])], cost)


def test_bad_profiles_and_costs_are_refused():
    with pytest.raises(ValueError, match="mode"):
        StepProfile(2, "beam", {3: 1}, 1, 0.0, 1.0)
    with pytest.raises(ValueError, match="tokens > 0"):
        StepProfile(2, "greedy", {3: 1}, 0, 0.0, 1.0)
    with pytest.raises(ValueError, match="prefill_ms must be >= 0"):
        StepProfile(2, "greedy", {3: 1}, 1, 0.0, 1.0, 1, -5.0)
    with pytest.raises(ValueError, match="one-node cost"):
        VerifyCost({3: 1.0})
    with pytest.raises(ValueError, match="baseline"):
        choose_chain_length([p for p in _profiles() if p.chain_k], VerifyCost({1: 1.0, 3: 1.0, 5: 1.0}))
    with pytest.raises(KeyError, match="measured: \\[1, 3\\]"):
        choose_chain_length(_profiles(), VerifyCost({1: 10.0, 3: 11.0}))


def test_measure_and_calibrate_on_a_model():
    """Measured on a tiny Llama: every width the profiles use is timed; the choice is one of the profiled
    lengths; the model's own generation is unaffected."""
    torch.manual_seed(0)
    model = make_target()
    ids = torch.randint(0, 100, (1, 12))
    expected = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert needed_widths(_profiles()) == [1, 3, 5]
    cost = VerifyCost.measure(model, [3, 5], prefix_tokens=20, reps=1)
    assert sorted(cost.ms) == [1, 3, 5] and all(v > 0 for v in cost.ms.values())
    choice = calibrate(model, _profiles(), prefix_tokens=20, reps=1)
    assert isinstance(choice, ChainChoice) and choice.chain_k in (2, 4)
    assert "chosen chain k=" in describe_choice(choice)
    assert torch.equal(model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0), expected)
    with pytest.raises(ValueError, match="prefix_tokens"):
        VerifyCost.measure(model, [2], prefix_tokens=0)
    with pytest.raises(ValueError, match="reps"):
        VerifyCost.measure(model, [2], reps=0)


def test_measure_times_every_width_in_each_round(monkeypatch):
    """Widths are timed in rounds (each round every width once), not one width's repetitions back to back,
    so a burst of machine load cannot make one width look cheap or dear alone."""
    torch.manual_seed(0)
    real = dl.as_target(make_target())
    order = []

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def score(self, tokens, *args, **kwargs):
            order.append(tokens.shape[1])
            return real.score(tokens, *args, **kwargs)

    monkeypatch.setattr(dl, "as_target", lambda target: Recording())
    cost = VerifyCost.measure(object(), [3, 5], prefix_tokens=10, vocab_size=100, reps=2)
    assert order == [1, 3, 5] * 3 and sorted(cost.ms) == [1, 3, 5]


def test_profiles_of_real_runs_predict_the_measured_accepted_length():
    """A profile made from real greedy runs holds their steps: tokens / steps is the run's accepted length."""
    torch.manual_seed(0)
    model = make_target()
    ids = torch.randint(0, 100, (1, 12)).repeat(1, 3)  # a repeated prompt, so prompt lookup finds drafts
    out = speculative_generate(model, NGramDrafter(), ids, max_new_tokens=24, tree=3,
                               stopping=StoppingConfig(pad_token_id=0))
    cost = VerifyCost.measure(model, [1 + s.drafted for s in out.stats.steps], prefix_tokens=36, reps=1)
    p = StepProfile.from_stats(3, "greedy", [out.stats], cost)
    assert p.tokens / p.steps == pytest.approx(out.stats.mean_accepted_length)
    assert max(p.widths) <= 4


def test_zoo_pair_profiles_load():
    """The Gemma pair ships step profiles (its weights need the extra; the shape file does not): they load,
    cover the baseline and the stored length in both modes, and price to a choice with any cost curve."""
    shape = zoo._draft_shape(zoo.path("gemma3-270m-eagle"))
    profiles = shape["step_profiles"]
    assert {(p.chain_k, p.mode) for p in profiles} >= {(k, m) for k in (0, shape["chain_k"])
                                                       for m in ("greedy", "sampling")}
    flat = VerifyCost({m: 10.0 for m in needed_widths(profiles)})
    choice = choose_chain_length(profiles, flat)
    assert choice.chain_k in {p.chain_k for p in profiles if p.chain_k}
    assert all(v["greedy"] > 1 for v in choice.predicted.values())  # verifying is free: every greedy chain pays
    # the drafter each pair's profiles ran: the row a calibrated `bench text` pads
    assert shape["profiled_drafter"] == "ngram"
    assert zoo._draft_shape(zoo.path("stdlib-bytes-large"))["profiled_drafter"] == "eagle"
    # prompt lookup chosen for chat (`zoo tune --what chat-lookup`): (chain length, shortest n-gram), as eval chat
    # builds its row from it; a pair without one has none
    stored = json.loads((zoo.path("gemma3-270m-eagle") / "draft_shape.json").read_text())["chat_lookup"]
    assert shape["chat_lookup"] == (stored["chain_k"], stored["min_ngram"]) and 1 <= stored["min_ngram"] <= 3
    assert "chat_lookup" not in zoo._draft_shape(zoo.path("stdlib-bytes-large"))


def test_padding_picks_a_cheaper_wider_width():
    cost = VerifyCost({1: 10.0, 2: 20.0, 3: 30.0, 4: 15.0, 5: 16.0, 6: 14.5})
    # 4 stays: 6 nodes are only 3% cheaper than 4, inside the 5% margin timing noise could make
    assert cost.padding() == {2: 6, 3: 6, 5: 6}
    assert cost.padding(margin=0.0) == {2: 6, 3: 6, 4: 6, 5: 6}
    assert cost.padded().ms == {1: 10.0, 2: 14.5, 3: 14.5, 4: 15.0, 5: 14.5, 6: 14.5}
    # the choice prices padded widths: k=2 (3 nodes) costs what 6 nodes do
    choice = choose_chain_length(_profiles(), VerifyCost({1: 10.0, 3: 25.0, 5: 15.0}), pad=True)
    assert choice.pad_widths == {3: 5} and choice.cost.ms[3] == 25.0  # the measured cost is kept
    assert choice.predicted[2]["greedy"] == pytest.approx(11 / (50 * 16 / 100))


def test_padded_tree_adds_invalid_nodes_only():
    chain = DraftTree.chain(torch.tensor([[5, 6], [7, 8]]), lengths=torch.tensor([2, 1]))
    p = chain.padded(5)
    assert p.num_nodes == 5 and p.is_chain and not p.dense
    assert p.valid.tolist() == [[True, True, False, False, False], [True, False, False, False, False]]
    assert p.parents[0].tolist() == [-1, 0, 1, 2, 3] and p.tokens[:, :2].tolist() == [[5, 6], [7, 8]]
    assert chain.padded(2) is chain
    probs = torch.softmax(torch.randn(1, 3, 10), -1)
    tree = DraftTree(torch.tensor([[1, 2, 3]]), torch.tensor([[-1, 0, 0]]), torch.ones(1, 3, dtype=torch.bool),
                     probs, feed_ids=torch.tensor([[4, 5, 6]]))
    t = tree.padded(5)
    assert t.parents.tolist() == [[-1, 0, 0, -1, -1]] and t.feed_ids.tolist() == [[4, 5, 6, 3, 4]]
    assert torch.equal(t.draft_probs[:, :3], probs)
    assert torch.allclose(t.draft_probs[:, 3:], torch.full((1, 2, 10), 0.1))


@pytest.mark.parametrize("tree", [4, DynamicTree(depth=3, topk=2, total=6)], ids=["chain", "dynamic"])
def test_padding_keeps_greedy_output(tree):
    """Greedy with padded steps equals `generate`, with drafts accepted."""
    target = make_target()
    draft = make_perturbed_copy(target, noise=0.02)
    ids = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(1))
    expected = target.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0)
    out = speculative_generate(target, draft, ids, max_new_tokens=20, tree=tree,
                               stopping=StoppingConfig(pad_token_id=0),
                               engine=EngineConfig(pad_widths={m: m + 3 for m in range(1, 12)}))
    assert torch.equal(out.sequences, expected) and out.stats.mean_accepted_length > 1.5


@pytest.mark.slow
@pytest.mark.parametrize("tree", [3, DynamicTree(depth=2, topk=3, total=6)], ids=["chain", "dynamic"])
def test_padding_keeps_the_sampled_distribution(tree):
    """Sampled with padded steps (8,000 rows, first and second token): chi-square against the target's
    exact distributions, as tests/core/test_sampling_lossless.py (same power: a token of probability 0.10
    moved by 2.0 points); its negative control shows the test rejects the classic residual bug."""
    target = make_target("llama", seed=1, head_scale=3.0)
    draft = make_perturbed_copy(target, noise=0.15)
    settings = dict(temperature=0.9, top_k=12)
    prompt = torch.tensor([5, 17, 42, 9, 77])
    out = speculative_generate(target, draft, prompt.expand(8000, -1).contiguous(), max_new_tokens=2, tree=tree,
                               generator=torch.Generator().manual_seed(0),
                               sampling=SamplingConfig(do_sample=True, **settings), stopping=StoppingConfig.never(),
                               engine=EngineConfig(pad_widths={m: m + 2 for m in range(1, 10)}))
    p1, p2 = first_two_token_dists(target, prompt, SamplingConfig(do_sample=True, **settings))
    assert chi_square_pvalue(out.sequences[:, -2], p1) > 1e-3
    assert chi_square_pvalue(out.sequences[:, -1], p2) > 1e-3
    assert out.stats.mean_accepted_length >= 1.4


def test_bad_pad_widths_are_refused():
    target = make_target()
    ids = torch.randint(3, 100, (1, 6))
    with pytest.raises(ValueError, match="pad_widths"):
        speculative_generate(target, "ngram", ids, max_new_tokens=4, engine=EngineConfig(pad_widths={3: 2}))
    with pytest.raises(TypeError, match="pad_widths"):
        speculative_generate(target, "ngram", ids, max_new_tokens=4, engine=EngineConfig(pad_widths=[4, 5]))
    with pytest.raises(ValueError, match="pad_widths: the static step"):
        speculative_generate(target, "ngram", ids, max_new_tokens=4,
                             engine=EngineConfig(pad_widths={2: 4}, step="static"))
