"""The random verification rules reproduce the target distribution (chi-square, with negative controls)."""

import os

import pytest
import torch
from scipy.stats import chisquare

from multispec.kernels import chain_verify_random, tree_verify_random

V = 10


def _dists(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(3, V, generator=g) * 1.5, -1)  # target after root, after d1, after d2
    q = torch.softmax(torch.randn(2, V, generator=g) * 1.5, -1)  # draft at root, after d1
    return p, q


def _pvalue(samples, probs):
    counts = torch.bincount(samples, minlength=V).double()
    expected = probs.double() / probs.double().sum() * len(samples)
    return chisquare(counts.numpy(), expected.numpy()).pvalue


def _chain_draws(n, p, q, backend="torch", broken=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    d1 = torch.multinomial(q[0], n, replacement=True, generator=g)
    d2 = torch.multinomial(q[1], n, replacement=True, generator=g)  # drafts conditioned on d1 = whatever it is;
    # the draft distribution after d1 does not depend on d1 here, and neither does the target's (p[1], p[2])
    drafts = torch.stack([d1, d2], 1)
    target = p[None].expand(n, -1, -1).contiguous()
    draft = q[None].expand(n, -1, -1).contiguous()
    uniforms = torch.rand(n, 2, generator=g)
    noise = torch.empty(n, V).exponential_(generator=g)
    if broken:  # the classic bug: resample from p instead of the residual max(p - q, 0)
        out, acc = chain_verify_random(drafts, torch.full((n,), 2), target, draft, uniforms, noise,
                                       torch.zeros(n, dtype=torch.bool), backend=backend)
        rejected = acc < 2
        race = (target[torch.arange(n), acc] / noise).argmax(-1)
        out[torch.arange(n), acc] = torch.where(rejected, race, out[torch.arange(n), acc])
        return out, acc
    return chain_verify_random(drafts, torch.full((n,), 2), target, draft, uniforms, noise,
                               torch.zeros(n, dtype=torch.bool), backend=backend)


def test_chain_reference_matches_target_distribution():
    p, q = _dists(0)
    n = 20000
    out, acc = _chain_draws(n, p, q)
    assert _pvalue(out[:, 0], p[0]) > 1e-3
    second = out[acc >= 1, 1]  # the token after an accepted first draft follows p[1]
    assert _pvalue(second, p[1]) > 1e-3
    # first-position acceptance rate = sum(min(p, q))
    expected = torch.minimum(p[0], q[0]).sum().item()
    assert abs((acc >= 1).double().mean().item() - expected) < 4 * (expected * (1 - expected) / n) ** 0.5


def test_chain_negative_control_fails():
    p, q = _dists(0)
    out, _ = _chain_draws(20000, p, q, broken=True)
    assert _pvalue(out[:, 0], p[0]) < 1e-6


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_chain_kernel_matches_target_distribution():
    p, q = _dists(1)
    out, acc = _chain_draws(1200, p, q, backend="triton", seed=1)
    assert _pvalue(out[:, 0], p[0]) > 1e-3
    bad, _ = _chain_draws(1200, p, q, backend="triton", broken=True, seed=1)
    assert _pvalue(bad[:, 0], p[0]) < 1e-3


def _tree_draws(n, p, q, with_q, backend="torch", seed=0):
    """Root with three children (i.i.d. from q[0] when with_q, else fixed distinct tokens), each with one
    child. Verification walks siblings with the residual; the first emitted token must follow p[0]."""
    g = torch.Generator().manual_seed(seed)
    t = 7  # root, children 1..3, grandchildren 4..6
    if with_q:
        kids = torch.multinomial(q[0], 3 * n, replacement=True, generator=g).view(n, 3)
    else:
        kids = torch.tensor([3, 7, 1]).expand(n, 3)
    grand = torch.multinomial(q[1], 3 * n, replacement=True, generator=g).view(n, 3)
    tokens = torch.cat([torch.zeros(n, 1, dtype=torch.long), kids, grand], 1)
    fc = torch.tensor([1, 4, 5, 6, -1, -1, -1]).expand(n, t).contiguous()
    ns = torch.tensor([-1, 2, 3, -1, -1, -1, -1]).expand(n, t).contiguous()
    target = torch.stack([p[0], p[1], p[1], p[1], p[2], p[2], p[2]])[None].expand(n, -1, -1).contiguous()
    draft = None
    if with_q:
        draft = torch.stack([q[0], q[0], q[0], q[0], q[1], q[1], q[1]])[None].expand(n, -1, -1).contiguous()
    uniforms = torch.rand(n, t, generator=g)
    noise = torch.empty(n, V).exponential_(generator=g)
    return tree_verify_random(tokens, fc, ns, target, draft, uniforms, noise, torch.zeros(n, dtype=torch.bool),
                              backend=backend)


@pytest.mark.parametrize("with_q", [True, False], ids=["sampled-siblings", "one-hot-siblings"])
def test_tree_reference_matches_target_distribution(with_q):
    p, q = _dists(2)
    out, path, acc = _tree_draws(6000, p, q, with_q)
    assert _pvalue(out[:, 0], p[0]) > 1e-3
    assert _pvalue(out[acc >= 1, 1], p[1]) > 1e-3
    assert (acc >= 1).float().mean() > 0.3


def test_tree_negative_control_fails():
    """Treating the siblings as if each were the only draft (no residual update between them) is biased."""
    p, q = _dists(2)
    n = 6000
    g = torch.Generator().manual_seed(5)
    kids = torch.multinomial(q[0], 3 * n, replacement=True, generator=g).view(n, 3)
    first = []
    for r in range(n):  # wrong: accept sibling i with min(1, p/q) against the *original* p each time
        tok = None
        for x in kids[r].tolist():
            if torch.rand((), generator=g) * q[0, x] < p[0, x]:
                tok = x
                break
        if tok is None:
            tok = int(torch.multinomial((p[0] - q[0]).clamp(min=0), 1, generator=g))
        first.append(tok)
    assert _pvalue(torch.tensor(first), p[0]) < 1e-6


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_tree_kernel_matches_target_distribution():
    p, q = _dists(3)
    out, path, acc = _tree_draws(1000, p, q, with_q=True, backend="triton", seed=3)
    assert _pvalue(out[:, 0], p[0]) > 1e-3
