"""State-space and hybrid models as draft models (`multispec.ssm.StatefulDraftEngine` under `ModelDrafter`):
the engine's logits are each fed node's path decoded alone; speculation with SSM drafts is lossless for
SSM, hybrid and attention targets, batch 1 and ragged 3, with drafts really accepted."""

import functools

import pytest
import torch

from multispec import DynamicTree, ModelDrafter, SamplingConfig, StaticTree, StoppingConfig, speculative_generate, zoo
from multispec.ssm import StatefulDraftEngine
from multispec.ssm.testing import (make_bamba, make_falcon_h1, make_falcon_mamba, make_granite_hybrid, make_jamba,
                                   make_lfm2, make_mamba, make_mamba2, make_nemotron_h, make_qwen3_next,
                                   make_zamba2)
from multispec.testing import (chi_square_pvalue, first_two_token_dists, greedy_rows_alone, make_perturbed_copy,
                               ragged_prompts, source_prompts)

MAKERS = {"mamba2": make_mamba2, "mamba": make_mamba, "falcon_mamba": make_falcon_mamba, "bamba": make_bamba,
          "granite": make_granite_hybrid, "nemotron": make_nemotron_h, "jamba": make_jamba,
          "falcon_h1": make_falcon_h1, "lfm2": make_lfm2, "zamba2": make_zamba2,
          "qwen3_next": make_qwen3_next}
TREES = {"chain": 3, "static": StaticTree.full([2, 2]), "dynamic": DynamicTree(depth=3, topk=2, total=6)}


@functools.cache
def model_of(kind):
    return MAKERS[kind](seed=1)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_engine_logits_equal_each_node_decoded_alone(kind):
    """Feed a catch-up chain, then two depths of a tree (parents from earlier calls), commit a path, feed
    again: every node's logits equal the model run on that node's whole sequence."""
    model = model_of(kind)
    draft = ModelDrafter(model)
    assert draft.engine == "stateful" and isinstance(draft.lm, StatefulDraftEngine)
    engine = draft.lm
    ids, mask = ragged_prompts(2, seed=3)
    engine.start(ids, mask)
    prefix = [ids[r, mask[r].bool()][:-1].tolist() for r in range(2)]
    seqs: list[list[list[int]]] = [[], []]  # per row, the token path of each pending node

    def feed(tokens, parents):
        logits = engine.feed(torch.tensor(tokens), torch.tensor(parents)).logits
        for r in range(2):
            for m, (tok, par) in enumerate(zip(tokens[r], parents[r])):
                seqs[r].append((prefix[r] if par < 0 else seqs[r][par]) + [tok])
                with torch.no_grad():
                    want = model(torch.tensor([seqs[r][-1]])).logits[0, -1]
                assert torch.allclose(logits[r, m], want, atol=1e-4, rtol=1e-4), (r, m)

    roots = [int(ids[r, -1]) for r in range(2)]
    feed([[roots[0], 17], [roots[1], 23]], [[-1, 0], [-1, 0]])  # catch-up chain: root, then one token
    feed([[5, 6], [7, 8]], [[1, 1], [1, 0]])  # two children of node 1 (row 1: one of node 1, one of node 0)
    feed([[9], [10]], [[3], [3]])  # one more depth, under nodes fed by the previous call
    engine.commit(torch.tensor([[0, 1, 3, -1], [0, 3, 4, -1]]))  # row 0 keeps 0-1-3, row 1 keeps 0-3-4
    prefix = [seqs[0][3], seqs[1][4]]
    seqs = [[], []]
    feed([[11, 12], [13, 14]], [[-1, 0], [-1, -1]])


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("kind", list(MAKERS))
def test_ssm_draft_for_its_own_family_is_lossless(kind, tree, batch):
    target = model_of(kind)
    draft = make_perturbed_copy(target, noise=0.05, seed=2)
    ids, mask = ragged_prompts(batch, seed=batch + 4)
    n = 20
    out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=n, tree=TREES[tree],
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -n:], greedy_rows_alone(target, ids, mask, n))
    assert out.stats.mean_accepted_length >= 1.8, out.stats


@functools.cache
def _zoo(name):
    return zoo.load(name)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", ["chain", "dynamic"])
@pytest.mark.parametrize("draft_pair", ["stdlib-mamba2", "stdlib-bamba"])
def test_ssm_and_hybrid_drafts_for_a_llama_target(tree, batch, draft_pair):
    """The zoo's trained byte-level Mamba-2 and Bamba hybrid draft for the zoo's byte-level Llama (same 256-byte
    vocabulary, same corpus): a state-space and a hybrid draft model for an attention target, lossless, and most
    drafts are accepted."""
    llama, draft = _zoo("stdlib-bytes").target, _zoo(draft_pair).target
    ids, mask = source_prompts((300, 180, 240)[:batch])
    n = 32
    out = speculative_generate(llama, draft, ids, attention_mask=mask, max_new_tokens=n, tree=TREES[tree],
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -n:], greedy_rows_alone(llama, ids, mask, n))
    assert out.stats.mean_accepted_length >= 2.0, out.stats


@pytest.mark.parametrize("batch", [1, 3])
def test_zoo_mamba2_draft_for_the_zoo_ssm_targets(batch):
    """The shipped 2-layer Mamba-2 draft (`stdlib-mamba2-ssm-draft`) for the Mamba-2 target: STree with a
    state-space draft, lossless and accepted."""
    pair = _zoo("stdlib-mamba2-ssm-draft")
    ids, mask = source_prompts((300, 180, 240)[:batch])
    n = 32
    out = speculative_generate(pair.target, pair.drafter, ids, attention_mask=mask, max_new_tokens=n,
                               tree=DynamicTree(depth=4, topk=3, total=10), stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -n:], greedy_rows_alone(pair.target, ids, mask, n))
    assert out.stats.mean_accepted_length >= 2.0, out.stats


@pytest.mark.slow
def test_sampling_with_an_ssm_draft_reproduces_the_target():
    """Speculative sampling with a Mamba-2 draft (draft probabilities through the stateful engine): the first
    two tokens pass chi-square against the target (4,000 rows: a 10% token moved by 2.8 points is caught
    with 90% power; the rule-level tests in tests/kernels carry the fine-grained power)."""
    target = model_of("mamba2")
    draft = make_perturbed_copy(target, noise=0.1, seed=4)  # q != p, but often accepted
    prompt = torch.tensor([5, 17, 42, 9, 77])
    settings = dict(temperature=0.9, top_k=12)
    out = speculative_generate(target, draft, prompt.expand(4000, -1).contiguous(), max_new_tokens=2,
                               tree=DynamicTree(depth=2, topk=3, total=6), generator=torch.Generator().manual_seed(0),
                               sampling=SamplingConfig(do_sample=True, **settings), stopping=StoppingConfig.never())
    p1, p2 = first_two_token_dists(target, prompt, SamplingConfig(do_sample=True, **settings))
    assert chi_square_pvalue(out.sequences[:, -2], p1) > 1e-3
    assert chi_square_pvalue(out.sequences[:, -1], p2) > 1e-3
    assert out.stats.mean_accepted_length >= 1.3, out.stats  # of at most 2 (two new tokens)


def test_ssm_drafts_refuse_engines_they_cannot_use():
    with pytest.raises(ValueError, match="engine/window"):
        ModelDrafter(model_of("mamba2"), engine="lean")
    with pytest.raises(ValueError, match="engine/window"):
        ModelDrafter(model_of("mamba2"), window=64)
