"""LANTERN's latent neighbourhoods and the aggregation of target mass over them.

`latent_neighbours(latents, k)`: for every codebook entry, its k nearest *other* entries by Euclidean
distance between code vectors, nearest first (ties by index): B_k(x) = table[x].

`neighbour_mass(probs, tokens, table, budget)`: per row r with drafted token x = tokens[r] and
distribution probs[r], the prefix sums c_j = sum_{i<=j} probs[r, table[x, i]] in proximity order, the
largest J with c_J <= budget[r] (0 if none) and c_J (0 if J = 0). The prefix is what LANTERN merges
onto x: the longest run of nearest neighbours whose mass fits the budget. The Triton kernel and the
PyTorch reference compute the same (up to the order of fp32 additions: a c_j within ~1e-6 of the
budget can fall on either side).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multispec.plugin import backend_for, check_same_device, check_tensor


def latent_neighbours(latents: torch.Tensor, k: int) -> torch.Tensor:
    """[V, k] int64: the k nearest other codes of each code (Euclidean distance between the rows of
    `latents` [V, D]; the code itself excluded; nearest first, ties by index). Computed in row blocks so a
    16k-entry codebook needs no V x V matrix at once."""
    check_tensor(latents, "latents", 2, "float")
    v = latents.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= v - 1:
        raise ValueError(f"k: expected an int in [1, {v - 1}] (codebook of {v} entries), got {k!r}")
    lat = latents.detach().double()
    out = []
    for start in range(0, v, 1024):
        d = torch.cdist(lat[start:start + 1024], lat)  # [b, V]
        rows = torch.arange(start, min(start + 1024, v), device=d.device)
        d[torch.arange(len(rows), device=d.device), rows] = float("inf")
        # stable sort: equal distances keep index order
        out.append(torch.sort(d, dim=1, stable=True).indices[:, :k])
    return torch.cat(out).to(latents.device)


def check_table(table: object, vocab_size: int | None = None) -> torch.Tensor:
    check_tensor(table, "neighbours", 2, "int")
    v, k = table.shape
    if vocab_size is not None and v != vocab_size:
        raise ValueError(f"neighbours: has {v} rows, the vocabulary has {vocab_size} tokens")
    if table.numel() and (table.min() < 0 or table.max() >= v):
        raise ValueError(f"neighbours: entries must be token ids in [0, {v})")
    if k and (table == torch.arange(v, device=table.device)[:, None]).any():
        raise ValueError("neighbours: a token may not be its own neighbour (B_k(x) excludes x)")
    return table


# ---- PyTorch reference ----------------------------------------------------------------------------------


def neighbour_mass_ref(probs: torch.Tensor, tokens: torch.Tensor, table: torch.Tensor,
                       budget: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_J [R] float32, J [R] int64); see the module docstring."""
    p = torch.nan_to_num(probs.float(), nan=0.0)
    vals = p.gather(1, table[tokens.long()])  # [R, k]
    cum = vals.cumsum(dim=1)
    count = (cum <= budget.float()[:, None]).sum(dim=1)  # cum is non-decreasing: the fitting ones are a prefix
    mass = torch.where(count > 0, cum.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    return mass, count


# ---- Triton -----------------------------------------------------------------------------------------------


@triton.jit
def _neighbour_mass_kernel(p_ptr, tok_ptr, nb_ptr, budget_ptr, mass_ptr, count_ptr, V, K, BLOCK_K: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    x = tl.load(tok_ptr + r).to(tl.int64)
    budget = tl.load(budget_ptr + r).to(tl.float32)
    running = tl.full([], 0.0, tl.float32)
    mass = tl.full([], 0.0, tl.float32)
    count = tl.full([], 0, tl.int64)
    for start in range(0, K, BLOCK_K):
        offs = start + tl.arange(0, BLOCK_K)
        inb = offs < K
        idx = tl.load(nb_ptr + x * K + offs, mask=inb, other=0).to(tl.int64)
        vals = tl.load(p_ptr + r * V + idx, mask=inb, other=0.0).to(tl.float32)
        vals = tl.where(vals == vals, vals, 0.0)  # NaN counts as 0
        vals = tl.where(inb, vals, 0.0)
        cum = running + tl.cumsum(vals, axis=0)
        fits = (cum <= budget) & inb
        count += tl.sum(fits.to(tl.int64), axis=0)
        mass = tl.maximum(mass, tl.max(tl.where(fits, cum, 0.0), axis=0))
        running += tl.sum(vals, axis=0)
    tl.store(mass_ptr + r, mass)
    tl.store(count_ptr + r, count)


def neighbour_mass(probs: torch.Tensor, tokens: torch.Tensor, table: torch.Tensor, budget: torch.Tensor, *,
                   backend: str | None = None, block_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_J [R], J [R]) for rows `probs` [R, V], drafted `tokens` [R], neighbour `table` [V, k] and
    `budget` [R] (see the module docstring). Triton on CUDA (or with TRITON_INTERPRET=1 and
    backend="triton"), the PyTorch reference elsewhere."""
    check_tensor(probs, "probs", 2, "float")
    r, v = probs.shape
    check_tensor(tokens, "tokens", 1, "int", (r,))
    check_tensor(table, "neighbours", 2, "int", (v, None))
    check_tensor(budget, "budget", 1, "float", (r,))
    check_same_device(probs.device, tokens=tokens, neighbours=table, budget=budget)
    if r and (tokens.min() < 0 or tokens.max() >= v):
        raise ValueError(f"tokens: ids must lie in [0, {v})")
    k = table.shape[1]
    if backend_for(probs, backend) == "torch" or k == 0 or r == 0:
        if k == 0:
            return torch.zeros(r, device=probs.device), torch.zeros(r, dtype=torch.long, device=probs.device)
        return neighbour_mass_ref(probs, tokens, table, budget)
    if block_k is None:
        block_k = min(1024, triton.next_power_of_2(max(k, 16)))
    elif block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_k: expected a power of two >= 16, got {block_k}")
    mass = torch.empty(r, dtype=torch.float32, device=probs.device)
    count = torch.empty(r, dtype=torch.long, device=probs.device)
    _neighbour_mass_kernel[(r,)](probs.float().contiguous(), tokens.long().contiguous(), table.long().contiguous(),
                                 budget.float().contiguous(), mass, count, v, k, BLOCK_K=block_k)
    return mass, count
