"""Speculative sampling with SSM targets reproduces the target's distribution (chi-square at the first and
second token: the second depends on the tree scan when drafts were accepted and on the committed state
when they were not), with a negative control: a commit that drops the root's update fails the same test.

Power (N = 4,000 rows, level 1e-3, 90%): a token of probability 0.10 moved by 2.9 points, one of 0.01 by 1.0
point; the rule-level tests (tests/kernels/test_verify_distribution.py) carry the fine-grained power, these
check that the SSM adapters feed the rule the right distributions."""

import pytest
import torch

from multispec import DynamicTree, SamplingConfig, StoppingConfig, speculative_generate
from multispec.ssm import BambaTarget, GraniteMoeHybridTarget, Mamba2Target, NemotronHTarget
from multispec.ssm.testing import (make_bamba, make_falcon_h1, make_falcon_mamba, make_granite_hybrid, make_jamba,
                                   make_lfm2, make_mamba2, make_nemotron_h, make_qwen3_next,
                                   make_zamba2)
from multispec.testing import chi_square_pvalue, first_two_token_dists, make_perturbed_copy

N = 4000
SETTINGS = dict(temperature=0.9, top_k=12)
PROMPT = torch.tensor([5, 17, 42, 9, 77])


def _draws(target, seed=0):
    model = target if isinstance(target, torch.nn.Module) else target.model  # a model or its adapter
    draft = make_perturbed_copy(model, noise=0.1, seed=3)  # q != p, but often accepted
    ids = PROMPT.expand(N, -1).contiguous()
    return speculative_generate(target, draft, ids, max_new_tokens=2, tree=DynamicTree(depth=2, topk=3, total=6),
                                generator=torch.Generator().manual_seed(seed),
                                sampling=SamplingConfig(do_sample=True, **SETTINGS), stopping=StoppingConfig.never())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mamba2", "falcon_mamba", "bamba", "granite", "nemotron", "jamba", "falcon_h1",
                                  "lfm2", "zamba2", "qwen3_next"])
def test_exact_rule_reproduces_ssm_target_distribution(kind):
    """Power (`detectable_deviation(4000, 0.1, 12)`, level 1e-3, 90%): a 0.10 token moved by 2.8 points.
    Negative control: `test_negative_control_broken_commit_fails` below."""
    model = {"mamba2": make_mamba2, "falcon_mamba": make_falcon_mamba, "bamba": make_bamba,
             "granite": make_granite_hybrid, "nemotron": make_nemotron_h, "jamba": make_jamba,
             "falcon_h1": make_falcon_h1, "lfm2": make_lfm2, "zamba2": make_zamba2,
          "qwen3_next": make_qwen3_next}[kind](seed=1)
    out = _draws(model)
    p1, p2 = first_two_token_dists(model, PROMPT, SamplingConfig(do_sample=True, **SETTINGS))
    assert chi_square_pvalue(out.sequences[:, -2], p1) > 1e-3
    assert chi_square_pvalue(out.sequences[:, -1], p2) > 1e-3
    assert out.stats.mean_accepted_length >= 1.3, out.stats  # of at most 2: drafts really accepted
    assert out.stats.target_forwards >= 2  # and some rows needed a second step after a commit


class DropsRootUpdate(Mamba2Target):
    """A broken commit: the accepted path loses its root, so the state misses the last committed token."""

    def commit(self, path):
        super().commit(torch.where(path == 0, -1, path))


@pytest.mark.slow
def test_negative_control_broken_commit_fails():
    model = make_mamba2(seed=1)
    out = _draws(DropsRootUpdate(model))
    _, p2 = first_two_token_dists(model, PROMPT, SamplingConfig(do_sample=True, **SETTINGS))
    assert chi_square_pvalue(out.sequences[:, -1], p2) < 1e-6


def test_bamba_adapter_is_what_the_core_picks():
    from multispec.targets import as_target

    assert isinstance(as_target(make_bamba(seed=0)), BambaTarget)
    assert isinstance(as_target(make_granite_hybrid(seed=0)), GraniteMoeHybridTarget)
    assert isinstance(as_target(make_nemotron_h(seed=0)), NemotronHTarget)
