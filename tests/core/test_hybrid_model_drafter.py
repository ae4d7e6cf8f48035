"""HybridDrafter over a plain draft model (ModelDrafter skips the lookup steps and catches up)."""

import torch

from multispec.prompt import Prompt
from multispec import (Chain, DynamicTree, HybridDrafter, ModelDrafter, SamplingConfig, StoppingConfig,
                       speculative_generate)
from multispec.ssm.testing import make_mamba2
from multispec.testing import make_perturbed_copy, make_target, ragged_prompts


def _repeating(batch, seed):
    ids, mask = ragged_prompts(batch, seed=seed)
    ids = torch.cat([ids, ids[:, -6:], ids[:, -6:]], 1)  # repeated text: lookup finds matches
    return ids, torch.cat([mask, torch.ones(batch, 12, dtype=mask.dtype)], 1)


def test_hybrid_with_a_draft_model_is_lossless_on_attention_and_ssm_targets():
    """Attention target with a Llama draft; Mamba-2 target with a Mamba-2 draft (a stateful draft model
    catching up after lookup steps)."""
    llama, mamba2 = make_target("llama", seed=2), make_mamba2(seed=2)
    for target, draft in ((llama, make_perturbed_copy(llama)), (mamba2, make_perturbed_copy(mamba2))):
        ids, mask = _repeating(3, seed=5)
        if target.config.model_type == "mamba2":  # SSM targets take unpadded prompts in this test
            ids, mask = ids[:1, -12:], mask[:1, -12:]
        expected = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)
        for tree in (3, DynamicTree(depth=3, topk=2, total=6)):
            hybrid = HybridDrafter(draft, lookup_k=4, min_ngram=1)  # a transformers model is wrapped
            out = speculative_generate(target, hybrid, ids, attention_mask=mask, max_new_tokens=30, tree=tree,
                                       stopping=StoppingConfig.never())
            assert torch.equal(out.sequences, expected)
            assert hybrid.lookup_steps > 0 and hybrid.model_steps > 0
            assert out.stats.mean_accepted_length >= 1.8, out.stats


def test_model_drafter_after_skipped_steps_drafts_like_a_fresh_one():
    """Skip two steps (lookup drafted them), then propose: same tree as a drafter started on the whole
    committed prefix."""
    from multispec import Verdict

    draft_model = make_target("llama", seed=7)
    prompt = torch.tensor([[5, 9, 14, 22, 31]])
    d = ModelDrafter(draft_model)
    d.start(Prompt(prompt, torch.ones_like(prompt)))
    committed, root = prompt[0, :-1].tolist(), int(prompt[0, -1])  # the prompt's last token is the first root
    for accepted, bonus in (([41, 42], 43), ([], 44)):
        d.skip(torch.tensor([root]))
        k = len(accepted)
        toks = torch.tensor([accepted + [bonus] + [-1] * (3 - k)])
        path = torch.tensor([list(range(k + 1)) + [-1] * (3 - k)])
        d.commit(None, Verdict(toks, torch.tensor([k]), path))
        committed += [root] + accepted
        root = bonus
    fresh = ModelDrafter(draft_model)
    full = torch.tensor([committed + [root]])
    fresh.start(Prompt(full, torch.ones_like(full)))
    spec, greedy = DynamicTree(depth=2, topk=2, total=4), SamplingConfig()
    a, b = d.propose(torch.tensor([root]), spec, greedy), fresh.propose(torch.tensor([root]), spec, greedy)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    c = d.propose(torch.tensor([root]), Chain(3), greedy)  # proposing again is allowed before a commit
    assert c.tokens.shape == (1, 3)
