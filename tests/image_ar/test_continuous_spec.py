"""Continuous speculative decoding over denoising trajectories on a low-dimensional diffusion-head AR
model: 4 scalar tokens, a 4-point grid, the target trained (in the fixture, ~5 s) on a Gaussian random walk
(x1 ~ N(0, 0.4²), x_{j+1} = x_j + N(0, 0.15²), clipped to [-1, 1]), so consecutive tokens are strongly
dependent (correlation ~0.9); every trajectory's density is a product of known Gaussians.

Distribution test: speculative samples and target-only samples of the 4-token joint pass a two-sample
energy test (2,000 samples per side, 200 permutations: the smallest p-value is 1/201 ~ 0.005). The same
test fails (p < 0.01) for the two ways the reference code departs from the target's law, at the draft
used here (a perturbed copy of the target; acceptance ~0.3): its hidden inner temperature (relax = 42 in
the exponent) and independent per-token judging (a rejection does not discard the later drafts). Power:
the draft alone is also rejected at p < 0.01; each broken control reaches the minimal p-value when
measured (0.005)."""

import pytest
import torch

from multispec.rules import ContinuousVerdict
from multispec.image_ar.continuous import HeadSampling, TrajectoryRatio, generate_continuous
from multispec.image_ar.continuous.patch_ar import PatchAR, PatchARConfig
from multispec.testing import energy_distance_pvalue
from walk_model import CFG, N, perturbed, walk_target, walks

@pytest.fixture(scope="module")
def trained():
    return walk_target()


@pytest.fixture(scope="module")
def pair(trained):
    return trained, perturbed(trained, 0.1)


@pytest.fixture(scope="module")
def reference(pair):
    target, _ = pair
    labels = torch.zeros(N, dtype=torch.long)
    return generate_continuous(target, labels, generator=torch.Generator().manual_seed(1)).tokens.flatten(1)


def _speculative(pair, rule, seed=4):
    target, draft = pair
    labels = torch.zeros(N, dtype=torch.long)
    return generate_continuous(target, labels, draft, tree=3, prefill=0.25, rule=rule,
                               generator=torch.Generator().manual_seed(seed))


class IndependentJudging(TrajectoryRatio):
    """Broken like the reference code: every draft judged on its own; a rejected one is replaced by a
    residual draw, the later drafts (drafted after the rejected value) are kept."""

    def accept(self, draft, target, generator=None):
        b, k, _ = draft.payload.shape
        rejected = torch.rand(b, k, generator=generator) >= self.log_ratios(draft, target).clamp(max=0).exp()
        out = torch.cat([draft.payload, draft.payload[:, -1:]], 1)
        for j in range(k + 1):
            sample, _ = self.residual(draft, target, torch.full((b,), j), generator)
            take = rejected[:, j] if j < k else torch.ones(b, dtype=torch.bool)
            out[take, j] = sample[take]
        return ContinuousVerdict(out, torch.full((b,), k), 0)


def test_speculative_samples_follow_the_target(pair, reference):
    out = _speculative(pair, TrajectoryRatio())
    assert 0.15 < out.acceptance_rate < 0.9, out.acceptance_rate  # drafts are accepted and rejected
    assert out.residual_fallbacks == 0
    assert energy_distance_pvalue(out.tokens.flatten(1), reference) > 0.01


def test_the_draft_alone_is_detectably_different(pair, reference):
    _, draft = pair
    own = generate_continuous(draft, torch.zeros(N, dtype=torch.long), generator=torch.Generator().manual_seed(3))
    assert energy_distance_pvalue(own.tokens.flatten(1), reference) < 0.01


@pytest.mark.parametrize("broken", [TrajectoryRatio(relax=42.0), IndependentJudging()], ids=["T=42", "independent"])
def test_broken_acceptance_fails_the_same_test(pair, reference, broken):
    out = _speculative(pair, broken)
    assert energy_distance_pvalue(out.tokens.flatten(1), reference) < 0.01


def test_a_draft_equal_to_the_target_is_always_accepted(pair):
    target, _ = pair
    out = generate_continuous(target, torch.zeros(50, dtype=torch.long), perturbed(target, 0.0), tree=3,
                              prefill=0.25, generator=torch.Generator().manual_seed(0))
    assert out.acceptance_rate > 0.99


def test_guided_batch_rows_and_outputs(trained):
    target = trained
    draft = perturbed(target, 0.05)
    labels = torch.tensor([0, 1, 1])
    out = generate_continuous(target, labels, draft, tree=2, sampling=HeadSampling(guidance_scale=2.0),
                              generator=torch.Generator().manual_seed(0))
    assert out.images.shape == (3, 2, 2) and out.tokens.shape == (3, 4, 1) and out.trajectories.shape == (3, 4, 4, 1)
    assert out.images.min() >= 0 and out.images.max() <= 1
    assert out.drafted > 0 and out.prefilled == 1
    # the emitted token is the last trajectory state; the image is its readout
    assert not torch.equal(out.trajectories[:, :, -1], out.tokens)


def test_bad_arguments_name_themselves(trained):
    target = trained
    with pytest.raises(ValueError, match="labels"):
        generate_continuous(target, torch.tensor([5]))
    with pytest.raises(ValueError, match="prefill"):
        generate_continuous(target, torch.tensor([0]), target, prefill=1.5)
    other = PatchAR(PatchARConfig(layers=1, **(CFG | dict(steps=5))))
    with pytest.raises(ValueError, match="steps"):
        generate_continuous(target, torch.tensor([0]), other)
    with pytest.raises(ValueError, match="guidance_scale"):
        generate_continuous(target, torch.tensor([0]), sampling=HeadSampling(guidance_scale=-1.0))
    with pytest.raises(ValueError, match="relax"):
        TrajectoryRatio(relax=0.5)
    with pytest.raises(ValueError, match="proposals"):
        TrajectoryRatio(max_tries=4, proposals=8)


def _histogram_tv(a: torch.Tensor, b: torch.Tensor, bins: int = 12) -> float:
    """Total variation between two samples' histograms on shared bins (binning can only shrink TV; with
    20,000 draws per side and 12 bins, sampling noise adds ~0.01)."""
    edges = torch.quantile(torch.cat([a, b]), torch.linspace(0, 1, bins + 1))[1:-1]
    ha = torch.bincount(torch.bucketize(a.contiguous(), edges), minlength=bins).float() / len(a)
    hb = torch.bincount(torch.bucketize(b.contiguous(), edges), minlength=bins).float() / len(b)
    return 0.5 * float((ha - hb).abs().sum())


def test_relaxed_rule_reports_a_bound_on_its_total_variation(pair):
    """The first drafted token (token 1, after the prefilled token 0) of a relaxed run departs from the
    target's law by at most the rule's reported TV per token. The exact rule reports 0; the check has power:
    the relaxed run's histogram TV is well above the exact run's (the relaxation is visible)."""
    target, draft = pair
    n = 20_000
    labels = torch.zeros(n, dtype=torch.long)
    ref = generate_continuous(target, labels, generator=torch.Generator().manual_seed(11)).trajectories[:, 1, -1, 0]
    exact = generate_continuous(target, labels, draft, tree=3, prefill=0.25,
                                generator=torch.Generator().manual_seed(12))
    relaxed = generate_continuous(target, labels, draft, tree=3, prefill=0.25, rule=TrajectoryRatio(relax=3.0),
                                  generator=torch.Generator().manual_seed(12))
    assert exact.tv_per_token == 0.0
    assert 0.02 < relaxed.tv_per_token < 1
    tv_exact = _histogram_tv(exact.trajectories[:, 1, -1, 0], ref)
    tv_relaxed = _histogram_tv(relaxed.trajectories[:, 1, -1, 0], ref)
    assert tv_exact < 0.03
    assert tv_relaxed > tv_exact + 0.02, (tv_relaxed, tv_exact)
    assert tv_relaxed <= relaxed.tv_per_token + 0.02, (tv_relaxed, relaxed.tv_per_token)


# ---- the EAGLE-style draft (`continuous.drafters`): the target's head, a predicted condition ----------------


@pytest.fixture(scope="module")
def eagle(trained):
    from multispec.image_ar.continuous import PatchEagleRecipe, train_eagle

    g = torch.Generator().manual_seed(5)
    x = walks(512, g)
    eagle, losses = train_eagle(trained, ((x + 1) / 2)[:, None], torch.randint(0, 2, (512,), generator=g),
                                PatchEagleRecipe(steps=150, batch_size=64, pool=512), progress=False)
    assert losses[-1] < losses[0]
    return eagle


def test_eagle_draft_samples_follow_the_target(trained, eagle, reference):
    """The module's energy test (2,000 samples a side, smallest p-value 0.005) on the EAGLE-style draft: the
    same test rejects the draft alone and the reference code's two broken rules (tests above), so a departure
    the size of those is caught."""
    labels = torch.zeros(N, dtype=torch.long)
    out = generate_continuous(trained, labels, eagle, tree=3, prefill=0.25, generator=torch.Generator().manual_seed(6))
    assert 0.15 < out.acceptance_rate < 0.99, out.acceptance_rate  # drafts are accepted and rejected
    # a close draft leaves a thin residual (success per try = TV(p, q)): a few rows may exhaust the 64 tries
    # and take a plain target draw; they must stay rare next to the rejections
    rejections = out.drafted - out.accepted
    assert out.residual_fallbacks <= 0.02 * rejections, (out.residual_fallbacks, rejections)
    assert energy_distance_pvalue(out.tokens.flatten(1), reference) > 0.01


def test_eagle_draft_reads_the_targets_features_of_the_committed_tokens(trained, eagle):
    """After a guided run, the draft's cache holds, at every committed position j, the pair (z_{j-1}, x_{j-1})
    of the target's condition and the emitted token, as one pass over the final sequence computes them (a
    key depends on its position's input alone): no draft feature and no rejected token was committed."""
    from multispec.continuous import continuous_generate
    from multispec.image_ar.continuous.drafters import PatchEagleDrafter
    from multispec.image_ar.continuous.targets import PatchARTarget, plain_trajectories
    from multispec.image_ar.continuous.diffusion_head import Trajectory
    from multispec.image_ar.continuous.head_sampler import HeadSampler

    labels = torch.tensor([0, 1] * 8)
    c = trained.config
    sampler = HeadSampler(trained, Trajectory.make(c.steps, c.stop), 2.0)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        prefix, _ = plain_trajectories(trained, labels, sampler, 1, g)
        adapter = PatchARTarget(trained, labels, sampler)
        drafter = PatchEagleDrafter(eagle, adapter, sampler)
        out = continuous_generate(adapter, drafter, prefix, c.tokens - 1, k=2, generator=g)
        assert 0 < out.stats.accepted < out.stats.drafted
        tokens = out.values[..., -c.token_dim:]
        both = torch.cat([labels, torch.full_like(labels, trained.null_class)])
        z = trained.transform(trained.inputs(both, tokens[:, :-1].repeat(2, 1, 1), 0))
        reference = eagle.new_cache(len(both))
        eagle(z[:, :-1], tokens[:, :-1].repeat(2, 1, 1), reference)
    n = drafter.cache.length
    assert n >= c.tokens - 3  # all but the last step's pairs were fed
    torch.testing.assert_close(drafter.cache.k[:, :, :, :n], reference.k[:, :, :, :n], atol=1e-5, rtol=1e-4)


def test_eagle_draft_must_match_the_target(trained, eagle):
    from multispec.image_ar.continuous import PatchEagle, PatchEagleConfig

    wrong = PatchEagle(PatchEagleConfig(hidden=eagle.config.hidden, heads=2, token_dim=1, tokens=9))
    with pytest.raises(ValueError, match="draft: its tokens"):
        generate_continuous(trained, torch.tensor([0]), wrong)
    with pytest.raises(TypeError, match="draft"):
        generate_continuous(trained, torch.tensor([0]), object())
    with pytest.raises(ValueError, match="layers"):
        PatchEagle(PatchEagleConfig(hidden=16, heads=2, token_dim=1, tokens=4, layers=0))
    deeper = PatchEagle(PatchEagleConfig(hidden=16, heads=2, token_dim=1, tokens=4, layers=2)).eval()
    out = generate_continuous(trained, torch.tensor([0, 1]), deeper, tree=2, generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (2, 4, 1) and out.drafted > 0 and torch.isfinite(out.tokens).all()


def test_a_row_whose_residual_tries_all_fail_takes_a_fresh_target_draw(pair, monkeypatch):
    """One try per row (`max_tries=1`): rows whose proposal is rejected fall back to a plain target draw made
    after the tries, never the rejected proposal itself (which the rejection biases toward where q/p is
    high); the fallbacks are counted."""
    from multispec.image_ar.continuous.head_sampler import HeadSampler

    target, draft = pair
    draws, calls = [], []
    sample, residual = HeadSampler.sample, TrajectoryRatio.residual

    def recorded_sample(self, cond, noise):
        states, mean = sample(self, cond, noise)
        draws.append(states.reshape(states.shape[0], -1).clone())
        return states, mean

    def recorded_residual(self, d, t, first, generator):
        draws.clear()
        result, fallbacks = residual(self, d, t, first, generator)
        calls.append((first, list(draws), result, fallbacks))
        return result, fallbacks

    monkeypatch.setattr(HeadSampler, "sample", recorded_sample)
    monkeypatch.setattr(TrajectoryRatio, "residual", recorded_residual)
    out = generate_continuous(target, torch.zeros(200, dtype=torch.long), draft, tree=3, prefill=0.25,
                              rule=TrajectoryRatio(proposals=1, max_tries=1), generator=torch.Generator().manual_seed(5))
    assert out.residual_fallbacks > 0
    checked = 0
    for first, made, result, fallbacks in calls:
        if fallbacks == 0:
            continue
        proposals, fresh = made  # the one try's proposals, then the fallbacks' own draws
        lost = [r for r in range(result.shape[0]) if any(torch.equal(result[r], f) for f in fresh)]
        assert len(lost) == fallbacks == fresh.shape[0]
        assert all(first[r] < 3 and not torch.equal(result[r], proposals[r]) for r in lost)
        checked += fallbacks
    assert checked == out.residual_fallbacks
