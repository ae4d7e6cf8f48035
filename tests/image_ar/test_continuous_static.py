"""The continuous loop's fixed-shape step (`image_ar/continuous/static.py`) on the random-walk model
(`walk_model.py`), with both drafters (a perturbed copy of the target, an EAGLE-style draft on the target's head):

- one step drafts and judges as the eager loop's step on the same draws (guided and not);
- after a generation, every cache holds what one pass over the output computes (nothing rejected committed);
- the output follows the target's law: the energy test of `test_continuous_spec.py` (2,000 samples a side, 200
  permutations, smallest p-value 0.005); the reference code's inner temperature (relax = 42) fails the same test
  on this step (the negative control), and a relaxed rule's TV account matches the eager loop's;
- the step compiles with `fullgraph=True` to the same output, and the loop reads the device once a step."""

import pytest
import torch

from multispec import EngineConfig
from multispec.image_ar.continuous import (PatchEagle, PatchEagleRecipe, TrajectoryRatio, generate_continuous,
                                          train_eagle)
from multispec.image_ar.continuous.diffusion_head import Trajectory
from multispec.image_ar.continuous.drafters import PatchARDrafter, PatchEagleDrafter
from multispec.image_ar.continuous.head_sampler import HeadSampler
from multispec.image_ar.continuous import static
from multispec.image_ar.continuous.static import StaticContinuous
from multispec.image_ar.continuous.targets import PatchARTarget, plain_trajectories
from multispec.testing import CountReads, energy_distance_pvalue
from walk_model import N, perturbed, walk_target, walks


@pytest.fixture(scope="module")
def trained():
    return walk_target()


@pytest.fixture(scope="module")
def drafts(trained):
    g = torch.Generator().manual_seed(5)
    x = walks(512, g)
    eagle, _ = train_eagle(trained, ((x + 1) / 2)[:, None], torch.randint(0, 2, (512,), generator=g),
                           PatchEagleRecipe(steps=150, batch_size=64, pool=512), progress=False)
    return {"draft": perturbed(trained, 0.1), "eagle": eagle}


@pytest.fixture(scope="module")
def reference(trained):
    labels = torch.zeros(N, dtype=torch.long)
    return generate_continuous(trained, labels, generator=torch.Generator().manual_seed(1)).tokens.flatten(1)


def _engine(target, labels, draft, guidance, k=3, rule=None, **options):
    c = target.config
    trajectory = Trajectory.make(c.steps, c.stop)
    p = HeadSampler(target, trajectory, guidance)
    q = p if isinstance(draft, PatchEagle) else HeadSampler(draft, trajectory, guidance)
    return StaticContinuous(target, labels, p, draft, q, k, rule or TrajectoryRatio(), **options)


@pytest.mark.parametrize("guidance", [None, 2.0], ids=["unguided", "guided"])
@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_one_static_step_drafts_and_judges_as_the_eager_step(trained, drafts, kind, guidance):
    labels, k = torch.tensor([0, 1] * 16), 3
    engine = _engine(trained, labels, drafts[kind], guidance, k)
    p, q = engine.p, engine.q
    with torch.no_grad():
        prefix, _ = plain_trajectories(trained, labels, p, 1, torch.Generator().manual_seed(0))
        adapter = PatchARTarget(trained, labels, p)
        drafter = PatchEagleDrafter(drafts[kind], adapter, p) if kind == "eagle" else PatchARDrafter(drafts[kind],
                                                                                                      labels, q)
        adapter.prefill(prefix)
        drafter.start(prefix)
        g = torch.Generator().manual_seed(7)
        proposal = drafter.propose(prefix[:, -1], k, g)
        nodes = adapter.score(torch.cat([prefix[:, -1:], proposal.payload], 1))
        verdict = engine.rule.accept(proposal, nodes, g)
        engine.prefill(prefix, 3)
        payload, readouts, counts = engine.run_step(engine.draw(torch.Generator().manual_seed(7)))
        b = len(labels)
        rows = torch.arange(b).repeat_interleave(k)
        want_reads = p.readout(nodes.node(rows, torch.arange(k).repeat(b)),
                               proposal.payload[..., -p.dim:].reshape(b * k, -1)).view(b, k, -1)
    first = counts[:b]
    assert torch.equal(first, verdict.num_accepted)
    assert 0 < int(first.sum()) < b * k  # drafts accepted and rejected
    for r in range(b):
        a = int(first[r])
        torch.testing.assert_close(payload[r, :a], proposal.payload[r, :a])
        torch.testing.assert_close(readouts[r, :a], want_reads[r, :a], atol=1e-5, rtol=1e-4)
    n = int(first.min())
    assert int(counts[-1]) == n + 1 and int(engine.target_len) == 1 + n + 1  # lockstep: the shortest run plus one


@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_after_a_static_generation_every_cache_holds_one_pass_over_the_output(trained, drafts, kind):
    labels = torch.tensor([0, 1])  # two rows: steps keep several tokens
    engine = _engine(trained, labels, drafts[kind], 2.0, k=2)
    c = trained.config
    with torch.no_grad():
        prefix, _ = plain_trajectories(trained, labels, engine.p, 1, torch.Generator().manual_seed(2))
        result = engine.generate(prefix, c.tokens - 1, torch.Generator().manual_seed(7))
        stats = result.output.stats
        assert 0 < stats.accepted < stats.drafted and result.steps == len(stats.steps)
        assert max(step.committed for step in stats.steps) > len(labels)
        tokens = result.output.values[..., -c.token_dim:].repeat(2, 1, 1)
        both = torch.cat([labels, torch.full_like(labels, trained.null_class)])
        target_ref = trained.new_cache(len(both))
        z = trained.transform(trained.inputs(both, tokens[:, :-1], 0), target_ref)
        if kind == "eagle":
            draft_ref, cache, length = drafts[kind].new_cache(len(both)), engine.draft_cache, c.tokens - 1
            drafts[kind](z[:, :-1], tokens[:, :-1], draft_ref)
        else:
            draft_ref, cache, length = drafts[kind].new_cache(len(both)), engine.draft_runner.cache, c.tokens
            drafts[kind].transform(drafts[kind].inputs(both, tokens[:, :-1], 0), draft_ref)
    made = int(engine.made)  # the new tokens committed (the last step's may overhang the image)
    assert made >= c.tokens - 1 and int(engine.target_len) == 1 + made and int(engine.draft_len) == 1 + made
    torch.testing.assert_close(engine.runner.cache.k[..., :c.tokens, :], target_ref.k[..., :c.tokens, :], atol=1e-5,
                               rtol=1e-4)
    torch.testing.assert_close(cache.k[..., :length, :], draft_ref.k[..., :length, :], atol=1e-5, rtol=1e-4)
    assert result.readouts.shape == (len(labels), c.tokens - 1, c.token_dim)


@pytest.mark.parametrize("bonus", [False, True], ids=["no-bonus", "bonus"])
def test_a_draft_equal_to_the_target_keeps_every_draft_and_the_bonus_when_asked(trained, bonus):
    """A copy of the target as the draft: every draft accepted, a step keeps k (k + 1 with the bonus draw, for
    which the draft's cache must hold the last draft too), and the draft's cache equals one pass over the output."""
    labels, k = torch.tensor([0, 1]), 2
    copy = perturbed(trained, 0.0)
    engine = _engine(trained, labels, copy, None, k=k, rule=TrajectoryRatio(bonus=bonus))
    with torch.no_grad():
        prefix, _ = plain_trajectories(trained, labels, engine.p, 1, torch.Generator().manual_seed(2))
        engine.prefill(prefix, 3)
        payload, _, counts = engine.run_step(engine.draw(torch.Generator().manual_seed(1)))
        kept = int(counts[-1])
        assert counts[:2].tolist() == [k, k] and kept == k + bonus
        tokens = torch.cat([prefix, payload[:, :kept]], 1)[..., -trained.config.token_dim:]
        reference = copy.new_cache(len(labels))
        copy.transform(copy.inputs(labels, tokens[:, :-1], 0), reference)
    assert int(engine.draft_len) == 1 + kept
    torch.testing.assert_close(engine.draft_runner.cache.k[..., :1 + kept, :], reference.k[..., :1 + kept, :],
                               atol=1e-5, rtol=1e-4)


def test_the_eagle_drafts_next_from_the_pairs_of_the_committed_tokens(trained, drafts):
    """After a step that keeps several tokens, the draft's next condition is its output at the last committed
    pair, as one pass of the draft over (the target's conditions, the tokens) of the committed sequence gives it."""
    labels = torch.tensor([0, 1])
    engine = _engine(trained, labels, drafts["eagle"], 2.0, k=2)
    with torch.no_grad():
        prefix, _ = plain_trajectories(trained, labels, engine.p, 1, torch.Generator().manual_seed(2))
        engine.prefill(prefix, 3)
        payload, _, counts = engine.run_step(engine.draw(torch.Generator().manual_seed(1)))
        kept = int(counts[-1])
        assert kept >= 2  # the seed's step keeps a draft and the correction: the index the test is about
        tokens = torch.cat([prefix, payload[:, :kept]], 1)[..., -trained.config.token_dim:].repeat(2, 1, 1)
        both = torch.cat([labels, torch.full_like(labels, trained.null_class)])
        z = trained.transform(trained.inputs(both, tokens[:, :-1], 0))
        want = drafts["eagle"](z, tokens)[:, -1]
    torch.testing.assert_close(engine.z_root, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_static_samples_follow_the_target(trained, drafts, reference, kind):
    out = generate_continuous(trained, torch.zeros(N, dtype=torch.long), drafts[kind], tree=3,
                              engine=EngineConfig(step="static"), prefill=0.25,
                              generator=torch.Generator().manual_seed(4))
    assert 0.15 < out.acceptance_rate < 0.99, out.acceptance_rate  # drafts are accepted and rejected
    assert out.residual_fallbacks <= 0.02 * (out.drafted - out.accepted)
    assert energy_distance_pvalue(out.tokens.flatten(1), reference) > 0.01
    # the drafts as good as the eager loop's (two seeds of either differ by under 0.01 here)
    eager = generate_continuous(trained, torch.zeros(N, dtype=torch.long), drafts[kind], tree=3, prefill=0.25,
                                generator=torch.Generator().manual_seed(4))
    assert abs(out.acceptance_rate - eager.acceptance_rate) < 0.03, (out.acceptance_rate, eager.acceptance_rate)


def test_the_inner_temperature_fails_the_same_test_on_the_static_step(trained, drafts, reference):
    out = generate_continuous(trained, torch.zeros(N, dtype=torch.long), drafts["draft"], tree=3,
                              engine=EngineConfig(step="static"), prefill=0.25,
                              rule=TrajectoryRatio(relax=42.0), generator=torch.Generator().manual_seed(4))
    assert energy_distance_pvalue(out.tokens.flatten(1), reference) < 0.01


def test_a_relaxed_rule_reports_the_eager_loops_tv(trained, drafts):
    """4,000 rows, relax 3: the static step's TV per token within 10% of the eager loop's (each an unbiased
    estimate of the same bound from ~12,000 judged drafts); the exact rule reports 0."""
    labels = torch.zeros(4000, dtype=torch.long)
    runs = {step: generate_continuous(trained, labels, drafts["draft"], tree=3, engine=EngineConfig(step=step),
                                      prefill=0.25, rule=TrajectoryRatio(relax=3.0),
                                      generator=torch.Generator().manual_seed(9))
            for step in ("eager", "static")}
    eager, static = runs["eager"].tv_per_token, runs["static"].tv_per_token
    assert 0.02 < eager and abs(static - eager) < 0.1 * eager, (static, eager)
    exact = generate_continuous(trained, labels[:200], drafts["draft"], tree=3, engine=EngineConfig(step="static"),
                                prefill=0.25, generator=torch.Generator().manual_seed(9))
    assert exact.tv_per_token == 0.0


def test_the_compiled_step_has_no_graph_break_and_reads_the_device_once_a_step(trained, drafts):
    labels = torch.tensor([0, 1, 1, 0])
    runs = {}
    for name, options in (("plain", {}), ("compiled", {"compile": "eager"})):  # fullgraph: a break raises
        engine = _engine(trained, labels, drafts["eagle"], 2.0, **options)
        prefix, _ = plain_trajectories(trained, labels, engine.p, 1, torch.Generator().manual_seed(2))
        with CountReads() as reads:
            runs[name] = engine.generate(prefix, trained.config.tokens - 1, torch.Generator().manual_seed(5))
        assert reads.total == runs[name].steps + 1, dict(reads.where)  # a read a step, one at the end
    assert torch.equal(runs["plain"].output.values, runs["compiled"].output.values)
    assert runs["plain"].output.stats.accepted > 0


class ReplayedStep:
    """What `capture_graph` does to a step, on the CPU: two warm-up runs, then a "graph" whose replay runs the step
    again on the captured inputs into the same output tensors."""

    def __init__(self, run, inputs, device):
        self.inputs = tuple(t.clone() for t in inputs)
        self.run = run
        for _ in range(2):
            self.outputs = run(*self.inputs)
        self.graph = self

    def replay(self):
        for out, new in zip(self.outputs, self.run(*self.inputs)):
            out.copy_(new)


@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_a_captured_step_advances_the_state_once_per_call(trained, drafts, kind, monkeypatch):
    """The capture's warm-up runs advance the lengths and the root as a step does; the engine puts them back, so a
    captured generation (emulated: `ReplayedStep`) equals the uncaptured one on the same draws."""
    monkeypatch.setattr(static, "capture_graph", ReplayedStep)
    labels = torch.tensor([0, 1])
    runs = {}
    for captured in (False, True):
        engine = _engine(trained, labels, drafts[kind], 2.0, k=2)
        engine.cuda_graphs = captured
        with torch.no_grad():
            prefix, _ = plain_trajectories(trained, labels, engine.p, 1, torch.Generator().manual_seed(2))
            runs[captured] = engine.generate(prefix, trained.config.tokens - 1, torch.Generator().manual_seed(7))
        assert (engine._graph is not None) == captured
    assert runs[True].steps == runs[False].steps > 1
    assert torch.equal(runs[True].output.values, runs[False].output.values)


def test_bad_arguments_name_themselves(trained, drafts):
    with pytest.raises(ValueError, match="step"):
        generate_continuous(trained, torch.tensor([0]), drafts["draft"], engine=EngineConfig(step="fast"))
    with pytest.raises(ValueError, match="tree: "):
        generate_continuous(trained, torch.tensor([0]), drafts["draft"], tree=0, engine=EngineConfig(step="static"))
    with pytest.raises(TypeError, match="rule"):
        _engine(trained, torch.tensor([0]), drafts["draft"], None, rule=object())
    with pytest.raises(ValueError, match="cuda_graphs"):
        _engine(trained, torch.tensor([0]), drafts["draft"], None, cuda_graphs=True)
