"""Triton tree-scan and tree-conv kernels (interpreted on CPU) equal their PyTorch references."""

import os

import pytest
import torch

from multispec.ssm.kernels import (ScanTiles, tree_conv1d_dispatch, tree_conv1d_triton, tree_ssd_dispatch,
                                   tree_ssd_triton)
from multispec.ssm.tree_scan import conv_sources
from multispec.tree import ancestor_mask_from_parents

from test_tree_scan import make_inputs, random_parents

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton on CPU needs TRITON_INTERPRET=1 (set by tests/conftest.py)")

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


def test_tree_ssd_kernel_loops_over_node_channel_and_state_blocks_in_any_node_order():
    """Small blocks force every loop of the chunk kernel (source blocks, head-channel blocks, state slices);
    the nodes are shuffled so ancestors sit in later blocks too (the kernel may not assume an order)."""
    b, t = 1, 27
    parents = mixed_parents(b, t, 5)
    x, dt, A, B, C, D, h0 = make_inputs(b, t, heads=2, p=20, groups=1, n=18, seed=9)
    anc = ancestor_mask_from_parents(parents)
    order = torch.randperm(t, generator=torch.Generator().manual_seed(0))
    x, dt, B, C = x[:, order], dt[:, order], B[:, order], C[:, order]
    anc = anc[:, order][:, :, order]
    want = tree_ssd_dispatch(x, dt, A, B, C, D, anc, h0, backend="torch")
    got = tree_ssd_triton(x, dt, A, B, C, D, anc, h0, tiles=ScanTiles(block_t=16, block_p=16, block_n=16))
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    # a planted bug the size of a real one: one ancestor link dropped changes the outputs
    broken = anc.clone()
    broken[0, (anc[0].sum(1) > 1).nonzero()[0, 0]] = False
    broken[0].fill_diagonal_(True)
    assert not torch.allclose(tree_ssd_triton(x, dt, A, B, C, D, broken, h0), want, atol=1e-3)


@pytest.mark.parametrize("t,b", [(23, 2), (40, 1)])
def test_tree_conv_kernel_reads_given_sources_and_walks_parents_alike(t, b):
    parents = mixed_parents(b, t, t)
    g = torch.Generator().manual_seed(t)
    xbc, state = torch.randn(b, t, 70, generator=g), torch.randn(b, 70, 4, generator=g)
    weight, bias = torch.randn(70, 4, generator=g), torch.randn(70, generator=g)
    want = tree_conv1d_dispatch(xbc, state, parents, weight, bias, backend="torch")
    sources = conv_sources(parents, 4)
    walked = tree_conv1d_triton(xbc, state, parents, weight, bias, block_nodes=16, block_c=32)
    read = tree_conv1d_triton(xbc, state, parents, weight, bias, sources, block_nodes=16, block_c=32)
    assert torch.allclose(walked, want, atol=1e-5) and torch.allclose(read, want, atol=1e-5)
