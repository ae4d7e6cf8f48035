"""The gated delta rule (Qwen3-Next's linear attention, Gated DeltaNet) over a draft tree: every node's output
as if its root path were decoded alone, and every node's state, so the commit keeps the last accepted node's.

Per value head, with the state S [Dk, Dv] of the node's parent (the initial state for a root), a node's
L2-normed key k and query q (q also scaled by Dk^-1/2), value v, decay g (log space) and write strength beta:

    S <- S * exp(g);   S <- S + k (beta (v - S^T k))^T;   o = S^T q

the recurrence `transformers` runs token by token (`torch_recurrent_gated_delta_rule`), with "previous token"
replaced by "parent". Nodes are visited in index order (a parent's index is below its child's), so a chain
is the plain recurrence.

- `tree_gated_delta_rule_reference`: the readable PyTorch loop over nodes.
- `tree_delta_rule_kernel`: one Triton program per (row, value head, block of BV value channels) walks the
  nodes in order, loading the parent's state slice from the states it stores for the commit (a barrier
  between each node's store and the next load: threads read what other threads wrote).
- `tree_gated_delta_rule`: normalises q and k, repeats key heads over value heads, and dispatches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multispec.plugin import backend_for


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)  # transformers' (and FLA's) eps


def tree_gated_delta_rule_reference(q, k, v, g, beta, parents, initial_state):
    """q, k [B, T, H, Dk] (normed and scaled), v [B, T, H, Dv], g and beta [B, T, H], parents [B, T],
    initial_state [B, H, Dk, Dv]; all float32. Returns (outputs [B, T, H, Dv], states [B, T, H, Dk, Dv])."""
    b, t = parents.shape
    rows = torch.arange(b, device=q.device)
    states = q.new_empty(b, t, *initial_state.shape[1:])
    out = torch.empty_like(v)
    for node in range(t):
        parent = parents[:, node]
        state = torch.where((parent < 0).view(b, 1, 1, 1), initial_state, states[rows, parent.clamp(min=0)])
        state = state * g[:, node].exp()[..., None, None]
        remembered = (state * k[:, node, ..., None]).sum(dim=-2)
        delta = (v[:, node] - remembered) * beta[:, node, ..., None]
        state = state + k[:, node, ..., None] * delta[..., None, :]
        states[:, node] = state
        out[:, node] = (state * q[:, node, ..., None]).sum(dim=-2)
    return out, states


@triton.jit
def tree_delta_rule_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, par_ptr, h0_ptr, out_ptr, st_ptr,
                           T, DK, DV, sqb, sqt, sqh, sqd, svb, svt, svh, svd, sgb, sgt, sgh, spb, spt,
                           shb, shh, shk, shv, sob, sot, soh, sov, ssb, sst, ssh, ssk, ssv,
                           BK: tl.constexpr, BV: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    cv = tl.program_id(2) * BV + tl.arange(0, BV)
    ck = tl.arange(0, BK)
    vm, km = cv < DV, ck < DK
    both = km[:, None] & vm[None, :]
    state_off = ck[:, None] * ssk + cv[None, :] * ssv
    for node in range(T):
        parent = tl.load(par_ptr + row * spb + node * spt)
        from_h0 = tl.load(h0_ptr + row * shb + head * shh + ck[:, None] * shk + cv[None, :] * shv,
                          mask=both & (parent < 0), other=0.0)
        from_parent = tl.load(st_ptr + row * ssb + tl.maximum(parent, 0) * sst + head * ssh + state_off,
                              mask=both & (parent >= 0), other=0.0)
        state = from_h0 + from_parent
        qk_at = row * sqb + node * sqt + head * sqh + ck * sqd
        q = tl.load(q_ptr + qk_at, mask=km, other=0.0)
        k = tl.load(k_ptr + qk_at, mask=km, other=0.0)
        v = tl.load(v_ptr + row * svb + node * svt + head * svh + cv * svd, mask=vm, other=0.0)
        g = tl.load(g_ptr + row * sgb + node * sgt + head * sgh)
        beta = tl.load(beta_ptr + row * sgb + node * sgt + head * sgh)
        state = state * tl.exp(g)
        delta = (v - tl.sum(state * k[:, None], axis=0)) * beta
        state = state + k[:, None] * delta[None, :]
        tl.store(out_ptr + row * sob + node * sot + head * soh + cv * sov, tl.sum(state * q[:, None], axis=0),
                 mask=vm)
        tl.store(st_ptr + row * ssb + node * sst + head * ssh + state_off, state, mask=both)
        tl.debug_barrier()  # the next node may read this state through other threads


def tree_gated_delta_rule_triton(q, k, v, g, beta, parents, initial_state, *, block_v: int | None = None):
    """`tree_gated_delta_rule_reference` by `tree_delta_rule_kernel` (same arguments, float32, and q, k of the
    value heads' count)."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    out = torch.empty(b, t, h, dv, dtype=torch.float32, device=q.device)
    states = torch.empty(b, t, h, dk, dv, dtype=torch.float32, device=q.device)
    if b == 0 or t == 0:
        return out, states
    k = k.contiguous() if k.stride() != q.stride() else k
    g, beta = g.contiguous(), beta.contiguous()
    bk = triton.next_power_of_2(dk)
    bv = block_v or min(64, triton.next_power_of_2(dv))
    tree_delta_rule_kernel[(b, h, triton.cdiv(dv, bv))](
        q, k, v, g, beta, parents, initial_state, out, states, t, dk, dv,
        *q.stride(), *v.stride(), *g.stride(), *parents.stride(), *initial_state.stride(), *out.stride(),
        *states.stride(), BK=bk, BV=bv)
    return out, states


def tree_gated_delta_rule(query, key, value, g, beta, parents, initial_state, backend: str | None = None):
    """The gated delta rule over a tree, as Qwen3-Next's linear attention applies it (q and k L2-normed in
    float32, q scaled by Dk^-1/2; each key head serves `Hv / Hk` consecutive value heads).

    query, key [B, T, Hk, Dk], value [B, T, Hv, Dv], g (log decay) and beta [B, T, Hv], parents [B, T] (each
    node's parent index, below its own; -1 for a root), initial_state [B, Hv, Dk, Dv].
    Returns (outputs [B, T, Hv, Dv] float32, every node's state [B, T, Hv, Dk, Dv] float32)."""
    b, t, hk, dk = query.shape
    if key.shape != query.shape:
        raise ValueError(f"key: expected the query's shape {tuple(query.shape)}, got {tuple(key.shape)}")
    if value.dim() != 4 or value.shape[:2] != (b, t) or value.shape[2] % hk:
        raise ValueError(f"value: expected [{b}, {t}, a multiple of {hk} heads, Dv], got {tuple(value.shape)}")
    hv, dv = value.shape[2:]
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != (b, t, hv):
            raise ValueError(f"{name}: expected {(b, t, hv)}, got {tuple(x.shape)}")
    if parents.shape != (b, t):
        raise ValueError(f"parents: expected {(b, t)}, got {tuple(parents.shape)}")
    if initial_state.shape != (b, hv, dk, dv):
        raise ValueError(f"initial_state: expected {(b, hv, dk, dv)}, got {tuple(initial_state.shape)}")
    q = _l2norm(query.float()) * dk ** -0.5
    k = _l2norm(key.float())
    if hv != hk:
        q, k = q.repeat_interleave(hv // hk, dim=2), k.repeat_interleave(hv // hk, dim=2)
    args = (q, k, value.float(), g.float(), beta.float(), parents, initial_state.float())
    if backend_for(query, backend) == "triton":
        return tree_gated_delta_rule_triton(*args)
    return tree_gated_delta_rule_reference(*args)
