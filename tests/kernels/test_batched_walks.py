"""The vectorised tree walks (all rows in lockstep: the CPU path for large batches) equal the per-row
references token for token, on the awkward inputs the kernels are tested with."""

import pytest
import torch

from kernel_inputs import tree_case
from multispec.kernels import (tree_verify_greedy, tree_verify_greedy_batched, tree_verify_greedy_ref,
                               tree_verify_random, tree_verify_random_batched, tree_verify_random_ref)
from multispec.kernels.tree_verify import BATCHED_FROM


def _same(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x, y)


@pytest.mark.parametrize("v", [5, 37, 1000])
@pytest.mark.parametrize("n", [1, 9, 20])
@pytest.mark.parametrize("with_q", [False, True])
def test_batched_tree_walks_equal_the_references(v, n, with_q):
    tokens, fc, ns, p, q, u, noise, greedy = tree_case(b=64, n=n, v=v, seed=v + n + with_q, with_q=with_q)
    _same(tree_verify_random_batched(tokens, fc, ns, p, q, u, noise, greedy),
          tree_verify_random_ref(tokens, fc, ns, p, q, u, noise, greedy))
    argmax = torch.nan_to_num(p, nan=0.0).argmax(-1)
    _same(tree_verify_greedy_batched(tokens, fc, ns, argmax), tree_verify_greedy_ref(tokens, fc, ns, argmax))


def test_dispatch_takes_the_batched_walk_for_large_batches(monkeypatch):
    import multispec.kernels.tree_verify as tv

    calls = []
    for name in ("tree_verify_random_batched", "tree_verify_random_ref"):
        fn = getattr(tv, name)
        monkeypatch.setattr(tv, name, lambda *a, _fn=fn, _name=name: calls.append(_name) or _fn(*a))
    for b in (BATCHED_FROM - 1, BATCHED_FROM):
        tokens, fc, ns, p, q, u, noise, greedy = tree_case(b=b, n=6, v=11, seed=b, with_q=True)
        tree_verify_random(tokens, fc, ns, p, q, u, noise, greedy, backend="torch")
    assert calls == ["tree_verify_random_ref", "tree_verify_random_batched"]
    argmax = torch.nan_to_num(p, nan=0.0).argmax(-1)
    _same(tree_verify_greedy(tokens, fc, ns, argmax, backend="torch"), tree_verify_greedy_ref(tokens, fc, ns, argmax))
