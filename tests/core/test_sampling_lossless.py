"""Speculative sampling end to end (model drafts, tree growing, the rule, commits) reproduces the target's
distribution at the first and second token (chi-square, with negative controls).

Power (N = 8,000 rows, level 1e-3, 90%): a token of probability 0.10 moved by 2.0 points, one of 0.01 by
0.7 points. The rule-level tests (tests/kernels/test_verify_distribution.py, 400,000 rows) carry the
fine-grained power; these check that real models, drafters and caches feed the rule what it expects."""

import pytest
import torch

from multispec import (AcceptanceRule, DynamicTree, EngineConfig, Exact, SamplingConfig, StaticTree, StoppingConfig,
                       Verdict, speculative_generate)
from multispec.testing import chi_square_pvalue as _pvalue
from multispec.testing import first_two_token_dists as _target_dists
from multispec.drafters.model import ModelDrafter
from multispec.testing import DECODERS, make_decoder, make_perturbed_copy, make_target

N = 8000
SETTINGS = dict(temperature=0.9, top_k=12)


@pytest.fixture(scope="module")
def models():
    target = make_target("llama", seed=1, head_scale=3.0)
    return target, make_perturbed_copy(target, noise=0.15)  # q != p, often accepted


def _draws(target, drafter, tree, rule=None, seed=0):
    prompt = torch.tensor([5, 17, 42, 9, 77])
    ids = prompt.expand(N, -1).contiguous()
    out = speculative_generate(target, drafter, ids, max_new_tokens=2, tree=tree, rule=rule,
                               generator=torch.Generator().manual_seed(seed),
                               sampling=SamplingConfig(do_sample=True, **SETTINGS), stopping=StoppingConfig.never())
    return prompt, out


@pytest.mark.slow
@pytest.mark.parametrize("tree", [3, StaticTree.full([3, 2]), DynamicTree(depth=2, topk=3, total=6),
                                  DynamicTree(depth=3, topk=3, total=8, sample_children=False)],
                         ids=["chain", "static", "dynamic", "dynamic-topk"])
def test_exact_rule_reproduces_target_distribution(models, tree):
    target, draft = models
    prompt, out = _draws(target, draft, tree)
    p1, p2 = _target_dists(target, prompt, SamplingConfig(do_sample=True, **SETTINGS))
    first, second = out.sequences[:, -2], out.sequences[:, -1]
    assert _pvalue(first, p1) > 1e-3
    assert _pvalue(second, p2) > 1e-3
    # of at most 2: the rule really accepted (one-hot top-k drafts are accepted with p(x) only)
    floor = 1.1 if isinstance(tree, DynamicTree) and not tree.sample_children else 1.4
    assert out.stats.mean_accepted_length >= floor, out.stats


class ResidualIsTarget(AcceptanceRule):
    """The classic bug: after rejecting a sampled draft, resample from p instead of norm(max(p - q, 0))."""

    def accept(self, draft, target_logits, sampling, generator=None, features=None):
        p = sampling.probs(target_logits)
        q = draft.draft_probs
        b, k = draft.tokens.shape
        out = torch.full((b, k + 1), -1, dtype=torch.long)
        acc = torch.zeros(b, dtype=torch.long)
        u = torch.rand(b, k, generator=generator)
        for r in range(b):
            a = 0
            while a < k:
                x = int(draft.tokens[r, a])
                if u[r, a] * q[r, a, x] < p[r, a, x]:
                    out[r, a] = x
                    a += 1
                else:
                    break
            out[r, a] = int(torch.multinomial(p[r, a], 1, generator=generator))
            acc[r] = a
        idx = torch.arange(k + 1)[None]
        return Verdict(out, acc, torch.where(idx <= acc[:, None], idx, -1))


@pytest.mark.slow
def test_negative_control_fails_the_same_test(models):
    target, draft = models
    prompt, out = _draws(target, draft, 3, rule=ResidualIsTarget())
    p1, _ = _target_dists(target, prompt, SamplingConfig(do_sample=True, **SETTINGS))
    assert _pvalue(out.sequences[:, -2], p1) < 1e-6


@pytest.mark.slow
def test_sampled_tree_ranked_by_its_own_draws_fails(models, monkeypatch):
    """Sampled dynamic trees keep siblings by their parent's score; keeping them by their own (EAGLE-2's
    top-k rerank applied to sampled children) biases the output, and the same test catches it."""
    import multispec.tree as tree_module

    target, draft = models
    tree = DynamicTree(depth=1, topk=3, total=2, sample_children=True)
    prompt, out = _draws(target, draft, tree)
    p1, _ = _target_dists(target, prompt, SamplingConfig(do_sample=True, **SETTINGS))
    assert _pvalue(out.sequences[:, -2], p1) > 1e-3
    monkeypatch.setattr(tree_module, "_sampled_rank_key", lambda own, group: own)
    prompt, out = _draws(target, draft, tree)
    assert _pvalue(out.sequences[:, -2], p1) < 1e-6


def _bigram_target():
    """A Llama whose one layer adds nothing (attention and MLP outputs zeroed): its next-token law depends on the
    current token alone, so a head can know it exactly."""
    target = make_target("llama", seed=4, layers=1, head_scale=3.0)
    with torch.no_grad():
        target.model.layers[0].self_attn.o_proj.weight.zero_()
        target.model.layers[0].mlp.down_proj.weight.zero_()
    return target


def _oracle_head(target, d2t):
    """An EAGLE head that drafts the bigram target's law over its draft vocabulary `d2t`: fc passes the token's
    embedding, the layer adds nothing, the norm and the LM head rows are the target's for `d2t`."""
    from multispec.drafters.eagle import EagleConfig, EagleHead

    h = target.config.hidden_size
    head = EagleHead(EagleConfig(hidden_size=h, draft_vocab_size=len(d2t), target_vocab_size=128,
                                 intermediate_size=2 * h, num_attention_heads=4, num_key_value_heads=2,
                                 rms_norm_eps=target.config.rms_norm_eps), d2t)
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        head.fc.weight[:, :h] = torch.eye(h)
        layer = head.decoder.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        head.decoder.model.norm.weight.copy_(target.model.norm.weight)
        head.decoder.lm_head.weight.copy_(target.lm_head.weight[d2t])
    return head.eval()


@pytest.mark.slow
def test_a_reduced_vocabulary_in_any_order_keeps_the_target_law():
    """An EAGLE head whose draft vocabulary (64 of 128 ids) is mapped to target ids by an unsorted `d2t`, drafting
    chains of 2 with a high acceptance (mean accepted length >= 1.5 of 2; the map leaves out the first token's
    second most likely choice, so rejections and the residual happen too): the first two sampled tokens pass the
    chi-square test above (same N and power). Mutation it must catch (checked by hand: p ~ 1e-190 on both
    seeds tried): `grow_tree` scattering the draft probabilities through the sorted map instead of `d2t` itself."""
    from multispec.drafters.eagle import EagleDrafter

    target = _bigram_target()
    prompt = torch.tensor([5, 17, 42, 9, 77])
    sampling = SamplingConfig(do_sample=True, temperature=0.9, top_k=12)
    p1, p2 = _target_dists(target, prompt, sampling)
    with torch.no_grad():  # each token's next-token law at the sampling temperature
        table = torch.softmax(target(torch.arange(128)[None]).logits[0].float() / 0.9, -1)
    order = torch.argsort(4 * p1.float() + p1.float() @ table, descending=True)  # the first token's law, then the second's
    kept = torch.cat([order[:1], order[2:65]])
    d2t = kept[torch.randperm(64, generator=torch.Generator().manual_seed(0))]
    assert not bool((d2t[1:] > d2t[:-1]).all())  # unsorted
    out = speculative_generate(target, EagleDrafter(_oracle_head(target, d2t), target), prompt.expand(N, -1).contiguous(),
                               max_new_tokens=2, tree=2, sampling=sampling, generator=torch.Generator().manual_seed(0),
                               stopping=StoppingConfig.never())
    assert out.stats.mean_accepted_length >= 1.5, out.stats
    assert p1[d2t].sum() < 0.95  # some first tokens come from the residual
    assert _pvalue(out.sequences[:, -2], p1) > 1e-3
    assert _pvalue(out.sequences[:, -1], p2) > 1e-3


def test_seeded_sampling_is_reproducible(models):
    target, draft = models
    ids = torch.tensor([[5, 17, 42, 9, 77]] * 3)
    runs = [speculative_generate(target, draft, ids, max_new_tokens=10, tree=3,
                                 generator=torch.Generator().manual_seed(123),
                                 sampling=SamplingConfig(do_sample=True, top_p=0.9), stopping=StoppingConfig.never())
            for _ in range(2)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_exact_rule_without_sampling_is_greedy(models):
    target, draft = models
    ids = torch.tensor([[5, 17, 42, 9, 77]])
    a = speculative_generate(target, draft, ids, max_new_tokens=10, rule=Exact(),
                             stopping=StoppingConfig.never())
    b = target.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(a.sequences, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", *DECODERS])
def test_static_sampling_reproduces_the_target_distribution(name):
    """Every text class of `multispec.testing.DECODERS` on the static step (and a default-RoPE Llama on the lean
    one), a perturbed copy drafting chains of 3: the first two sampled tokens pass the chi-square test above (same
    N and power); for Gemma 2 (soft-capping, alternating sliding windows) and gpt-oss (sinks) the classic residual
    bug fails it on the same engine."""
    target = make_target("llama", seed=1, head_scale=3.0) if name == "llama" else make_decoder(name, seed=1,
                                                                                              head_scale=3.0)
    draft = ModelDrafter(make_perturbed_copy(target, noise=0.15))
    prompt = torch.tensor([5, 17, 42, 9, 77])
    ids = prompt.expand(N, -1).contiguous()
    sampling = SamplingConfig(do_sample=True, **SETTINGS)
    p1, p2 = _target_dists(target, prompt, sampling)

    def draws(rule=None):
        return speculative_generate(target, draft, ids, max_new_tokens=2, tree=3, rule=rule, sampling=sampling,
                                    generator=torch.Generator().manual_seed(0), stopping=StoppingConfig.never(),
                                    engine=EngineConfig(step="static"))

    out = draws()
    assert _pvalue(out.sequences[:, -2], p1) > 1e-3
    assert _pvalue(out.sequences[:, -1], p2) > 1e-3
    assert out.stats.mean_accepted_length >= 1.4, out.stats
    assert next(iter(target.__dict__["_multispec_static_engines"].values())).static_calls > 0
    if name in ("gemma2", "gpt-oss"):
        bad = draws(ResidualIsTarget())
        assert min(_pvalue(bad.sequences[:, -2], p1), _pvalue(bad.sequences[:, -1], p2)) < 1e-3
