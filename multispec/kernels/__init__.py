"""Verification kernels: Triton on CUDA, PyTorch references elsewhere (see `dispatch`).

Each public function validates its arguments and dispatches; the `_ref` functions are the
pure-PyTorch references, bit-for-bit equal to the kernels given the same randomness; the tree walks also
have a `_batched` PyTorch form (all rows in lockstep) that the CPU path takes for large batches.
"""

from .chain_verify import (chain_verify_greedy, chain_verify_greedy_ref, chain_verify_random,
                           chain_verify_random_ref)
from .dispatch import backend_for
from .tree_verify import (tree_verify_greedy, tree_verify_greedy_batched, tree_verify_greedy_ref, tree_verify_random,
                          tree_verify_random_batched, tree_verify_random_ref)

__all__ = [
    "backend_for", "chain_verify_greedy", "chain_verify_greedy_ref", "chain_verify_random", "chain_verify_random_ref",
    "tree_verify_greedy", "tree_verify_greedy_batched", "tree_verify_greedy_ref", "tree_verify_random",
    "tree_verify_random_batched", "tree_verify_random_ref",
]
