"""The log density ratio of denoising trajectories under two diffusion heads.

A trajectory is the chain of states x_0 -> x_1 -> ... -> x_{S-1} of a head's reverse process; each
transition i is Gaussian, N(x_{i+1}; μ_i, s_i² I), with the same std s_i under both models (a shared
schedule and temperature) and model-specific means. The start x_0 ~ N(0, I) is shared too, so

    log p(τ) - log q(τ) = Σ_i Σ_d [ (x_{i+1,d} - μq_{i,d})² - (x_{i+1,d} - μp_{i,d})² ] / (2 s_i²)

`trajectory_log_ratio(next_states, mean_p, mean_q, std)` computes it per trajectory: next_states, mean_p,
mean_q [N, S-1, D], std [S-1] -> [N]. The Triton kernel (one program per trajectory, the S-1 x D
transitions in one block walk) and the PyTorch reference compute the same up to fp32 summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multispec.plugin import backend_for, check_same_device, check_tensor


def trajectory_log_ratio_ref(next_states: torch.Tensor, mean_p: torch.Tensor, mean_q: torch.Tensor,
                             std: torch.Tensor) -> torch.Tensor:
    x, mp, mq = next_states.float(), mean_p.float(), mean_q.float()
    per_step = ((x - mq) ** 2 - (x - mp) ** 2).sum(-1) / (2 * std.float() ** 2)  # [N, S-1]
    return per_step.sum(-1)


@triton.jit
def _trajectory_log_ratio_kernel(x_ptr, p_ptr, q_ptr, std_ptr, out_ptr, STEPS, D, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    size = STEPS * D
    total = tl.full([], 0.0, tl.float32)
    for start in range(0, size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inb = offs < size
        x = tl.load(x_ptr + n * size + offs, mask=inb, other=0.0).to(tl.float32)
        mp = tl.load(p_ptr + n * size + offs, mask=inb, other=0.0).to(tl.float32)
        mq = tl.load(q_ptr + n * size + offs, mask=inb, other=0.0).to(tl.float32)
        s = tl.load(std_ptr + offs // D, mask=inb, other=1.0).to(tl.float32)
        dq = x - mq
        dp = x - mp
        total += tl.sum(tl.where(inb, (dq * dq - dp * dp) / (2.0 * s * s), 0.0), axis=0)
    tl.store(out_ptr + n, total)


def trajectory_log_ratio(next_states: torch.Tensor, mean_p: torch.Tensor, mean_q: torch.Tensor, std: torch.Tensor,
                         *, backend: str | None = None, block: int | None = None) -> torch.Tensor:
    """[N] log p(τ) - log q(τ) (see the module docstring). Triton on CUDA (or with TRITON_INTERPRET=1 and
    backend="triton"), the PyTorch reference elsewhere."""
    check_tensor(next_states, "next_states", 3, "float")
    n, steps, d = next_states.shape
    check_tensor(mean_p, "mean_p", 3, "float", (n, steps, d))
    check_tensor(mean_q, "mean_q", 3, "float", (n, steps, d))
    check_tensor(std, "std", 1, "float", (steps,))
    check_same_device(next_states.device, mean_p=mean_p, mean_q=mean_q, std=std)
    if bool((std <= 0).any()):
        raise ValueError("std: every transition needs a positive std (a deterministic step has no density)")
    if backend_for(next_states, backend) == "torch" or n == 0 or steps * d == 0:
        return trajectory_log_ratio_ref(next_states, mean_p, mean_q, std)
    if block is None:
        block = min(4096, triton.next_power_of_2(max(steps * d, 16)))
    elif block < 16 or block & (block - 1):
        raise ValueError(f"block: expected a power of two >= 16, got {block}")
    out = torch.empty(n, dtype=torch.float32, device=next_states.device)
    _trajectory_log_ratio_kernel[(n,)](next_states.float().contiguous(), mean_p.float().contiguous(),
                                       mean_q.float().contiguous(), std.float().contiguous(), out, steps, d,
                                       BLOCK=block)
    return out
