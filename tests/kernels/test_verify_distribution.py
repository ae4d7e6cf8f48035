"""The lossless rules reproduce the target's distribution exactly: rule-level tests with stated power.

The "language" is a bigram model over V = 16 tokens: after token a the target's logits are LP[a] and the
drafter's LQ[a] (LP plus noise, so drafts are often, not always, accepted). Each test pushes N rows with the
same root through the real tree growing (`multispec.tree.grow_tree`) and the real `Exact` rule, in batched
calls, continuing every row until it has emitted `depth + 1` tokens, and compares by chi-square
(`multispec.testing.chi_square_pvalue`: a token of probability 0 observed fails outright):
- the first token with p(. | root);
- the first two tokens, as pairs, with p(x1 | root) p(x2 | x1);
- the last two (positions depth, depth + 1; the last is the bonus token when a whole path was accepted).

Power, at the tests' level ALPHA = 1e-3 with N = 400,000 rows: a token of probability 0.10 moved by 0.29
points (0.0029) is caught with 90% probability, one of probability 0.01 by 0.10 points, in the first-token
test (13 possible outcomes); pair tests (up to 169 outcomes) need 0.47 and 0.16 points
(`test_the_stated_power_holds` recomputes these). Each negative control is a bug a real implementation made or
could make, at its natural size on these distributions, and fails the same tests (p < 1e-6):
- siblings drawn without replacement verified as independent draws: the first token moves by at most 0.16
  points (on a token of probability 0.006), first-token p ~ 1e-62;
- the residual not renormalised between siblings: 17 points;
- the bonus token (after a fully accepted chain) not filtered by top-k: only the last pair sees it, as
  observations of impossible tokens;
- q taken from the neighbouring node: 7.7 points.
"""

import dataclasses

import pytest
import torch

import multispec.kernels.tree_verify as tree_verify
import multispec.tree as tree_module
from multispec import Chain, DynamicTree, Exact, SamplingConfig, StaticTree
from multispec.rules import Verdict
from multispec.kernels import chain_verify_random
from multispec.sampling import exponential, uniform
from multispec.testing import chi_square_pvalue, detectable_deviation
from multispec.tree import grow_tree

V, ROOT, N, ALPHA = 16, 3, 400_000, 1e-3
TOP_K = dict(temperature=0.8, top_k=12)
TOP_P = dict(temperature=1.2, top_p=0.85)
D2T = torch.tensor([11, 14, 10, 0, 2, 9, 6, 1, 12, 5])  # a reduced draft vocabulary: misses some likely tokens


def bigram(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(V, V, generator=g)
    return lp, lp + 0.7 * torch.randn(V, V, generator=g)


LP, LQ = bigram()


def exact_transition(temperature: float, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """p(next | prev) [V, V] in float64, written independently of `SamplingConfig`."""
    x = LP.double() / temperature
    if top_k is not None:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None:  # keep the most likely tokens until their mass reaches top_p
        p = torch.softmax(x, -1)
        order = p.argsort(-1, descending=True)
        before = torch.cumsum(p.gather(1, order), -1) - p.gather(1, order)
        drop = torch.zeros_like(p, dtype=torch.bool).scatter(1, order, before >= top_p)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, -1)


def one_step(roots, spec, sampling, rule, g, reduced):
    """Grow a tree after `roots` and verify it: the emitted tokens [n, depth + 1] (-1 padded) and counts."""
    lq, vocab_map = (LQ[:, D2T], D2T) if reduced else (LQ, None)
    tree = grow_tree(spec, lq[roots], lambda ids, tokens, parents: lq[tokens], sampling, g, vocab_map=vocab_map,
                     vocab_size=V if reduced else None)
    verdict = rule.accept(tree, LP[torch.cat([roots[:, None], tree.tokens], 1)], sampling, g)
    return verdict.tokens, verdict.num_accepted + 1


def emitted(spec, sampling, rule=None, reduced=False, n=N, seed=0, chunk=100_000) -> torch.Tensor:
    """The first `depth + 1` tokens of n rows that all start from ROOT: [n, depth + 1]."""
    rule, g = rule or Exact(), torch.Generator().manual_seed(seed)
    m = _depth(spec) + 1
    out = []
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        toks = torch.full((rows, m), -1, dtype=torch.long)
        have = torch.zeros(rows, dtype=torch.long)
        while (have < m).any():
            todo = (have < m).nonzero().flatten()
            last = torch.where(have[todo] > 0, toks[todo, (have[todo] - 1).clamp(min=0)], ROOT)
            new, count = one_step(last, spec, sampling, rule, g, reduced)
            for j in range(new.shape[1]):  # append each row's emitted tokens, up to m
                put = (j < count) & (have[todo] + j < m)
                toks[todo[put], have[todo[put]] + j] = new[put, j]
            have[todo] = (have[todo] + count).clamp(max=m)
        out.append(toks)
    return torch.cat(out)


def _depth(spec) -> int:
    if isinstance(spec, Chain):
        return spec.k
    if isinstance(spec, StaticTree):
        return max(len(c) for c in spec.choices)
    return spec.depth


def pvalues(tokens: torch.Tensor, transition: torch.Tensor) -> dict[str, float]:
    """Chi-square p-values of the first token, the first pair and the last pair against their exact law."""
    m = tokens.shape[1]
    law = torch.linalg.matrix_power(transition, m - 1)[ROOT]  # of token m - 1
    return {
        "first": chi_square_pvalue(tokens[:, 0], transition[ROOT]),
        "first pair": chi_square_pvalue(tokens[:, 0] * V + tokens[:, 1],
                                        (transition[ROOT][:, None] * transition).flatten()),
        "last pair": chi_square_pvalue(tokens[:, -2] * V + tokens[:, -1], (law[:, None] * transition).flatten()),
    }


CONFIGS = {
    "chain": (Chain(3), TOP_K, False),
    "static-iid-siblings": (StaticTree.full([3, 2]), TOP_K, False),
    "dynamic-sampled-siblings": (DynamicTree(depth=3, topk=3, total=8), TOP_K, False),
    "dynamic-topk-siblings": (DynamicTree(depth=3, topk=3, total=8, sample_children=False), TOP_K, False),
    "reduced-vocab-chain-top-p": (Chain(3), TOP_P, True),
    "reduced-vocab-dynamic-top-p": (DynamicTree(depth=2, topk=3, total=6), TOP_P, True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_exact_rule_reproduces_the_target(name):
    spec, settings, reduced = CONFIGS[name]
    tokens = emitted(spec, SamplingConfig(do_sample=True, **settings), reduced=reduced)
    got = pvalues(tokens, exact_transition(**settings))
    assert min(got.values()) > ALPHA, got


def test_first_draft_is_accepted_with_probability_sum_min_p_q():
    """Chain acceptance at the first position is sum_x min(p(x), q(x)) (to 4 standard errors)."""
    sampling = SamplingConfig(do_sample=True, **TOP_K)
    g = torch.Generator().manual_seed(1)
    n = 200_000
    _, count = one_step(torch.full((n,), ROOT), Chain(1), sampling, Exact(), g, reduced=False)
    p, q = sampling.probs(LP[ROOT]), sampling.probs(LQ[ROOT])
    expected = torch.minimum(p, q).sum().item()
    rate = (count == 2).double().mean().item()
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / n) ** 0.5


def test_the_stated_power_holds():
    assert detectable_deviation(N, 0.10, 13) <= 0.0029
    assert detectable_deviation(N, 0.01, 13) <= 0.0010
    assert detectable_deviation(N, 0.10, 169) <= 0.0047
    assert detectable_deviation(N, 0.01, 169) <= 0.0016


# ---- negative controls: each a realistic bug, each must fail the same test --------------------------------


def _fails(spec, settings, rule=None, reduced=False):
    got = pvalues(emitted(spec, SamplingConfig(do_sample=True, **settings), rule=rule, reduced=reduced),
                  exact_transition(**settings))
    assert min(got.values()) < 1e-6, got


@pytest.mark.slow
def test_control_siblings_without_replacement_verified_as_independent_draws(monkeypatch):
    monkeypatch.setattr(tree_module, "without_earlier", lambda q, group, position: q)
    _fails(DynamicTree(depth=3, topk=3, total=8), TOP_K)


@pytest.mark.slow
def test_control_residual_not_renormalised_between_siblings(monkeypatch):
    def unnormalised(r, scale, q):
        return (r / scale[:, None] - q).clamp(min=0.0), torch.ones_like(scale)

    monkeypatch.setattr(tree_verify, "residual_after_rejection", unnormalised)
    _fails(StaticTree.full([3, 2]), TOP_K)


class BonusNotFiltered(Exact):
    """Accepts and corrects like `Exact`, but draws the bonus token (after a fully accepted chain) from the
    temperature-scaled target without its top-k / top-p filter."""

    def accept(self, draft, target_logits, sampling, generator=None, features=None):
        b, t, v = target_logits.shape
        p = sampling.probs(target_logits)
        p[:, -1] = dataclasses.replace(sampling, top_k=None, top_p=None).probs(target_logits[:, -1])
        out, acc = chain_verify_random(draft.tokens, draft.valid.sum(1), p, draft.draft_probs,
                                       uniform((b, t - 1), generator, "cpu"), exponential((b, v), generator, "cpu"),
                                       torch.zeros(b, dtype=torch.bool))
        idx = torch.arange(t)[None]
        return Verdict(out, acc, torch.where(idx <= acc[:, None], idx, -1).expand(b, t).contiguous())


@pytest.mark.slow
def test_control_bonus_token_not_filtered():
    _fails(Chain(3), TOP_K, rule=BonusNotFiltered())


class QFromTheWrongNode(Exact):
    """Verifies each node against the draft distribution of the node before it (an off-by-one)."""

    def accept(self, draft, target_logits, sampling, generator=None, features=None):
        moved = dataclasses.replace(draft, draft_probs=draft.draft_probs.roll(1, dims=1))
        return super().accept(moved, target_logits, sampling, generator)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [Chain(3), StaticTree.full([3, 2])], ids=["chain", "static"])
def test_control_q_from_the_wrong_node(spec):
    _fails(spec, TOP_K, rule=QFromTheWrongNode())


# ---- the Triton kernels on the same inputs -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["chain", "static-iid-siblings", "dynamic-sampled-siblings",
                                  "reduced-vocab-dynamic-top-p"])
def test_kernels_decide_these_trees_as_the_torch_path(name, monkeypatch):
    """The powered tests above run the PyTorch walks; the kernels (interpreted) must take the same decisions
    on the same trees and randomness."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU needs TRITON_INTERPRET=1 (set by tests/conftest.py)")
    spec, settings, reduced = CONFIGS[name]
    sampling = SamplingConfig(do_sample=True, **settings)
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("MULTISPEC_KERNELS", backend)
        results[backend] = one_step(torch.full((48,), ROOT), spec, sampling, Exact(),
                                    torch.Generator().manual_seed(7), reduced)
    assert torch.equal(results["torch"][0], results["triton"][0])
    assert torch.equal(results["torch"][1], results["triton"][1])
