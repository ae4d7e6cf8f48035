"""Chain verification: greedy and speculative-sampling acceptance of K drafted tokens per row.

Layout (padded, ragged by count): draft_tokens [B, K] with num_drafts[b] real drafts in row b;
target rows [B, K+1, ...] where row i is the target after draft position i - 1 (row 0: after the
root); outputs [B, K+1] int64 padded with -1 holding the accepted drafts then the correction or
bonus token, and num_accepted [B]. Randomness (uniforms, exponential noise) is passed in, so the
Triton kernel and the PyTorch reference agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import host
from ..host import require
from .checks import check_same_device, check_tensor
from .common import argmax_ref, race_tile, row_argmax, row_race, sample_ref
from .dispatch import backend_for

# ---- PyTorch references -----------------------------------------------------------------------------


def chain_verify_greedy_ref(draft_tokens, num_drafts, target_argmax):
    b, k = draft_tokens.shape
    idx = torch.arange(k, device=draft_tokens.device)[None, :]
    match = (draft_tokens == target_argmax[:, :k]) & (idx < num_drafts[:, None])
    acc = match.long().cumprod(dim=1).sum(dim=1)
    out = torch.full((b, k + 1), -1, dtype=torch.long, device=draft_tokens.device)
    out[:, :k] = torch.where(idx < acc[:, None], draft_tokens, -1)
    out.scatter_(1, acc[:, None], target_argmax.gather(1, acc[:, None]))
    return out, acc


def chain_verify_random_ref(draft_tokens, num_drafts, target_probs, draft_probs, uniforms, exp_noise, is_greedy):
    b, k = draft_tokens.shape
    v = target_probs.shape[-1]
    dev = draft_tokens.device
    # Only the entries the rule reads are converted and cleaned of NaN (as zero): the drafted tokens' probabilities,
    # the row each chain stops at and, for greedy rows, the argmax. On a wide vocabulary a copy of all K + 1 rows
    # costs more than the rule (48 rows of Gemma's 262k: two copies and an argmax, ~10 ms on 2 CPU cores).
    idx = torch.arange(k, device=dev)[None, :]
    x = draft_tokens
    inb = (x >= 0) & (x < v)
    xc = x.clamp(0, v - 1)
    px = torch.where(inb, _clean(target_probs[:, :k].gather(2, xc[..., None])[..., 0]), 0.0)
    if draft_probs is None:
        qx = torch.ones_like(px)
    else:
        qx = torch.where(inb, _clean(draft_probs.gather(2, xc[..., None])[..., 0]), 0.0)
    ok_random = (uniforms.float() * qx < px) & inb
    # the argmax of every row only where a row is greedy: asked where a host read costs nothing (the CPU); on a
    # device whose step reads once (`multispec.host`) the answer would be a read, so the argmax is taken there
    any_greedy = dev.type in host.DEFERRED_DEVICE_TYPES or bool(is_greedy.any())
    argmax = argmax_ref(target_probs.float()) if any_greedy else torch.zeros(b, k + 1, dtype=torch.long, device=dev)
    ok_greedy = x == argmax[:, :k]
    ok = torch.where(is_greedy[:, None], ok_greedy, ok_random) & (idx < num_drafts[:, None])
    acc = ok.long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(b, device=dev)
    p_last = _clean(target_probs[rows, acc])  # [B, V]: target after the last accepted token
    rejected = acc < num_drafts
    at = acc.clamp(max=max(k - 1, 0))
    if k == 0:
        q_rej = torch.zeros_like(p_last)
    elif draft_probs is None:
        x_rej = x[rows, at]
        q_rej = torch.zeros_like(p_last)
        ok_x = (x_rej >= 0) & (x_rej < v)
        q_rej[rows[ok_x], x_rej[ok_x]] = 1.0
    else:
        q_rej = _clean(draft_probs[rows, at])
    residual = torch.where(rejected[:, None], (p_last - q_rej).clamp(min=0.0), p_last)
    final_random = sample_ref(residual, p_last, exp_noise.float())
    final = torch.where(is_greedy, argmax[rows, acc], final_random)
    out = torch.full((b, k + 1), -1, dtype=torch.long, device=dev)
    out[:, :k] = torch.where(idx < acc[:, None], x, -1)
    out[rows, acc] = final
    return out, acc


def _clean(t: torch.Tensor) -> torch.Tensor:
    """float32, NaN as zero (what the kernels read)."""
    return torch.nan_to_num(t.float(), nan=0.0)


# ---- Triton kernels -----------------------------------------------------------------------------------


@triton.jit
def _chain_greedy_kernel(out_ptr, acc_ptr, draft_ptr, num_ptr, argmax_ptr, K):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(num_ptr + b), 0), K)  # in bounds even before a deferred check fails
    a = tl.full([], 0, tl.int64)
    done = tl.full([], 0, tl.int32)
    for i in range(0, n):
        if done == 0:
            x = tl.load(draft_ptr + b * K + i)
            t = tl.load(argmax_ptr + b * (K + 1) + i)
            if x == t:
                tl.store(out_ptr + b * (K + 1) + i, x)
                a += 1
            else:
                done = 1
    tl.store(out_ptr + b * (K + 1) + a, tl.load(argmax_ptr + b * (K + 1) + a))
    tl.store(acc_ptr + b, a)


@triton.jit
def _chain_random_kernel(out_ptr, acc_ptr, draft_ptr, num_ptr, p_ptr, q_ptr, u_ptr, e_ptr, greedy_ptr, K, V,
                         HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(num_ptr + b), 0), K)  # in bounds even before a deferred check fails
    greedy = tl.load(greedy_ptr + b) != 0
    a = tl.full([], 0, tl.int64)
    done = tl.full([], 0, tl.int32)
    for i in range(0, n):
        if done == 0:
            x = tl.load(draft_ptr + b * K + i)
            p_row = p_ptr + (b * (K + 1) + i) * V
            if greedy:
                ok = x == row_argmax(p_row, V, BLOCK_V)
            else:
                inb = (x >= 0) & (x < V)
                xs = tl.where(inb, x, 0)
                px = tl.load(p_row + xs).to(tl.float32)
                px = tl.where((px == px) & inb, px, 0.0)
                if HAS_Q:
                    qx = tl.load(q_ptr + (b * K + i) * V + xs).to(tl.float32)
                    qx = tl.where((qx == qx) & inb, qx, 0.0)
                else:
                    qx = 1.0
                u = tl.load(u_ptr + b * K + i).to(tl.float32)
                ok = (u * qx < px) & inb
            if ok:
                tl.store(out_ptr + b * (K + 1) + i, x)
                a += 1
            else:
                done = 1
    p_row = p_ptr + (b * (K + 1) + a) * V
    e_row = e_ptr + b * V
    if greedy:
        final = row_argmax(p_row, V, BLOCK_V)
    else:
        rejected = a < n
        x_rej = tl.load(draft_ptr + b * K + tl.minimum(a, K - 1), mask=K > 0, other=-1)
        best_val = tl.full([], float("-inf"), tl.float32)
        best_idx = tl.full([], 0, tl.int64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            inb = offs < V
            p = tl.load(p_row + offs, mask=inb, other=0.0).to(tl.float32)
            p = tl.where(p == p, p, 0.0)
            if HAS_Q:
                q = tl.load(q_ptr + (b * K + tl.minimum(a, K - 1)) * V + offs, mask=inb & rejected, other=0.0)
                q = q.to(tl.float32)
                q = tl.where(q == q, q, 0.0)
            else:
                q = tl.where(offs == x_rej, 1.0, 0.0)
            r = tl.where(rejected, tl.maximum(p - q, 0.0), p)
            e = tl.load(e_row + offs, mask=inb, other=1.0).to(tl.float32)
            best_val, best_idx = race_tile(r, e, offs, inb, best_val, best_idx)
        final = best_idx
        if best_val < 0:
            fb_idx, fb_val = row_race(p_row, e_row, V, BLOCK_V)
            final = tl.where(fb_val >= 0, fb_idx, 0)
    tl.store(out_ptr + b * (K + 1) + a, final)
    tl.store(acc_ptr + b, a)


# ---- public wrappers ----------------------------------------------------------------------------------


def vocab_block(v: int, block_v: int | None) -> int:
    if block_v is None:
        return min(4096, triton.next_power_of_2(max(v, 16)))
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v: expected a power of two >= 16, got {block_v}")
    return block_v


def _check_chain(draft_tokens, num_drafts):
    check_tensor(draft_tokens, "draft_tokens", 2, "int")
    b, k = draft_tokens.shape
    check_tensor(num_drafts, "num_drafts", 1, "int", (b,))
    # deferred to the step's host read on CUDA (multispec.host): the kernels loop over k at most
    require(((num_drafts >= 0) & (num_drafts <= k)).all(),
            lambda: ValueError(f"num_drafts: entries must lie in [0, {k}]"))
    return b, k


def chain_verify_greedy(draft_tokens: torch.Tensor,  # [B, K] int
                        num_drafts: torch.Tensor,  # [B] int: real drafts per row (a prefix of K)
                        target_argmax: torch.Tensor,  # [B, K + 1] int: after the root and each draft
                        *, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept drafts while they equal the target's argmax; then append the argmax (correction/bonus).

    Returns (out_tokens [B, K+1] padded with -1, num_accepted [B])."""
    b, k = _check_chain(draft_tokens, num_drafts)
    check_tensor(target_argmax, "target_argmax", 2, "int", (b, k + 1))
    check_same_device(draft_tokens.device, num_drafts=num_drafts, target_argmax=target_argmax)
    draft_tokens, num_drafts, target_argmax = draft_tokens.long(), num_drafts.long(), target_argmax.long()
    if backend_for(draft_tokens, backend) == "torch":
        return chain_verify_greedy_ref(draft_tokens, num_drafts, target_argmax)
    out = torch.full((b, k + 1), -1, dtype=torch.long, device=draft_tokens.device)
    acc = torch.zeros(b, dtype=torch.long, device=draft_tokens.device)
    if b:
        _chain_greedy_kernel[(b,)](out, acc, draft_tokens.contiguous(), num_drafts.contiguous(),
                                   target_argmax.contiguous(), k)
    return out, acc


def chain_verify_random(draft_tokens: torch.Tensor,  # [B, K] int
                        num_drafts: torch.Tensor,  # [B] int
                        target_probs: torch.Tensor,  # [B, K + 1, V] float
                        draft_probs: torch.Tensor | None,  # [B, K, V] float, or None (one-hot drafts)
                        uniforms: torch.Tensor,  # [B, K] float in [0, 1)
                        exp_noise: torch.Tensor,  # [B, V] float, Exp(1) draws for the final race
                        is_greedy: torch.Tensor,  # [B] bool
                        *, backend: str | None = None,
                        block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling over a chain (greedy rows, flagged by `is_greedy`, use argmax matching).

    Accept draft x at position i iff `uniforms[b, i] * q(x) < p(x)` (q one-hot when `draft_probs` is
    None); at the first rejection emit a sample of max(p - q, 0); when all are accepted, a sample of p.
    Samples are exponential races with `exp_noise[b]`. Returns (out_tokens [B, K+1], num_accepted [B]).
    """
    b, k = _check_chain(draft_tokens, num_drafts)
    check_tensor(target_probs, "target_probs", 3, "float", (b, k + 1, None))
    v = target_probs.shape[2]
    if draft_probs is not None:
        check_tensor(draft_probs, "draft_probs", 3, "float", (b, k, v))
    check_tensor(uniforms, "uniforms", 2, "float", (b, k))
    check_tensor(exp_noise, "exp_noise", 2, "float", (b, v))
    check_tensor(is_greedy, "is_greedy", 1, "any", (b,))
    check_same_device(draft_tokens.device, num_drafts=num_drafts, target_probs=target_probs,
                      draft_probs=draft_probs, uniforms=uniforms, exp_noise=exp_noise, is_greedy=is_greedy)
    draft_tokens, num_drafts, is_greedy = draft_tokens.long(), num_drafts.long(), is_greedy.bool()
    if backend_for(draft_tokens, backend) == "torch":
        return chain_verify_random_ref(draft_tokens, num_drafts, target_probs, draft_probs, uniforms, exp_noise,
                                       is_greedy)
    out = torch.full((b, k + 1), -1, dtype=torch.long, device=draft_tokens.device)
    acc = torch.zeros(b, dtype=torch.long, device=draft_tokens.device)
    if b:
        q = draft_probs.float().contiguous() if draft_probs is not None else target_probs  # dummy when absent
        _chain_random_kernel[(b,)](
            out, acc, draft_tokens.contiguous(), num_drafts.contiguous(), target_probs.float().contiguous(), q,
            uniforms.float().contiguous(), exp_noise.float().contiguous(), is_greedy.to(torch.int8).contiguous(),
            k, v, HAS_Q=draft_probs is not None, BLOCK_V=vocab_block(v, block_v))
    return out, acc
