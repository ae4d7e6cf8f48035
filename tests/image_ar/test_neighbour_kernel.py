"""The Triton neighbourhood-aggregation kernel (interpreted on the CPU) equals its PyTorch reference on
random inputs of awkward shapes: vocabularies and k that are not block multiples, several blocks per row,
one row, NaN rows, zero and full budgets; and the table builder's ordering."""

import os

import pytest
import torch

from multispec.image_ar.neighbourhood import latent_neighbours, neighbour_mass, neighbour_mass_ref

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU needs TRITON_INTERPRET=1 (set by tests/conftest.py)")


def _inputs(r, v, k, seed, nan_rows=0):
    g = torch.Generator().manual_seed(seed)
    table = latent_neighbours(torch.randn(v, 3, generator=g), k)
    probs = torch.softmax(torch.randn(r, v, generator=g) * 3, -1)
    probs[:nan_rows, ::3] = float("nan")
    tokens = torch.randint(0, v, (r,), generator=g)
    budget = torch.rand(r, generator=g) * 0.6
    budget[::5] = 0.0
    budget[1::7] = 2.0  # everything fits
    return probs, tokens, table, budget


@needs_interpreter
@pytest.mark.parametrize("r,v,k,block_k", [(1, 5, 4, None), (9, 37, 11, 16), (33, 1000, 100, 32),
                                           (4, 1000, 999, None), (6, 130, 1, None), (17, 64, 63, 16)])
def test_kernel_equals_reference(r, v, k, block_k):
    probs, tokens, table, budget = _inputs(r, v, k, seed=r + v + k, nan_rows=min(2, r))
    want_mass, want_count = neighbour_mass_ref(probs, tokens, table, budget)
    got_mass, got_count = neighbour_mass(probs, tokens, table, budget, backend="triton", block_k=block_k)
    assert torch.allclose(got_mass, want_mass, atol=1e-6)
    # a prefix sum within 1e-6 of the budget may round to either side; elsewhere J is identical
    cum = torch.nan_to_num(probs, nan=0.0).gather(1, table[tokens]).cumsum(1)
    near = ((cum - budget[:, None]).abs() < 1e-6).any(dim=1)
    assert torch.equal(got_count[~near], want_count[~near])
    assert bool((want_count[budget >= 1.5] == k).all())
    assert bool((want_count[budget == 0] == 0).all()) or bool((torch.nan_to_num(probs) == 0).any())


def test_reference_finds_the_longest_fitting_prefix():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 0, 3], [2, 1, 0]])
    mass, count = neighbour_mass_ref(probs, torch.tensor([0]), table, torch.tensor([0.5]))
    assert int(count) == 2 and abs(float(mass) - 0.5) < 1e-7  # 0.2 + 0.3 fits exactly; + 0.4 does not
    mass, count = neighbour_mass_ref(probs, torch.tensor([3]), table, torch.tensor([0.25]))
    assert int(count) == 0 and float(mass) == 0.0  # the nearest alone (0.3) is already too much


def test_latent_neighbours_are_nearest_first_and_exclude_the_code():
    latents = torch.tensor([[0.0], [1.0], [3.0], [3.5], [10.0]])
    table = latent_neighbours(latents, 4)
    assert table[2].tolist() == [3, 1, 0, 4]
    assert table[0].tolist() == [1, 2, 3, 4]
    # ties by index; a 2,000-entry codebook is built in blocks and agrees with a direct sort
    big = torch.randn(2000, 4, generator=torch.Generator().manual_seed(0))
    direct = torch.cdist(big.double(), big.double())
    direct.fill_diagonal_(float("inf"))
    assert torch.equal(latent_neighbours(big, 7), torch.sort(direct, dim=1, stable=True).indices[:, :7])


def test_bad_inputs_are_named():
    probs, tokens, table, budget = _inputs(3, 10, 4, seed=0)
    with pytest.raises(ValueError, match="tokens"):
        neighbour_mass(probs, tokens + 10, table, budget)
    with pytest.raises(ValueError, match="neighbours"):
        neighbour_mass(probs, tokens, table[:5], budget)
    with pytest.raises(ValueError, match="budget"):
        neighbour_mass(probs, tokens, table, budget[:2])
    with pytest.raises(ValueError, match="block_k"):
        neighbour_mass(probs, tokens, table, budget, backend="triton", block_k=24)
