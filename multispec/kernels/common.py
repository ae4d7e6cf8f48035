"""Row-wise building blocks shared by the verification kernels (Triton) and their references (PyTorch).

Semantics both sides implement identically:
- NaN probabilities count as 0.
- argmax ties go to the smallest index; padded lanes are -inf so they never win (a padded lane winning
  a tie was a real out-of-vocabulary bug in another engine).
- The exponential race `argmax_v r[v] / E[v]` over lanes with r[v] > 0 samples v with probability
  r[v] / sum(r) without normalising (E ~ Exp(1)); lanes with r[v] = 0 score -1, so "nothing positive"
  shows as a best score < 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# ---- PyTorch ---------------------------------------------------------------------------------------


def argmax_ref(p: torch.Tensor) -> torch.Tensor:
    """NaN-as-zero argmax over the last dim, first index on ties."""
    return torch.nan_to_num(p, nan=0.0).argmax(dim=-1)


def race_ref(r: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(winner, found) of the exponential race over the last dim."""
    score = torch.where(r > 0, r / noise, torch.full_like(r, -1.0))
    return score.argmax(dim=-1), score.amax(dim=-1) >= 0


def sample_ref(r: torch.Tensor, fallback: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Race over r; if r has no positive entry, race over `fallback`; if neither has one, token 0."""
    tok, found = race_ref(r, noise)
    tok2, found2 = race_ref(fallback, noise)
    return torch.where(found, tok, torch.where(found2, tok2, torch.zeros_like(tok)))


# ---- Triton ----------------------------------------------------------------------------------------


@triton.jit
def row_argmax(ptr, V, BLOCK_V: tl.constexpr):
    """NaN-as-zero argmax of a length-V fp row at `ptr` (int64 offsets are the caller's job)."""
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inb = offs < V
        v = tl.load(ptr + offs, mask=inb, other=0.0).to(tl.float32)
        v = tl.where(v == v, v, 0.0)
        v = tl.where(inb, v, float("-inf"))
        tile_max = tl.max(v, axis=0)
        tile_idx = tl.argmax(v, axis=0).to(tl.int64) + start
        take = tile_max > best_val
        best_idx = tl.where(take, tile_idx, best_idx)
        best_val = tl.where(take, tile_max, best_val)
    return best_idx


@triton.jit
def race_tile(r, e, offs, inb, best_val, best_idx):
    """Fold one tile of residual values r (noise e) into the running race winner."""
    score = tl.where(r > 0, r / e, -1.0)
    score = tl.where(inb, score, float("-inf"))
    tile_max = tl.max(score, axis=0)
    tile_idx = tl.argmax(score, axis=0).to(tl.int64) + tl.min(offs, axis=0)
    take = tile_max > best_val
    return tl.where(take, tile_max, best_val), tl.where(take, tile_idx, best_idx)


@triton.jit
def row_race(ptr, e_ptr, V, BLOCK_V: tl.constexpr):
    """Exponential race over a stored row (NaN as 0): returns (winner, best score)."""
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inb = offs < V
        r = tl.load(ptr + offs, mask=inb, other=0.0).to(tl.float32)
        r = tl.where(r == r, r, 0.0)
        e = tl.load(e_ptr + offs, mask=inb, other=1.0).to(tl.float32)
        best_val, best_idx = race_tile(r, e, offs, inb, best_val, best_idx)
    return best_idx, best_val
