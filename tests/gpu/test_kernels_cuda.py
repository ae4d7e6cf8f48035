"""Every Triton kernel, compiled on a GPU, against its PyTorch reference at realistic sizes (the CPU tests run
the same kernels through the interpreter at small sizes)."""

import pytest
import torch

from kernel_inputs import chain_case, tree_case
from multispec.image_ar.neighbourhood import neighbour_mass
from multispec.image_ar.continuous.trajectory_kernel import trajectory_log_ratio
from multispec.kernels import chain_verify_greedy, chain_verify_random, tree_verify_greedy, tree_verify_random
from multispec.ssm.kernels import tree_conv1d_dispatch, tree_ssd_dispatch
from multispec.ssm.tree_scan import conv_sources
from multispec.tree import ancestor_mask_from_parents
from test_tree_scan import make_inputs, random_parents

CUDA = torch.device("cuda")


def _cuda(args):
    return [a.to(CUDA) if isinstance(a, torch.Tensor) else a for a in args]


def _same(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x.cpu(), y.cpu())


@pytest.mark.parametrize("b,k,v,with_q", [(64, 8, 32_000, False), (64, 8, 152_064, True), (256, 1, 262_144, True)])
def test_chain_verify_kernels(b, k, v, with_q):
    args = _cuda(chain_case(b, k, v, seed=k, with_q=with_q))
    _same(chain_verify_random(*args, backend="torch"), chain_verify_random(*args, backend="triton"))
    drafts, num, p = args[:3]
    argmax = torch.nan_to_num(p, nan=0.0).argmax(-1)
    _same(chain_verify_greedy(drafts, num, argmax, backend="torch"),
          chain_verify_greedy(drafts, num, argmax, backend="triton"))


@pytest.mark.parametrize("b,n,v,with_q", [(64, 64, 32_000, False), (16, 64, 152_064, True), (64, 8, 262_144, False)])
def test_tree_verify_kernels(b, n, v, with_q):
    args = _cuda(tree_case(b, n, v, seed=n, with_q=with_q))
    _same(tree_verify_random(*args, backend="torch"), tree_verify_random(*args, backend="triton"))
    tokens, fc, ns, p = args[:4]
    argmax = torch.nan_to_num(p, nan=0.0).argmax(-1)
    _same(tree_verify_greedy(tokens, fc, ns, argmax, backend="torch"),
          tree_verify_greedy(tokens, fc, ns, argmax, backend="triton"))


@pytest.mark.parametrize("b,t,heads,p,groups,n", [(16, 64, 24, 64, 1, 128), (4, 128, 48, 64, 8, 128),
                                                  (16, 16, 16, 32, 1, 32), (3, 37, 6, 20, 3, 17)])
@pytest.mark.parametrize("shape", ["random", "chain"])
def test_tree_ssd_kernel(b, t, heads, p, groups, n, shape):
    parents = random_parents(b, t, seed=t, shape=shape)
    x, dt, A, B, C, D, h0 = _cuda(make_inputs(b, t, heads=heads, p=p, groups=groups, n=n, seed=t))
    anc = ancestor_mask_from_parents(parents).to(CUDA)
    want = tree_ssd_dispatch(x, dt, A, B, C, D, anc, h0, backend="torch")
    got = tree_ssd_dispatch(x, dt, A, B, C, D, anc, h0, backend="triton")
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, scale) + 1e-4
    bf = [t.bfloat16() for t in (x, B, C)]  # a bf16 model feeds bf16 activations
    want = tree_ssd_dispatch(bf[0], dt, A, bf[1], bf[2], D, anc, h0, backend="torch")
    got = tree_ssd_dispatch(bf[0], dt, A, bf[1], bf[2], D, anc, h0, backend="triton")
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()) + 1e-4


@pytest.mark.parametrize("b,t,c,k", [(16, 64, 1792, 4), (16, 64, 3328, 4), (3, 37, 200, 3)])
def test_tree_conv_kernel(b, t, c, k):
    parents = random_parents(b, t, seed=t).to(CUDA)
    g = torch.Generator().manual_seed(c)
    xbc, state = torch.randn(b, t, c, generator=g).to(CUDA), torch.randn(b, c, k, generator=g).to(CUDA)
    weight, bias = torch.randn(c, k, generator=g).to(CUDA), torch.randn(c, generator=g).to(CUDA)
    want = tree_conv1d_dispatch(xbc, state, parents, weight, bias, backend="torch")
    sources = conv_sources(parents, k)
    for src in (None, sources):
        got = tree_conv1d_dispatch(xbc, state, parents, weight, bias, backend="triton", sources=src)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("r,v,k", [(64, 16_384, 1000), (4096, 16_384, 50)])
def test_neighbour_mass_kernel(r, v, k):
    g = torch.Generator().manual_seed(k)
    probs = torch.softmax(torch.randn(r, v, generator=g) * 3, -1).to(CUDA)
    tokens = torch.randint(0, v, (r,), generator=g).to(CUDA)
    table = (torch.arange(v)[:, None] + torch.randint(1, v, (v, k), generator=g)) % v  # never the code itself
    budget = (torch.rand(r, generator=g) * 0.2).to(CUDA)
    want = neighbour_mass(probs, tokens, table.to(CUDA), budget, backend="torch")
    got = neighbour_mass(probs, tokens, table.to(CUDA), budget, backend="triton")
    assert torch.equal(got[1], want[1])
    assert torch.allclose(got[0], want[0], atol=1e-5)


@pytest.mark.parametrize("n,steps,d", [(4096, 99, 16), (7, 300, 3)])
def test_trajectory_log_ratio_kernel(n, steps, d):
    g = torch.Generator().manual_seed(steps)
    x, mp, mq = (torch.randn(n, steps, d, generator=g).to(CUDA) for _ in range(3))
    std = (torch.rand(steps, generator=g) + 0.1).to(CUDA)
    want = trajectory_log_ratio(x, mp, mq, std, backend="torch")
    got = trajectory_log_ratio(x, mp, mq, std, backend="triton")
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("b,t,hk,hv,dk,dv", [(16, 64, 16, 32, 128, 128), (4, 128, 2, 4, 64, 96)])
def test_tree_gated_delta_rule_kernel(b, t, hk, hv, dk, dv):
    """Qwen3-Next's sizes (16 key heads of 128 serving 32 value heads of 128) over 64-node trees."""
    from multispec.ssm.delta_rule import tree_gated_delta_rule
    g = torch.Generator().manual_seed(t)
    x = dict(query=torch.randn(b, t, hk, dk, generator=g), key=torch.randn(b, t, hk, dk, generator=g),
             value=torch.randn(b, t, hv, dv, generator=g), g=-torch.rand(b, t, hv, generator=g) * 2,
             beta=torch.rand(b, t, hv, generator=g), initial_state=torch.randn(b, hv, dk, dv, generator=g) * 0.1)
    x = {name: v.to(CUDA) for name, v in x.items()}
    parents = random_parents(b, t, seed=t).to(CUDA)
    want, want_states = tree_gated_delta_rule(parents=parents, backend="torch", **x)
    got, got_states = tree_gated_delta_rule(parents=parents, backend="triton", **x)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert torch.allclose(got_states, want_states, atol=1e-4, rtol=1e-4)
