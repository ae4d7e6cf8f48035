"""Triton tree-scan and tree-conv kernels (interpreted on CPU) equal their PyTorch references."""

import pytest
import torch

from multispec.ssm.kernels import tree_conv1d_dispatch, tree_ssd_dispatch
from multispec.tree import ancestor_mask_from_parents

from test_tree_scan import make_inputs, random_parents

SHAPES = [("chain", 40, 3), ("star", 23, 2), ("random", 17, 3), ("random", 1, 1), ("random", 70, 2)]


def mixed_parents(b, t, seed):
    """Ragged batch: every row a different shape (chain, star, random)."""
    kinds = ["chain", "star", "random"]
    return torch.cat([random_parents(1, t, seed + r, kinds[r % 3]) for r in range(b)])


@pytest.mark.parametrize("shape,t,b", SHAPES)
@pytest.mark.parametrize("heads,p,groups,n", [(4, 3, 2, 5), (6, 20, 3, 17)])
def test_tree_ssd_kernel_equals_reference(shape, t, b, heads, p, groups, n):
    parents = random_parents(b, t, seed=t, shape=shape) if shape != "random" else mixed_parents(b, t, t)
    x, dt, A, B, C, D, h0 = make_inputs(b, t, heads=heads, p=p, groups=groups, n=n, seed=t + heads)
    anc = ancestor_mask_from_parents(parents)
    for d in (D, None):
        want = tree_ssd_dispatch(x, dt, A, B, C, d, anc, h0, backend="torch")
        got = tree_ssd_dispatch(x, dt, A, B, C, d, anc, h0, backend="triton")
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_tree_ssd_kernel_handles_non_contiguous_inputs():
    b, t = 2, 9
    parents = mixed_parents(b, t, 1)
    x, dt, A, B, C, D, h0 = make_inputs(b, t, heads=4, p=8, groups=2, n=16, seed=3)
    x_nc = x.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    anc = ancestor_mask_from_parents(parents)
    want = tree_ssd_dispatch(x, dt, A, B, C, D, anc, h0, backend="torch")
    assert torch.allclose(tree_ssd_dispatch(x_nc, dt, A, B, C, D, anc, h0, backend="triton"), want, atol=1e-4)


def test_tree_ssd_shape_errors_name_the_argument():
    x, dt, A, B, C, D, h0 = make_inputs(1, 4)
    anc = torch.ones(1, 4, 4, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="dt"):
        tree_ssd_dispatch(x, dt[:, :3], A, B, C, D, anc, h0)
    with pytest.raises(ValueError, match="ancestors"):
        tree_ssd_dispatch(x, dt, A, B, C, D, anc[:, :3], h0)
    with pytest.raises(ValueError, match="initial_state"):
        tree_ssd_dispatch(x, dt, A, B, C, D, anc, h0[:, :, :2])


@pytest.mark.parametrize("shape,t,b", SHAPES)
@pytest.mark.parametrize("channels,k", [(6, 4), (200, 3), (33, 1)])
def test_tree_conv_kernel_equals_reference(shape, t, b, channels, k):
    parents = random_parents(b, t, seed=t, shape=shape) if shape != "random" else mixed_parents(b, t, t)
    g = torch.Generator().manual_seed(t + channels)
    xbc, state = torch.randn(b, t, channels, generator=g), torch.randn(b, channels, k, generator=g)
    weight, bias = torch.randn(channels, k, generator=g), torch.randn(channels, generator=g)
    for bb in (bias, None):
        want = tree_conv1d_dispatch(xbc, state, parents, weight, bb, backend="torch")
        got = tree_conv1d_dispatch(xbc, state, parents, weight, bb, backend="triton")
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="weight"):
        tree_conv1d_dispatch(xbc, state, parents, weight[:, :1] if k > 1 else weight[:1], bias)
