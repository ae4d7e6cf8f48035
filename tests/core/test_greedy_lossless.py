"""Greedy speculative output must equal the target's own `generate`, token for token."""

import pytest
import torch

from multispec import DynamicTree, NGramDrafter, StaticTree, StoppingConfig, speculative_generate
from multispec.testing import KINDS, make_perturbed_copy, make_target, ragged_prompts

TREES = {
    "chain3": 3,
    "static": StaticTree.full([2, 2]),
    "dynamic": DynamicTree(depth=3, topk=3, total=8),
}


@pytest.fixture(scope="module", params=KINDS)
def pair(request):
    target = make_target(request.param)
    return request.param, target, make_perturbed_copy(target, noise=0.05)


def _generate(model, ids, mask, n, **kw):
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", list(TREES))
def test_model_drafter_matches_generate(pair, batch, tree):
    kind, target, draft = pair
    ids, mask = ragged_prompts(batch, seed=batch)
    expected = _generate(target, ids, mask, 20, eos_token_id=None)
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=20, tree=TREES[tree],
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, expected), f"{kind}/{tree}/batch {batch}"
    assert out.stats.mean_accepted_length >= 1.8, out.stats  # commits of accepted runs, rows of unequal lengths
    if batch > 1:  # every row equals that row decoded alone
        for r in range(batch):
            pad = int((mask[r] == 0).sum())
            alone = _generate(target, ids[r:r + 1, pad:], None, 20, eos_token_id=None)
            assert torch.equal(out.sequences[r, -20:], alone[0, -20:]), f"row {r}"


@pytest.mark.parametrize("batch", [1, 3])
def test_ngram_drafter_matches_generate(pair, batch):
    kind, target, _ = pair
    ids, mask = ragged_prompts(batch, seed=7)
    expected = _generate(target, ids, mask, 24, eos_token_id=None)
    out = speculative_generate(target, NGramDrafter(), ids, attention_mask=mask, max_new_tokens=24, tree=4,
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, expected), kind
    assert out.stats.mean_accepted_length >= 1.1, out.stats  # these random models loop: lookups get accepted


def test_eos_inside_accepted_draft_stops_the_row():
    target = make_target("llama")
    ids, mask = ragged_prompts(3, seed=3)
    free = _generate(target, ids, mask, 24, eos_token_id=None)
    # an EOS that row 0 emits in the middle of its output
    eos = int(free[0, ids.shape[1] + 5])
    expected = _generate(target, ids, mask, 24, eos_token_id=eos)
    # the target itself as draft: every draft accepted, so EOS lands inside an accepted draft
    out = speculative_generate(target, target, ids, attention_mask=mask, max_new_tokens=24, tree=6,
                               stopping=StoppingConfig(eos_token_id=eos, pad_token_id=0))
    assert torch.equal(out.sequences, expected)
    assert out.num_new_tokens[0] <= 6


def test_self_draft_accepts_everything():
    """A draft identical to the target must have every drafted token accepted (catches drafter-cache bugs)."""
    target = make_target("gemma3")
    ids, mask = ragged_prompts(3, seed=5)
    for tree, depth in [(3, 3), (StaticTree.full([2, 1, 1]), 3)]:
        out = speculative_generate(target, target, ids, attention_mask=mask, max_new_tokens=24, tree=tree,
                                   stopping=StoppingConfig.never())
        full_steps = out.stats.steps[:-1]  # the last step may be cut by max_new_tokens
        assert all(s.accepted == depth * s.rows for s in full_steps), tree
        assert out.stats.mean_accepted_length > depth
    # EAGLE-2 expands only the best `topk` nodes per depth by *cumulative* score, which need not contain
    # the greedy path; with the draft equal to the target it still almost always does
    out = speculative_generate(target, target, ids, attention_mask=mask, max_new_tokens=24,
                               tree=DynamicTree(depth=3, topk=3, total=21), stopping=StoppingConfig.never())
    steps = out.stats.steps[:-1]
    assert sum(s.accepted for s in steps) >= 0.9 * 3 * sum(s.rows for s in steps)


def test_max_new_tokens_zero_and_one():
    target = make_target("qwen2")
    ids, mask = ragged_prompts(2)
    out = speculative_generate(target, "ngram", ids, attention_mask=mask, max_new_tokens=0)
    assert torch.equal(out.sequences, ids)
    one = speculative_generate(target, "ngram", ids, attention_mask=mask, max_new_tokens=1,
                               stopping=StoppingConfig.never())
    assert torch.equal(one.sequences, _generate(target, ids, mask, 1, eos_token_id=None))


def test_single_token_prompt():
    target = make_target("llama")
    ids = torch.tensor([[5]])
    out = speculative_generate(target, make_perturbed_copy(target), ids, max_new_tokens=12, tree=3,
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, _generate(target, ids, None, 12, eos_token_id=None))
    assert out.stats.mean_accepted_length >= 1.8, out.stats


def test_eager_attention_matches_generate():
    """The eager path adds the mask to the scores: our masks are additive floats, so it stays exact."""
    target = make_target("llama", attn="eager")
    draft = make_perturbed_copy(target)
    ids, mask = ragged_prompts(3, seed=11)
    expected = _generate(target, ids, mask, 16, eos_token_id=None)
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=16, tree=StaticTree.full([2, 2]),
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length >= 1.8, out.stats
