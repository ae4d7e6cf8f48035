"""Triton verification kernels (run by the interpreter on the CPU) against their PyTorch references."""

import os

import pytest
import torch

from kernel_inputs import chain_case, tree_case
from multispec.kernels import (backend_for, chain_verify_greedy, chain_verify_random, tree_verify_greedy,
                               tree_verify_random)

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton on CPU needs TRITON_INTERPRET=1 (set by tests/conftest.py)")


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x, y)


def _in_vocab(out, v):
    assert ((out == -1) | ((out >= 0) & (out < v))).all()


@pytest.mark.parametrize("v,block", [(37, 16), (1000, 256)])
@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("greedy_rows", [True, False])  # without: the reference takes no argmax on the CPU
def test_chain_random_kernel_equals_reference(v, block, with_q, greedy_rows):
    args = chain_case(b=24, k=4, v=v, seed=v + with_q, with_q=with_q)
    if not greedy_rows:
        args = (*args[:6], torch.zeros_like(args[6]))
    ref = chain_verify_random(*args, backend="torch")
    got = chain_verify_random(*args, backend="triton", block_v=block)
    _same(ref, got)
    _in_vocab(got[0], v)
    out, acc = got
    assert (out[torch.arange(24), acc] >= 0).all()  # every row emits a token after its accepted drafts


@pytest.mark.parametrize("v", [37, 1000])
def test_chain_greedy_kernel_equals_reference(v):
    drafts, num, p, *_ = chain_case(b=24, k=5, v=v, seed=v, with_q=False)
    argmax = torch.nan_to_num(p, nan=0.0).argmax(-1)
    _same(chain_verify_greedy(drafts, num, argmax, backend="torch"),
          chain_verify_greedy(drafts, num, argmax, backend="triton"))


@pytest.mark.parametrize("v,block", [(37, 16), (1000, 256)])
@pytest.mark.parametrize("with_q", [False, True])
def test_tree_random_kernel_equals_reference(v, block, with_q):
    args = tree_case(b=20, n=9, v=v, seed=3 * v + with_q, with_q=with_q)
    ref = tree_verify_random(*args, backend="torch")
    got = tree_verify_random(*args, backend="triton", block_v=block)
    _same(ref, got)
    _in_vocab(got[0], v)


@pytest.mark.parametrize("v", [37, 1000])
def test_tree_greedy_kernel_equals_reference(v):
    tokens, fc, ns, p, *_ = tree_case(b=20, n=9, v=v, seed=v, with_q=False)
    argmax = torch.nan_to_num(p, nan=0.0).argmax(-1)
    _same(tree_verify_greedy(tokens, fc, ns, argmax, backend="torch"),
          tree_verify_greedy(tokens, fc, ns, argmax, backend="triton"))


def test_hand_worked_chain_and_tree():
    for backend in ("torch", "triton"):
        out, acc = chain_verify_greedy(torch.tensor([[5, 6, 7], [5, 9, 7], [1, 1, 1]]), torch.tensor([3, 3, 0]),
                                       torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [4, 4, 4, 4]]), backend=backend)
        assert out.tolist() == [[5, 6, 7, 8], [5, 6, -1, -1], [4, -1, -1, -1]]
        assert acc.tolist() == [3, 1, 0]
        # root -> {1: 10, 2: 11}; 1 -> {3: 12}; 2 -> {4: 13}; 4 -> {5: 14}
        tokens = torch.tensor([[0, 10, 11, 12, 13, 14]] * 2)
        fc = torch.tensor([[1, 3, 4, -1, 5, -1]] * 2)
        ns = torch.tensor([[-1, 2, -1, -1, -1, -1]] * 2)
        argmax = torch.tensor([[11, 0, 13, 0, 14, 99], [10, 12, 0, 7, 0, 0]])
        out, path, acc = tree_verify_greedy(tokens, fc, ns, argmax, backend=backend)
        assert out.tolist() == [[11, 13, 14, 99, -1, -1], [10, 12, 7, -1, -1, -1]]
        assert path.tolist() == [[0, 2, 4, 5, -1, -1], [0, 1, 3, -1, -1, -1]]
        assert acc.tolist() == [3, 2]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_uniform_zero_accepts_only_positive_target_probability(backend):
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]] * 2)
    drafts = torch.tensor([[0], [1]])  # p(0) = 0 must reject even with u = 0; p(1) > 0 accepts
    out, acc = chain_verify_random(drafts, torch.tensor([1, 1]), p, None, torch.zeros(2, 1), torch.ones(2, 4),
                                   torch.zeros(2, dtype=torch.bool), backend=backend)
    assert acc.tolist() == [0, 1]
    assert out[0, 0].item() in (1, 2)  # the residual excludes token 0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_duplicate_one_hot_siblings_are_rejected_twice(backend):
    # root has two children with the same token 2, whose target probability is tiny: the second copy
    # sees a residual with p(2) = 0 and must be rejected whatever its coin
    p = torch.full((1, 3, 5), 0.2)
    p[0, 0] = torch.tensor([0.5, 0.5, 1e-6, 0.0, 0.0])
    tokens = torch.tensor([[0, 2, 2]])
    fc, ns = torch.tensor([[1, -1, -1]]), torch.tensor([[-1, 2, -1]])
    u = torch.tensor([[0.0, 0.9, 0.0]])
    out, path, acc = tree_verify_random(tokens, fc, ns, p, None, u, torch.ones(1, 5),
                                        torch.zeros(1, dtype=torch.bool), backend=backend)
    assert acc.item() == 0 and out[0, 0].item() in (0, 1)


def test_all_nan_rows_never_give_out_of_vocabulary_tokens():
    b, k, v = 6, 3, 19
    p = torch.full((b, k + 1, v), float("nan"))
    g = torch.Generator().manual_seed(0)
    # drafts other than token 0: a greedy row's argmax of an all-NaN (as zero) row is token 0, which it would accept
    drafts = torch.randint(1, v, (b, k), generator=g)
    for backend in ("torch", "triton"):
        out, acc = chain_verify_random(drafts, torch.full((b,), k), p, None, torch.rand(b, k, generator=g),
                                       torch.ones(b, v), torch.tensor([0, 1] * 3).bool(), backend=backend,
                                       block_v=16)
        assert acc.tolist() == [0] * b and out[:, 0].tolist() == [0] * b


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="num_drafts"):
        chain_verify_greedy(torch.zeros(2, 3, dtype=torch.long), torch.tensor([4, 0]), torch.zeros(2, 4).long())
    with pytest.raises(ValueError, match="target_argmax"):
        chain_verify_greedy(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 0]), torch.zeros(2, 3).long())
    with pytest.raises(TypeError, match="target_probs"):
        chain_verify_random(torch.zeros(1, 1).long(), torch.ones(1).long(), torch.zeros(1, 2, 4).long(), None,
                            torch.rand(1, 1), torch.ones(1, 4), torch.zeros(1).bool())
    with pytest.raises(ValueError, match="first_child"):
        tree_verify_greedy(torch.zeros(1, 3).long(), torch.tensor([[2, 1, -1]]), torch.full((1, 3), -1),
                           torch.zeros(1, 3).long())
    with pytest.raises(ValueError, match="next_sibling"):
        tree_verify_greedy(torch.zeros(1, 3).long(), torch.tensor([[1, -1, -1]]), torch.tensor([[-1, 1, -1]]),
                           torch.zeros(1, 3).long())
    with pytest.raises(ValueError, match="backend"):
        backend_for(torch.zeros(1), "cuda-graphs")


def test_triton_on_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        backend_for(torch.zeros(1), "triton")
    assert backend_for(torch.zeros(1), None) == "torch"
    monkeypatch.setenv("MULTISPEC_KERNELS", "torch")
    assert backend_for(torch.zeros(1)) == "torch"
