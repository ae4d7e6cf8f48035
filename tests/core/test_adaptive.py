"""Speculation that adapts to load (`multispec.adaptive.AdaptiveChain`, `tree="auto"`): lossless whatever length
it picks (greedy equal to `generate` at batch 1 and a ragged batch; sampled output under the chi-square test of
tests/core/test_sampling_lossless.py), long chains where drafts are accepted and cheap, none where they are not
accepted or where a batch makes verifying them dear.

Mutations caught (checked by hand): pricing a chain by its expected tokens alone, without the verification's cost
(the batch-of-32 case then keeps drafting); one acceptance rate for every depth (the falling-with-depth case then
drafts 8); one commit time for every width (the growing-commit case then drafts 8); never probing after choosing k = 0 (an acceptance that recovers is
never seen); doubling the wait only when a probe accepts nothing (the probe that accepts a token now and then but
never pays keeps coming back every 4 steps); no margin over k = 0 (the near tie drafts 1); exploring every new batch size (the shrinking batch
drafts 8 at 7 rows); chains priced without what they delivered of their promise (the chain that emits one token a
step keeps drafting 1); a batch priced by its mean row's steps instead of its last row's (the chain that pays a
step but not a batch of 8 drafts 1); every step of a shrinking batch priced whole, or by the row (one of the two
shrinking-batch cases fails); no smaller size timed priced by the row (the lone batch of 8 drafts 1); the batch's
spread priced with each row's own estimate (the batch with one noisy estimate drafts 2)."""

import math

import pytest
import torch

from multispec import SamplingConfig, StoppingConfig, speculative_generate
from multispec.adaptive import AdaptiveChain, batch_steps, finish_steps
from multispec.drafters.controlled import ControlledDrafter
from multispec.drafters.model import ModelDrafter
from multispec.testing import chi_square_pvalue, first_two_token_dists, make_perturbed_copy, make_target, \
    ragged_prompts


def _timed(policy: AdaptiveChain, batch: int, verify_per_node_row: float, base: float = 1.0):
    """Feed `policy` synthetic timings: a verification costs base + per-node-row x batch x width (after the
    untimed warm-up step)."""
    policy.warmed.add(batch)
    for k in (policy.max_k, 0, policy.max_k // 2):
        rows = list(range(batch))
        policy.observe(rows, k, [0] * batch, verify_s=base + verify_per_node_row * batch * (k + 1),
                       draft_s=0.05 * k, other_s=0.1)


def test_the_choice_weighs_acceptance_against_the_cost_at_this_batch_size():
    policy = AdaptiveChain(max_k=8)
    _timed(policy, 1, verify_per_node_row=0.01)
    _timed(policy, 32, verify_per_node_row=0.2, base=0.0)  # a saturated device: time grows with rows x nodes
    policy.accepted = {r: (90, 100) for r in range(32)}  # rows that accept 9 drafts in 10
    assert policy.choose([0]) >= 6  # cheap wide verification at batch 1: a long chain
    assert policy.choose(list(range(32))) == 0  # at 32 rows every verified node costs as much: none pay
    policy.accepted = {0: (0, 60)}
    assert policy.choose([0]) == 0  # drafts never accepted: not worth even a cheap verification
    policy.accepted = {0: (90, 100)}
    assert policy.choose([0], room=3) == 2 and policy.chosen[-1] == 2  # no row can keep more than 3 tokens


def test_a_new_prompt_starts_from_what_the_rows_so_far_accepted():
    """A row of a new prompt has no history: its estimate starts from every earlier row's acceptance, pooled (worth
    a few trials), so a drafter known to be good drafts long at once, and its own record takes over from there."""
    policy = AdaptiveChain(max_k=8)
    _timed(policy, 1, verify_per_node_row=0.01)
    assert policy.choose([0]) <= 2  # no history at all: the cautious prior
    policy.observe([0], 8, [8], verify_s=1.09, draft_s=0.4, other_s=0.1)
    for _ in range(20):
        policy.observe([0], 8, [7], verify_s=1.09, draft_s=0.4, other_s=0.1)
    policy.start()  # a new prompt: row 0 is another text now
    assert not policy.accepted and policy.acceptance(0) > 0.8
    assert policy.choose([0]) >= 6


def test_acceptance_that_falls_with_depth_shortens_the_chain():
    """A drafter whose first three tokens are always accepted and whose fourth never is: one rate for every depth
    (3 in 4) would draft the longest chain; the pooled rate per depth stops it at 3."""
    policy = AdaptiveChain(max_k=8)
    _timed(policy, 1, verify_per_node_row=0.01)
    for _ in range(40):
        policy.observe([0], 8, [3], verify_s=1.09, draft_s=0.4, other_s=0.1)
    assert policy.depth_factor(1) > 1.2 and policy.depth_factor(4) < 0.2
    assert policy.choose([0]) == 3


def test_a_commit_that_grows_with_the_chain_is_priced_by_width():
    """The step's time beyond drafting and verifying (mostly the commit: a long chain commits more) is kept per
    width: with a flat verification and a commit of 0.1 + 0.5 k, rows that accept 9 drafts in 10 draft 3 or 4, not
    the longest chain (which one cost for every width would pick)."""
    policy = AdaptiveChain(max_k=8)
    policy.warmed.add(1)
    for k in (8, 0, 4, 2, 6):
        policy.observe([0], k, [0], verify_s=1.0, draft_s=0.0, other_s=0.1 + 0.5 * k)
    policy.accepted = {0: (90, 100)}
    policy.pooled = (0, 0)
    policy.by_depth.clear()
    assert 3 <= policy.choose([0]) <= 4


def test_it_looks_again_every_few_steps():
    """After a run of k = 0 it drafts the cheapest chain (an acceptance that recovers is seen), and a probe that
    accepts nothing doubles the wait for the next; after a run of chains it tries longer (the longest that would keep
    half a token more: a width timed once on a busy machine is timed again; one longer where drafts are barely
    accepted), then one shorter."""
    policy = AdaptiveChain(max_k=4, probe_every=5)
    _timed(policy, 1, verify_per_node_row=0.5)
    policy.accepted = {0: (0, 50)}
    choices = []
    for _ in range(25):
        k = policy.choose([0])
        choices.append(k)
        policy.observe([0], k, [0], verify_s=1.0 + 0.5 * (k + 1), draft_s=0.05 * k, other_s=0.1)
    assert choices == [0, 0, 0, 0, 1] + [0] * 9 + [1] + [0] * 10  # probes at steps 5, then 15 (the wait doubled)
    policy = AdaptiveChain(max_k=4, probe_every=3)
    _timed(policy, 1, verify_per_node_row=0.0)
    policy.verify_s.update({(1, 2): 3.0})  # two nodes cost more than three (a CPU's kernels do that)
    policy.accepted = {0: (0, 50)}
    assert [policy.choose([0]) for _ in range(3)] == [0, 0, 2]  # the cheapest chain to probe with: three nodes
    policy = AdaptiveChain(max_k=4, probe_every=5)
    _timed(policy, 1, verify_per_node_row=0.0)
    policy.verify_s[(1, 5)] = 50.0  # the longest chain timed once, slow
    policy.accepted = {0: (95, 100)}
    choices = [policy.choose([0]) for _ in range(10)]
    # width 4 priced between the cheap 3 and the slow 5: 2 chosen; probes at the longest (the slow width, timed
    # again: it keeps 1.7 tokens more), then one shorter
    assert choices == [2, 2, 2, 2, 4, 2, 2, 2, 2, 1]
    policy = AdaptiveChain(max_k=8, probe_every=5)  # drafts accepted 1 in 3: the probe goes one longer only
    _timed(policy, 1, verify_per_node_row=0.0)
    policy.verify_s.update({(1, w): 1.0 + 0.05 * w for w in range(1, 10)})
    policy.accepted, policy.pooled = {0: (30, 100)}, (0, 0)
    choices = [policy.choose([0]) for _ in range(5)]
    assert choices[:4] == [choices[0]] * 4 and 0 < choices[0] < 8 and choices[4] == choices[0] + 1


def test_a_probe_that_does_not_pay_doubles_the_wait_even_when_it_accepts_something():
    """A drafter accepted now and then (one draft in five) whose probes cost a switching step (a head catching up on
    the skipped tokens: a probe's step takes 3x a plain one): each probe accepts a token at times but never pays,
    so the waits double (16, 32, 64, ...); a probe that pays resets the wait."""
    policy = AdaptiveChain(max_k=4, probe_every=4)
    _timed(policy, 1, verify_per_node_row=0.5)
    policy.accepted, policy.pooled = {0: (0, 50)}, (0, 0)
    probes = []
    for step in range(60):
        k = policy.choose([0])
        if k:
            probes.append(step)
        policy.observe([0], k, [1 if k and len(probes) % 2 else 0], verify_s=1.5 if k == 0 else 4.5, draft_s=0.0,
                       other_s=0.0)
    assert probes[:3] == [3, 11, 27]  # waits 4, then 8, then 16: accepted tokens did not make them pay
    policy._since_probe, policy._wait = 0, 16
    policy._probing = True
    policy.observe([0], 1, [1], verify_s=0.5, draft_s=0.0, other_s=0.0)  # 2 tokens in a third of a plain step
    assert policy._wait == 0


def test_a_chain_must_clearly_beat_none():
    """Where a chain promises tokens per second within `margin` of no chain (a drafter barely accepted), k = 0:
    a near tie is within the timings' noise, and a wrong chain is dearer than a wrong k = 0."""
    def policy_at(margin):
        policy = AdaptiveChain(max_k=4, margin=margin)
        policy.warmed.add(1)
        for k in (4, 0, 2, 1, 3):  # a chain of 1 costs 1.2 plain steps, and its draft is accepted 1 in 5 (+2%)
            policy.observe([0], k, [0], verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0)
        policy.accepted, policy.pooled = {0: (2240, 10000)}, (0, 0)
        policy.prior_weight = 0.0
        return policy
    assert policy_at(0.0).choose([0]) == 1
    assert policy_at(0.03).choose([0]) == 0



def _simulated_finish(accept: float, k: int, rows: int, room: int, trials: int = 2000) -> float:
    """The mean number of steps until every one of `rows` rows has emitted `room` tokens, each step emitting
    1 + (drafts kept) tokens a row, each of k drafts kept with probability `accept` after its predecessors."""
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(trials, rows, room, generator=gen, dtype=torch.float64)
    kept = (torch.log(u) / math.log(accept)).floor().clamp(max=k) if accept > 0 else torch.zeros_like(u)
    emitted = (1 + kept).cumsum(-1)
    steps = (emitted < room).sum(-1) + 1  # the first step at which a row has its room
    return steps.amax(-1).double().mean().item()


@pytest.mark.parametrize("accept,k", [(0.3, 1), (0.8, 8)], ids=["barely-k1", "often-k8"])
def test_the_batch_waits_for_its_unluckiest_row(accept, k):
    """`finish_steps`: the expected steps until the last of a batch's rows has its room, against a simulated
    batch (its rows' tokens drawn step by step): within 5% at B = 1..32. At B = 32 the last row needs 10-40% more
    steps than the mean row (the mutation that takes the mean row's steps for the batch's is off by that)."""
    t = [1.0]
    for _ in range(k):
        t.append(t[-1] * accept)
    mean = sum(t)
    square = 1 + sum((2 * j + 1) * t[j] for j in range(1, k + 1))
    moments = (mean, square - mean * mean)
    for rows in (1, 8, 32):
        assert finish_steps([moments] * rows, [64] * rows) == pytest.approx(
            _simulated_finish(accept, k, rows, 64), rel=0.05)
    assert finish_steps([(1.0, 0.0)] * 3, [5, 9, 7]) == 9  # one token a step: exactly the largest room
    assert _simulated_finish(accept, k, 32, 64) > 1.09 * 64 / mean


def test_a_chain_that_pays_a_step_but_not_a_batch_gives_way_to_none():
    """A chain of 1 at 1.2 plain steps' cost whose draft is kept 3 times in 10 emits 8% more tokens per second a
    step than none. With 64 tokens left for each of 8 rows, the batch ends when its unluckiest row does (about 3.5
    steps past the mean row's 49), and the chain's 52.7 steps x 1.2 cost as much as none's 64 (+1%, under the 3%
    margin): none. The same chain pays a lone row, a batch with a long way to go, and a step priced on its own
    (no room given)."""
    policy = AdaptiveChain(max_k=4)
    for batch in (1, 8):
        policy.warmed.add(batch)
        for k in (4, 0, 2, 1, 3):
            policy.observe(list(range(batch)), k, [0] * batch, verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0)
    policy.accepted, policy.pooled, policy.prior_weight = {r: (3000, 10000) for r in range(8)}, (0, 0), 0.0
    policy.prior = (3.0, 7.0)  # the pooled rate the batch is priced at: the rows' own
    rows = list(range(8))
    assert policy.choose(rows, room=64) == 0
    assert policy.choose(rows, room=[64] * 8) == 0
    assert policy.choose([0], room=64) == 1
    assert policy.choose(rows, room=100_000) == 1
    assert policy.choose(rows) == 1
    with pytest.raises(ValueError, match="room"):
        policy.choose(rows, room=[64] * 7)
    alone = AdaptiveChain(max_k=4)  # no smaller batch timed: the batch's last steps are priced as whole steps
    alone.warmed.add(8)
    for k in (4, 0, 2, 1, 3):
        alone.observe(rows, k, [0] * 8, verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0)
    alone.accepted, alone.pooled, alone.prior_weight = {r: (3000, 10000) for r in rows}, (0, 0), 0.0
    alone.prior = (3.0, 7.0)
    assert alone.choose(rows, room=64) == 0


def test_the_batch_spread_is_priced_at_the_pooled_rate():
    """Seven rows accepting 9 drafts in 10 and one whose estimate is 0.51 after three early rejections (a noisy
    estimate, not a slow row): priced with each row's own estimate the batch would wait for that row and draft 1-2;
    at the pooled rate, the chain of 4 that the rows' record supports."""
    policy = AdaptiveChain(max_k=4)
    rows = list(range(8))
    for batch in (8, 4):
        policy.warmed.add(batch)
        for k in (4, 0, 2, 1, 3):
            policy.observe(list(range(batch)), k, [0] * batch, verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0)
    policy.pooled, policy.by_depth = (9000, 10000), {d: (9000, 10000) for d in range(1, 5)}
    policy.accepted = {**{r: (9000, 10000) for r in range(7)}, 7: (0, 3)}
    assert policy.acceptance(7) == pytest.approx(0.51, abs=0.01)
    assert policy.acceptance(0) == pytest.approx(0.9, abs=0.01)
    assert policy.choose(rows, room=64) == 4



def test_a_batch_of_equal_rooms_never_beats_its_steps():
    """What lets the policy skip pricing the batch where no chain pays a step: with equal rooms, a chain's tokens
    per (whole-batch) step over the batch's end are at most its expected tokens a step, whatever the rows'
    acceptance and the share of the step that stays as rows finish."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        rows = int(torch.randint(2, 33, (1,), generator=gen))
        room, k = int(torch.randint(1, 200, (1,), generator=gen)), 8
        share = float(torch.rand(1, generator=gen))
        moments = []
        for a in torch.rand(rows, generator=gen).tolist():
            reach = [a ** j for j in range(k + 1)]
            mean = sum(reach)
            moments.append((mean, 1 + sum((2 * j + 1) * reach[j] for j in range(1, k + 1)) - mean * mean))
        tokens = sum(m for m, _ in moments)
        assert rows * room / batch_steps(moments, [room] * rows, share) <= tokens * (1 + 1e-9)

@pytest.mark.parametrize("by_the_row", [False, True], ids=["flat", "by-the-row"])
def test_a_shrinking_batch_costs_what_its_rows_cost(by_the_row):
    """The chain of the test above at 8 rows, with a batch of 4 also timed: where a step of 4 rows costs what 8
    do (the weights read once a step), the batch's last steps cost a whole step each and the chain loses (none);
    where it costs half (a small model, by the row), a straggler costs only its own row and the chain's 8% a step
    stands (1). The mutations that price every step whole, or every step by the row, each fail one case."""
    policy = AdaptiveChain(max_k=4)
    for batch in (8, 4):
        policy.warmed.add(batch)
        scale = batch / 8 if by_the_row else 1.0
        for k in (4, 0, 2, 1, 3):
            policy.observe(list(range(batch)), k, [0] * batch, verify_s=(1.0 + 0.2 * k) * scale, draft_s=0.0,
                           other_s=0.0)
    policy.accepted, policy.pooled, policy.prior_weight = {r: (3000, 10000) for r in range(8)}, (0, 0), 0.0
    policy.prior = (3.0, 7.0)  # the pooled rate the batch is priced at: the rows' own
    assert policy.choose(list(range(8)), room=64) == (1 if by_the_row else 0)

def _pinned(policy: AdaptiveChain, accepted: tuple[int, int]) -> None:
    """The rows' acceptance estimate held at `accepted` (what a biased estimate would say, whatever they do)."""
    policy.accepted, policy.pooled, policy.prior_weight = {0: accepted}, (0, 0), 0.0


def test_chains_that_deliver_less_than_they_promise_give_way_to_none():
    """A chain of 1 priced 10% above none (its draft estimated to be accepted 1 in 3; it costs 1.2 plain steps)
    whose steps emit one token each: a cost or an estimate the model gets wrong (a head's catch-up, a row that
    accepts less than its prior says). What the chains delivered of their promise scales it, so the policy goes to
    k = 0; probes that deliver bring the chain back. One step that draws nothing does not end the chains."""
    policy = AdaptiveChain(max_k=4, probe_every=4)
    policy.warmed.add(1)
    for k in (4, 0, 2, 1, 3):
        policy.observe([0], k, [0], verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0)
    picks = []
    for _ in range(24):
        _pinned(policy, (1000, 3000))
        k = policy.choose([0])
        picks.append(k)
        policy.observe([0], k, [0], verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0, promised=policy.promise)
    assert picks[0] == 1 and policy.delivery(1) < 0.9
    assert picks[-8:].count(0) >= 6, picks  # no chains but the probes
    for _ in range(24):  # the chain now delivers: each draft accepted
        _pinned(policy, (1000, 3000))
        k = policy.choose([0])
        picks.append(k)
        policy.observe([0], k, [min(k, 1)], verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0,
                       promised=policy.promise)
    assert sum(k >= 1 for k in picks[-8:]) >= 6, picks  # chains again, but for a probe one shorter now and then
    fresh = AdaptiveChain(max_k=4)
    fresh.warmed.add(1)
    for k in (4, 0, 2, 1, 3):
        fresh.observe([0], k, [0], verify_s=1.0 + 0.2 * k, draft_s=0.0, other_s=0.0)
    _pinned(fresh, (9000, 10000))  # drafts accepted 9 in 10: a chain of 4 promises 3x a plain step's rate
    assert fresh.choose([0]) == 4
    fresh.observe([0], 4, [0], verify_s=1.8, draft_s=0.0, other_s=0.0, promised=fresh.promise)  # one unlucky step
    _pinned(fresh, (9000, 10000))
    assert fresh.choose([0]) == 4 and 0.4 < fresh.delivery(1) < 1


def test_a_batch_that_shrinks_as_rows_finish_borrows_the_full_batch_costs():
    """Rows that finish shrink a batch a row at a time (8 -> 7 -> 6): those sizes take the nearest explored
    size's costs instead of exploring (the longest chain's steps, where the drafts are not accepted, at the end of
    every generation), scaled to the level timed at their own size once one width is."""
    policy = AdaptiveChain(max_k=8)
    _timed(policy, 8, verify_per_node_row=0.1)  # width w at 8 rows: 1 + 0.8 w
    policy.accepted, policy.pooled = {r: (1, 50) for r in range(8)}, (1, 50)
    assert policy.choose(list(range(7))) == 0 and policy.choose(list(range(6))) == 0
    assert policy._verify(7, 5) == pytest.approx(1 + 0.8 * 5)  # the shape of 8's costs
    policy.warmed.add(7)
    policy.observe(list(range(7)), 0, [0] * 7, verify_s=0.9, draft_s=0.0, other_s=0.1)
    assert policy._verify(7, 5) == pytest.approx(0.9 * (1 + 0.8 * 5) / 1.8)  # at 7's own level
    assert policy._near(4) is None  # half the size: explored anew


@pytest.mark.parametrize("rows", [1, 3], ids=["B1", "ragged-B3"])
def test_greedy_output_is_generates_whatever_it_picks(rows):
    """Drafts right 9 times in 10, and never: both equal `generate`; the first keeps long chains, the second falls
    to none as its rows' estimates fall. The verification's cost is given (a step's base and a tenth of it per
    node), so the choices do not depend on this machine's load."""
    model = make_target("llama", seed=2)
    ids, mask = ragged_prompts(rows, seed=1)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=60, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    late = {}
    for acceptance in (0.9, 0.0):
        policy = AdaptiveChain(max_k=6, verify_cost=lambda batch, width: batch * (1.0 + 0.1 * width))
        out = speculative_generate(model, ControlledDrafter(model, acceptance=acceptance, horizon=60), ids,
                                   attention_mask=mask,
                                   max_new_tokens=60, tree=policy, stopping=StoppingConfig.never())
        assert torch.equal(out.sequences[:, : want.shape[1]], want), acceptance
        late[acceptance] = policy.chosen[-10:-2]  # the last steps are cut to the room left
        if acceptance:
            assert out.stats.mean_accepted_length > 2.5 and min(late[acceptance]) >= 4, late
    assert sum(late[0.0]) <= 1, late  # no drafts (a probe at most) once none is accepted


def test_a_session_holds_each_chain_step_to_its_own_promise():
    """The session reads a step's timings one step later: the promise it hands `observe` is that step's own (the
    next step's choice must not overwrite it), so a drafter right 9 times in 10 keeps the chains' delivery
    recorded and near its promise on this machine's own timings."""
    model = make_target("llama", seed=2)
    ids, mask = ragged_prompts(1, seed=1)
    policy = AdaptiveChain(max_k=6)
    out = speculative_generate(model, ControlledDrafter(model, acceptance=0.9, horizon=60), ids, attention_mask=mask,
                               max_new_tokens=60, tree=policy, stopping=StoppingConfig.never())
    chain_steps = sum(k > 0 for k in policy.chosen[4:-1])  # past the warm-up and exploration; the last is never read
    got, owed, steps = policy.delivered[1]
    assert steps > 0.5 * min(chain_steps, 10) and 0.4 < policy.delivery(1) < 2.5, (policy.chosen, policy.delivered)
    assert out.stats.mean_accepted_length > 2.5


@pytest.mark.slow
def test_sampled_output_keeps_the_target_law():
    """The chi-square test of tests/core/test_sampling_lossless.py (N = 8,000, level 1e-3) with the policy choosing
    the lengths; its negative controls live there."""
    target = make_target("llama", seed=1, head_scale=3.0)
    draft = ModelDrafter(make_perturbed_copy(target, noise=0.15))
    prompt = torch.tensor([5, 17, 42, 9, 77])
    sampling = SamplingConfig(do_sample=True, temperature=0.9, top_k=12)
    out = speculative_generate(target, draft, prompt.expand(8000, -1).contiguous(), max_new_tokens=2,
                               tree=AdaptiveChain(max_k=3), sampling=sampling,
                               generator=torch.Generator().manual_seed(0), stopping=StoppingConfig.never())
    p1, p2 = first_two_token_dists(target, prompt, sampling)
    assert chi_square_pvalue(out.sequences[:, -2], p1) > 1e-3 and chi_square_pvalue(out.sequences[:, -1], p2) > 1e-3
    assert out.stats.mean_accepted_length >= 1.4  # the first step drafts (a new batch size starts with max_k)


def test_tree_auto_and_bad_settings():
    model = make_target("llama", seed=2)
    out = speculative_generate(model, "ngram", torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]]), max_new_tokens=12,
                               tree="auto", stopping=StoppingConfig.never())
    assert out.sequences.shape[1] == 20
    with pytest.raises(ValueError, match="tree: the one named shape is 'auto'"):
        speculative_generate(model, "ngram", torch.tensor([[5, 6]]), max_new_tokens=2, tree="adaptive")
    with pytest.raises(ValueError, match="max_k: expected an int >= 1"):
        AdaptiveChain(max_k=0)
    with pytest.raises(ValueError, match="margin: expected a number >= 0"):
        AdaptiveChain(margin=-0.1)


def test_steps_without_drafts_skip_an_eagle_head_which_catches_up_when_it_drafts_again():
    """k = 0 with a drafter that can sit a step out (an EAGLE head queues the committed tokens): it is not run, and
    its next draft feeds everything it missed in one pass; the output stays `generate`'s. An untrained head is
    never accepted, so the policy falls to k = 0 and probes now and then."""
    from multispec.drafters.eagle import EagleDrafter
    from multispec.testing import make_eagle_head

    model = make_target("llama", seed=2)
    torch.manual_seed(0)
    drafter = EagleDrafter(make_eagle_head(), model)
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda *a, **k: proposals.append(1) or propose(*a, **k)
    ids, mask = ragged_prompts(2, seed=4)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=48, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    policy = AdaptiveChain(max_k=4, probe_every=4, verify_cost=lambda batch, width: batch * (1.0 + 0.2 * width))
    out = speculative_generate(model, drafter, ids, attention_mask=mask, max_new_tokens=48, tree=policy,
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, : want.shape[1]], want)
    zeros = sum(k == 0 for k in policy.chosen)
    assert zeros >= len(policy.chosen) // 2 and len(proposals) == len(policy.chosen) - zeros
