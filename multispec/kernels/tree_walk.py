"""The lockstep walk of tree verification in PyTorch: every row starts at the root about to try its first
child; each iteration tries one child per row, and a pluggable test decides which rows accept theirs. An
accepting row moves into the child (trying its first child next), a rejecting one on to the next sibling; a
row whose siblings run out stops. Node indices only grow along a walk, so T iterations suffice.

The core's exact and greedy walks (`tree_verify.py`) and a modality's relaxed ones (LANTERN's)
are this walk with their own tests; the correction token after the walk is each caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class TreeWalk:
    """Where each row's walk stands: `out` [B, T] the accepted tokens so far, `path` [B, T] the accepted nodes
    (root first), `acc` [B] how many were accepted, `cur` [B] the node the row stands on, `child` [B] the
    child it tries next (-1: none left); `rows` = arange(B)."""

    rows: torch.Tensor
    out: torch.Tensor
    path: torch.Tensor
    acc: torch.Tensor
    cur: torch.Tensor
    child: torch.Tensor

    @classmethod
    def start(cls, first_child: torch.Tensor) -> TreeWalk:
        b, t = first_child.shape
        dev = first_child.device
        out = torch.full((b, t), -1, dtype=torch.long, device=dev)
        path = torch.full((b, t), -1, dtype=torch.long, device=dev)
        path[:, 0] = 0
        zeros = torch.zeros(b, dtype=torch.long, device=dev)
        return cls(torch.arange(b, device=dev), out, path, zeros, zeros.clone(), first_child[:, 0].clone())


# accept(walk, c, x, trying) -> ok [B] bool: the rows whose tried child c [B] (token x [B]) is accepted
SiblingTest = Callable[[TreeWalk, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def walk_tree(tokens: torch.Tensor, first_child: torch.Tensor, next_sibling: torch.Tensor,
              accept: SiblingTest) -> TreeWalk:
    """Walk every row of the linked tree (`tokens`, `first_child`, `next_sibling` [B, T]) in lockstep.

    `accept(walk, c, x, trying)` is called once per iteration: `c` [B] the child each row tries (0 where
    `trying` is False), `x` its token; it returns which rows accept (only those trying count) and may update
    state of its own for the accepted and the rejected rows (a residual distribution, the mass a relaxed rule
    moved): `walk.acc` and `walk.cur` are still those before the move. Returns the finished walk."""
    walk = TreeWalk.start(first_child)
    rows = walk.rows
    for _ in range(tokens.shape[1]):
        trying = walk.child >= 0
        if not bool(trying.any()):
            break
        c = walk.child.clamp(min=0)
        x = tokens[rows, c]
        ok = trying & accept(walk, c, x, trying)
        walk.out[rows[ok], walk.acc[ok]] = x[ok]
        walk.acc = walk.acc + ok.long()
        walk.path[rows[ok], walk.acc[ok]] = c[ok]
        walk.cur = torch.where(ok, c, walk.cur)
        walk.child = torch.where(ok, first_child[rows, c], torch.where(trying, next_sibling[rows, c], walk.child))
    return walk
