"""The tree scan, the closed-form state and the tree conv equal running each root path on its own."""

import pytest
import torch

from multispec.ssm.tree_scan import chunked_ssd, conv_from_windows, tree_conv_windows, tree_ssd, tree_state
from multispec.tree import ancestor_mask_from_parents


def random_parents(b: int, t: int, seed: int, shape: str = "random") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(b):
        if shape == "chain":
            rows.append(torch.arange(t) - 1)
        elif shape == "star":
            rows.append(torch.tensor([-1] + [0] * (t - 1)))
        else:
            rows.append(torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)]))
    return torch.stack(rows)


def path_of(parents_row: torch.Tensor, node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = int(parents_row[node])
    return out[::-1]


def sequential(x, dt, A, B, C, D, h0, path):
    """Mamba-2's recurrence step by step along `path` (float64): (outputs per path node, final state)."""
    heads = x.shape[1]
    rep = heads // B.shape[1]
    h = h0.double().clone()
    ys = []
    for s in path:
        Bs, Cs = B[s].double().repeat_interleave(rep, 0), C[s].double().repeat_interleave(rep, 0)  # [H, N]
        h = torch.exp(dt[s].double() * A.double())[:, None, None] * h + \
            dt[s].double()[:, None, None] * x[s].double()[:, :, None] * Bs[:, None, :]
        ys.append(torch.einsum("hpn,hn->hp", h, Cs) + D.double()[:, None] * x[s].double())
    return ys, h


def make_inputs(b, t, heads=4, p=3, groups=2, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, heads, p, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(b, t, heads, generator=g))
    A = -torch.rand(heads, generator=g) * 2 - 0.1
    B = torch.randn(b, t, groups, n, generator=g)
    C = torch.randn(b, t, groups, n, generator=g)
    D = torch.randn(heads, generator=g)
    h0 = torch.randn(b, heads, p, n, generator=g)
    return x, dt, A, B, C, D, h0


@pytest.mark.parametrize("shape,t", [("random", 9), ("chain", 12), ("star", 7), ("random", 1)])
def test_tree_ssd_and_state_equal_each_path_run_alone(shape, t):
    b = 3
    parents = random_parents(b, t, seed=t, shape=shape)
    x, dt, A, B, C, D, h0 = make_inputs(b, t, seed=t)
    y = tree_ssd(x, dt, A, B, C, D, ancestor_mask_from_parents(parents), h0)
    anc = ancestor_mask_from_parents(parents)
    for r in range(b):
        for node in range(t):
            path = path_of(parents[r], node)
            ys, h = sequential(x[r], dt[r], A, B[r], C[r], D, h0[r], path)
            assert torch.allclose(y[r, node].double(), ys[-1], atol=1e-4, rtol=1e-4), (r, node)
            state = tree_state(x[r:r + 1], dt[r:r + 1], A, B[r:r + 1], anc[r:r + 1, node], h0[r:r + 1])
            assert torch.allclose(state[0].double(), h, atol=1e-4, rtol=1e-4), (r, node)


@pytest.mark.parametrize("length,chunk", [(1, 4), (7, 4), (8, 4), (13, 32), (30, 8)])
def test_chunked_ssd_equals_the_recurrence(length, chunk):
    """The prefill scan (chunks as batch rows, states carried across chunks) from a zero state."""
    b = 2
    x, dt, A, B, C, D, _ = make_inputs(b, length, seed=length)
    y, state = chunked_ssd(x, dt, A, B, C, D, chunk)
    zero = torch.zeros(x.shape[2], x.shape[3], B.shape[3])
    for r in range(b):
        ys, h = sequential(x[r], dt[r], A, B[r], C[r], D, zero, list(range(length)))
        assert torch.allclose(y[r].double(), torch.stack(ys), atol=1e-4, rtol=1e-4), r
        assert torch.allclose(state[r].double(), h, atol=1e-4, rtol=1e-4), r


def test_state_of_an_empty_path_is_the_initial_state():
    x, dt, A, B, C, D, h0 = make_inputs(2, 4)
    state = tree_state(x, dt, A, B, torch.zeros(2, 4, dtype=torch.bool), h0)
    assert torch.equal(state, h0)


def test_large_decays_do_not_overflow_off_path():
    """Non-ancestors can have huge exp(Acum_t - Acum_s); they must be masked, not multiplied by 0."""
    x, dt, A, B, C, D, h0 = make_inputs(1, 6)
    dt = dt * 200  # decays of exp(-hundreds): exp of the negated difference overflows float32
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3]])
    y = tree_ssd(x, dt, A, B, C, D, ancestor_mask_from_parents(parents), h0)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("shape,t", [("random", 10), ("chain", 7), ("star", 5)])
def test_tree_conv_windows_follow_each_path(shape, t):
    b, c, k = 3, 6, 4
    parents = random_parents(b, t, seed=3 + t, shape=shape)
    g = torch.Generator().manual_seed(1)
    xbc, state = torch.randn(b, t, c, generator=g), torch.randn(b, c, k, generator=g)
    weight, bias = torch.randn(c, k, generator=g), torch.randn(c, generator=g)
    windows = tree_conv_windows(xbc, state, parents)
    out = conv_from_windows(windows, weight, bias)
    for r in range(b):
        for node in range(t):
            seq = torch.cat([state[r], xbc[r, path_of(parents[r], node)].T], dim=1)  # [C, K + depth + 1]
            want = seq[:, -k:]
            assert torch.equal(windows[r, node], want), (r, node)
            assert torch.allclose(out[r, node], (want * weight).sum(-1) + bias, atol=1e-5)
