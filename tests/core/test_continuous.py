"""Continuous speculative sampling on a toy autoregressive model with a closed-form density (a 2-D Gaussian
mixture autoregression): the speculative samples and target-only samples pass a two-sample energy test;
deliberately broken rules fail it.

Power: 2,000 samples per side of 3 consecutive 2-D vectors (a 6-D joint), 200 permutations (smallest
p-value 1/201 ~ 0.005); the controls below (accept every draft; resample a rejection from the target
instead of the residual) are each rejected at p < 0.01."""

import pytest
import torch

from multispec.continuous import continuous_generate
from multispec.gmm_ar import GaussianMixtureAR, GMMDrafter, GMMTarget
from multispec.rules import ContinuousVerdict, DensityRatio
from multispec.testing import energy_distance_pvalue

N, NEW = 2000, 3


@pytest.fixture(scope="module")
def models():
    target = GaussianMixtureAR.random(seed=0)
    return target, target.perturbed(noise=0.4)


class AcceptEverything(DensityRatio):
    """Broken: every draft accepted (the output is the draft's law)."""

    def accept(self, draft, target, generator=None):
        b, k, d = draft.payload.shape
        bonus = target.sample(generator)[:, k]
        return ContinuousVerdict(torch.cat([draft.payload, bonus[:, None]], 1), torch.full((b,), k))


class ResidualIsTarget(DensityRatio):
    """Broken: after a rejection, a plain target draw instead of the residual max(0, p - q)."""

    def _residual(self, target, draft, first, generator):
        rows = torch.arange(draft.payload.shape[0])
        return target.sample(generator)[rows, first], 0


def _run(models, rule, seed=0):
    target, draft = models
    start = torch.zeros(N, 1, 2)
    out = continuous_generate(GMMTarget(target), GMMDrafter(draft), start, NEW, k=3, rule=rule,
                              generator=torch.Generator().manual_seed(seed))
    return out


def test_speculative_samples_follow_the_target(models):
    target, _ = models
    out = _run(models, DensityRatio())
    reference = target.sample(torch.zeros(N, 1, 2), NEW, torch.Generator().manual_seed(99))
    assert out.values.shape == (N, 1 + NEW, 2)
    assert out.residual_fallbacks == 0
    rate = out.stats.acceptance_rate
    assert 0.2 < rate < 0.95, rate  # drafts are accepted and rejected
    assert energy_distance_pvalue(out.values[:, 1:], reference[:, 1:]) > 0.01


@pytest.mark.parametrize("broken", [AcceptEverything, ResidualIsTarget])
def test_broken_rules_fail_the_same_test(models, broken):
    target, _ = models
    out = _run(models, broken())
    reference = target.sample(torch.zeros(N, 1, 2), NEW, torch.Generator().manual_seed(99))
    assert energy_distance_pvalue(out.values[:, 1:], reference[:, 1:]) < 0.01


def test_densities_are_the_closed_form(models):
    target, _ = models
    prev = torch.randn(4, 3, 2)
    dist = target.conditionals(prev)
    x = torch.randn(4, 3, 2)
    want = torch.zeros(4, 3)
    for k in range(len(target.log_weights)):
        mean = prev @ target.matrices[k].T + target.offsets[k]
        normal = torch.distributions.Normal(mean, target.scale).log_prob(x).sum(-1)
        want = torch.logaddexp(want, target.log_weights[k] + normal) if k else target.log_weights[k] + normal
    assert torch.allclose(dist.log_prob(x), want, atol=1e-5)


def test_bad_inputs_are_refused(models):
    target, draft = models
    with pytest.raises(ValueError, match="values: expected a float"):
        continuous_generate(GMMTarget(target), GMMDrafter(draft), torch.zeros(2, 3, dtype=torch.long), 2)
    with pytest.raises(TypeError, match="drafter: NGramDrafter drafts tokens, not continuous vectors"):
        from multispec import NGramDrafter
        continuous_generate(GMMTarget(target), NGramDrafter(), torch.zeros(2, 1, 2), 2)
    with pytest.raises(ValueError, match="max_tries"):
        DensityRatio(max_tries=0)
    from multispec import speculative_generate
    from multispec.testing import make_target

    llama = make_target("llama")
    with pytest.raises(TypeError, match="drafter: GMMDrafter drafts continuous vectors, not tokens"):
        speculative_generate(llama, GMMDrafter(draft), torch.tensor([[5, 6]]))
    with pytest.raises(TypeError, match="target: LlamaForCausalLM scores token trees"):
        from multispec.targets import as_target
        continuous_generate(as_target(llama), GMMDrafter(draft), torch.zeros(2, 1, 2), 2)


class NoBonus(DensityRatio):
    """Exact without the bonus draw: a fully accepted chain commits the drafts alone."""

    def accept(self, draft, target, generator=None):
        verdict = super().accept(draft, target, generator)
        verdict.bonus = False
        return verdict


def test_skipping_the_bonus_keeps_the_target_law(models):
    """Rows one at a time (in a batch every row would have to accept every draft for the bonus to matter)."""
    target, draft = models
    g = torch.Generator().manual_seed(5)
    runs = [continuous_generate(GMMTarget(target), GMMDrafter(draft), torch.zeros(1, 1, 2), NEW, k=2, rule=NoBonus(),
                                generator=g) for _ in range(N)]
    values = torch.cat([r.values for r in runs])
    reference = target.sample(torch.zeros(N, 1, 2), NEW, torch.Generator().manual_seed(99))
    assert values.shape == (N, 1 + NEW, 2)
    # some steps committed the drafts alone (the row accepted all of them)
    assert any(step.committed == step.drafted for r in runs for step in r.stats.steps)
    assert energy_distance_pvalue(values[:, 1:], reference[:, 1:]) > 0.01
