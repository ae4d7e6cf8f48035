"""The acceptance-controlled drafter: greedy output equals `generate` (it only drafts; the target decides), and
the acceptance it shows matches its setting. Power: over n ~ 1,200 drafted positions the estimate's standard
error is at most sqrt(0.25 / 1200) = 0.014, so the stated tolerance of 0.05 is 3.5 standard errors; a drafter
whose coin were off by 0.1 (or that reported the chain's whole-acceptance rate instead) fails it."""

from __future__ import annotations

import pytest
import torch

from multispec import SamplingConfig, StoppingConfig, speculative_generate
from multispec.drafters.controlled import ControlledDrafter
from multispec.testing import make_target
from multispec.tree import DynamicTree, StaticTree


@pytest.mark.parametrize("acceptance", [0.0, 0.6, 0.8, 0.9, 1.0])
def test_measured_acceptance_matches_the_setting(acceptance):
    target = make_target("llama", seed=2)
    ids = torch.randint(3, 128, (3, 6), generator=torch.Generator().manual_seed(1))
    drafter = ControlledDrafter(target, acceptance, horizon=400, seed=3)
    out = speculative_generate(target, drafter, ids, max_new_tokens=400, tree=4, stopping=StoppingConfig.never())
    want = target.generate(ids, max_new_tokens=400, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences, want)
    assert drafter.accepted + drafter.rejected > 250
    assert drafter.measured_acceptance == pytest.approx(acceptance, abs=0.05)
    if 0 < acceptance < 1:  # the accepted length of a 4-chain: 1 + p + p^2 + p^3 + p^4 in expectation
        expected = sum(acceptance ** i for i in range(5))
        assert out.stats.mean_accepted_length == pytest.approx(expected, rel=0.12)


@pytest.mark.parametrize("acceptance", [0.5, 0.8])
def test_a_static_tree_holds_the_right_token_as_often_as_its_ranks_guess(acceptance):
    """A [2, 2, 1] tree: a depth below a right parent holds the right token with q = 1 - (1 - p)^w (w = 2, 2, 1),
    so the accepted length is 1 + q1 + q1 q2 + q1 q2 q3 in expectation (within 10% over ~150 steps); greedy
    output equals `generate`, and the tree accepts more than the chain of its depth at the same p."""
    target = make_target("llama", seed=2)
    ids = torch.randint(3, 128, (3, 6), generator=torch.Generator().manual_seed(1))
    tree = StaticTree.full([2, 2, 1])
    drafter = ControlledDrafter(target, acceptance, horizon=400, seed=3)
    out = speculative_generate(target, drafter, ids, max_new_tokens=400, tree=tree, stopping=StoppingConfig.never())
    want = target.generate(ids, max_new_tokens=400, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences, want)
    q = [1 - (1 - acceptance) ** w for w in (2, 2, 1)]
    expected = 1 + q[0] + q[0] * q[1] + q[0] * q[1] * q[2]
    assert out.stats.mean_accepted_length == pytest.approx(expected, rel=0.1)
    chain = speculative_generate(target, ControlledDrafter(target, acceptance, horizon=400, seed=3), ids,
                                 max_new_tokens=400, tree=3, stopping=StoppingConfig.never())
    assert out.stats.mean_accepted_length > chain.stats.mean_accepted_length + 0.1


def test_only_greedy_chains_and_static_trees():
    target = make_target("llama", seed=2)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="sampling: the controlled drafter"):
        speculative_generate(target, ControlledDrafter(target, 0.5, 8), ids, max_new_tokens=8,
                             sampling=SamplingConfig(do_sample=True))
    with pytest.raises(ValueError, match="tree: the controlled drafter drafts chains and static trees"):
        speculative_generate(target, ControlledDrafter(target, 0.5, 8), ids, max_new_tokens=8,
                             tree=DynamicTree(2, 2, 3))
    with pytest.raises(ValueError, match="acceptance"):
        ControlledDrafter(target, 1.5, 8)
