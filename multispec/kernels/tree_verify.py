"""Tree verification: walk a draft tree from the root, trying each node's children in sibling order.

Layout per row: T nodes, node 0 = the root (the last committed token; its token is ignored);
`first_child` / `next_sibling` [B, T] link the tree (-1 = none); target rows [B, T, ...] hold the
target after each node. Outputs: out_tokens [B, T] (accepted tokens then the correction/bonus),
out_path [B, T] (the accepted nodes, root first) and num_accepted [B]; padding is -1.

Random rows implement multi-draft speculative sampling (SpecInfer): child c with token x drawn from
q_c is accepted iff u_c * q_c(x) < r(x), where r is the running residual (initially the target p);
on rejection r <- norm(max(r - q_c, 0)); when the children run out, the emitted token is a sample of
r. This reproduces p exactly. Drafts without probabilities use one-hot q.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_linked_tree, check_same_device, check_tensor, links_in_tree
from .chain_verify import vocab_block
from .common import argmax_ref, row_argmax, row_race, sample_ref
from .dispatch import backend_for
from .tree_walk import walk_tree

# ---- PyTorch references -----------------------------------------------------------------------------


def tree_verify_greedy_ref(tokens, first_child, next_sibling, target_argmax):
    b, t = tokens.shape
    out = torch.full((b, t), -1, dtype=torch.long)
    path = torch.full((b, t), -1, dtype=torch.long)
    acc = torch.zeros(b, dtype=torch.long)
    tok, fc, ns, am = (x.tolist() for x in (tokens, first_child, next_sibling, target_argmax))
    for r in range(b):
        cur, a = 0, 0
        path[r, 0] = 0
        for _ in range(t):
            child, found = fc[r][cur], -1
            while child != -1:
                if tok[r][child] == am[r][cur]:
                    found = child
                    break
                child = ns[r][child]
            if found < 0:
                break
            out[r, a] = tok[r][found]
            a += 1
            path[r, a] = found
            cur = found
        out[r, a] = am[r][cur]
        acc[r] = a
    dev = tokens.device
    return out.to(dev), path.to(dev), acc.to(dev)


def _as_float32(target_probs, draft_probs, uniforms, exp_noise):
    """The random walk's inputs in float32, NaN probabilities as 0 (see `common`)."""
    p = torch.nan_to_num(target_probs.float(), nan=0.0)
    q = None if draft_probs is None else torch.nan_to_num(draft_probs.float(), nan=0.0)
    return p, q, uniforms.float(), exp_noise.float()


def tree_verify_random_ref(tokens, first_child, next_sibling, target_probs, draft_probs, uniforms, exp_noise,
                           is_greedy):
    b, t, v = target_probs.shape
    dev = tokens.device
    p_all, q_all, u_all, noise = _as_float32(target_probs, draft_probs, uniforms, exp_noise)
    out = torch.full((b, t), -1, dtype=torch.long, device=dev)
    path = torch.full((b, t), -1, dtype=torch.long, device=dev)
    acc = torch.zeros(b, dtype=torch.long, device=dev)
    tok, fc, ns = tokens.tolist(), first_child.tolist(), next_sibling.tolist()
    greedy = is_greedy.tolist()
    vocab = torch.arange(v, device=dev)
    for row in range(b):
        cur, a = 0, 0
        path[row, 0] = 0
        p = p_all[row]
        am = argmax_ref(p).tolist() if greedy[row] else None
        r, scale = p[0], torch.ones((), device=dev)  # residual r / scale; scale 1 while r is p itself
        for _ in range(t):
            child, found = fc[row][cur], -1
            while child != -1:
                x = tok[row][child]
                if greedy[row]:
                    if x == am[cur]:
                        found = child
                        break
                else:
                    inb = 0 <= x < v
                    q = q_all[row, child] if q_all is not None else (vocab == x).float()
                    qx = q[x] if inb else torch.zeros((), device=dev)
                    rx = r[x] / scale if inb else torch.zeros((), device=dev)
                    if inb and bool(u_all[row, child] * qx < rx):
                        found = child
                        break
                    r = (r / scale - q).clamp(min=0.0)
                    total = r.double().sum().float()
                    scale = total if total > 0 else torch.ones((), device=dev)
                child = ns[row][child]
            if found < 0:
                break
            out[row, a] = tok[row][found]
            a += 1
            path[row, a] = found
            cur = found
            r, scale = p[cur], torch.ones((), device=dev)
        if greedy[row]:
            out[row, a] = am[cur]
        else:
            out[row, a] = sample_ref(r[None], p[cur][None], noise[row][None])[0]
        acc[row] = a
    return out, path, acc


# ---- vectorised PyTorch (what runs off the GPU) -------------------------------------------------------
# The references above walk one row at a time in Python: readable, but 10^5 rows (a distribution test, a
# large batch) take minutes. These walk every row in lockstep, one sibling try per iteration (node
# indices only grow along a walk, so T iterations suffice), and equal the references token for token.
# Each iteration costs a dozen tensor ops, so below `BATCHED_FROM` rows the per-row walk is the faster
# (measured crossover; BENCHMARKS.md, "Verification walk").
BATCHED_FROM = 16


def tree_verify_greedy_batched(tokens, first_child, next_sibling, target_argmax):
    walk = walk_tree(tokens, first_child, next_sibling, lambda w, c, x, trying: x == target_argmax[w.rows, w.cur])
    walk.out[walk.rows, walk.acc] = target_argmax[walk.rows, walk.cur]
    return walk.out, walk.path, walk.acc


def residual_after_rejection(r: torch.Tensor, scale: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual after a sibling drawn from q was rejected: max(r / scale - q, 0), kept unnormalised with
    its sum as the new scale (1 where nothing is left). r [B, V], scale [B], q [B, V]."""
    r = (r / scale[:, None] - q).clamp(min=0.0)
    total = r.double().sum(dim=-1).float()
    return r, torch.where(total > 0, total, torch.ones_like(total))


def tree_verify_random_batched(tokens, first_child, next_sibling, target_probs, draft_probs, uniforms, exp_noise,
                               is_greedy):
    b, t, v = target_probs.shape
    dev = tokens.device
    p_all, q_all, u_all, noise = _as_float32(target_probs, draft_probs, uniforms, exp_noise)
    argmax = argmax_ref(p_all)  # [B, T]
    r = p_all[:, 0].clone()  # the running residual, r / scale normalised
    scale = torch.ones(b, device=dev)

    def accept(walk, c, x, trying):
        rows, cur = walk.rows, walk.cur
        inb = (x >= 0) & (x < v)
        xs = x.clamp(0, v - 1)
        if q_all is None:
            q = torch.zeros(b, v, device=dev)
            q[rows[inb], xs[inb]] = 1.0
        else:
            q = q_all[rows, c]
        qx = torch.where(inb, q[rows, xs], 0.0)
        rx = torch.where(inb, r[rows, xs] / scale, 0.0)
        ok_random = inb & (u_all[rows, c] * qx < rx)
        ok = trying & torch.where(is_greedy, x == argmax[rows, cur], ok_random)
        rejected = trying & ~ok & ~is_greedy
        if bool(rejected.any()):
            new_r, new_scale = residual_after_rejection(r[rejected], scale[rejected], q[rejected])
            r[rejected], scale[rejected] = new_r, new_scale
        if bool(ok.any()):
            r[ok] = p_all[rows[ok], c[ok]]
            scale[ok] = 1.0
        return ok

    walk = walk_tree(tokens, first_child, next_sibling, accept)
    rows = walk.rows
    final = sample_ref(r, p_all[rows, walk.cur], noise)
    walk.out[rows, walk.acc] = torch.where(is_greedy, argmax[rows, walk.cur], final)
    return walk.out, walk.path, walk.acc


# ---- Triton kernels -----------------------------------------------------------------------------------


@triton.jit
def _tree_greedy_kernel(out_ptr, path_ptr, acc_ptr, tok_ptr, fc_ptr, ns_ptr, argmax_ptr, T):
    b = tl.program_id(0).to(tl.int64)
    base = b * T
    cur = tl.full([], 0, tl.int64)
    a = tl.full([], 0, tl.int64)
    done = tl.full([], 0, tl.int32)
    tl.store(path_ptr + base, cur)
    for _ in range(0, T):
        if done == 0:
            want = tl.load(argmax_ptr + base + cur)
            child = tl.load(fc_ptr + base + cur)
            found = tl.full([], -1, tl.int64)
            steps = 0
            while (child != -1) & (found == -1) & (steps < T):
                if tl.load(tok_ptr + base + child) == want:
                    found = child
                child = tl.where(found == -1, tl.load(ns_ptr + base + child), child)
                steps += 1
            if found == -1:
                done = 1
            else:
                tl.store(out_ptr + base + a, tl.load(tok_ptr + base + found))
                a += 1
                tl.store(path_ptr + base + a, found)
                cur = found
    tl.store(out_ptr + base + a, tl.load(argmax_ptr + base + cur))
    tl.store(acc_ptr + b, a)


@triton.jit
def _residual_step(r_src, scale, q_ptr, x, ws_ptr, V, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    """ws <- max(r_src / scale - q, 0) over the row; returns the new scale (sum, or 1 if it is 0)."""
    total = tl.full([], 0.0, tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        inb = offs < V
        r = tl.load(r_src + offs, mask=inb, other=0.0).to(tl.float32)
        r = tl.where(r == r, r, 0.0)
        if HAS_Q:
            q = tl.load(q_ptr + offs, mask=inb, other=0.0).to(tl.float32)
            q = tl.where(q == q, q, 0.0)
        else:
            q = tl.where(offs == x, 1.0, 0.0)
        new = tl.maximum(r / scale - q, 0.0)
        new = tl.where(inb, new, 0.0)
        tl.store(ws_ptr + offs, new, mask=inb)
        total += tl.sum(new.to(tl.float64), axis=0)
    total32 = total.to(tl.float32)
    return tl.where(total32 > 0, total32, 1.0)


@triton.jit
def _tree_random_kernel(out_ptr, path_ptr, acc_ptr, tok_ptr, fc_ptr, ns_ptr, p_ptr, q_ptr, u_ptr, e_ptr,
                        greedy_ptr, ws_ptr, T, V, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    base = b * T
    greedy = tl.load(greedy_ptr + b) != 0
    ws = ws_ptr + b * V
    cur = tl.full([], 0, tl.int64)
    a = tl.full([], 0, tl.int64)
    done = tl.full([], 0, tl.int32)
    in_ws = tl.full([], 0, tl.int32)  # 0: the residual is the target row p[cur] itself; 1: it is in ws
    scale = tl.full([], 1.0, tl.float32)
    tl.store(path_ptr + base, cur)
    for _ in range(0, T):
        if done == 0:
            p_row = p_ptr + (base + cur) * V
            if greedy:
                want = row_argmax(p_row, V, BLOCK_V)
            else:
                want = tl.full([], -1, tl.int64)
            child = tl.load(fc_ptr + base + cur)
            found = tl.full([], -1, tl.int64)
            steps = 0
            while (child != -1) & (found == -1) & (steps < T):
                x = tl.load(tok_ptr + base + child)
                if greedy:
                    if x == want:
                        found = child
                else:
                    inb = (x >= 0) & (x < V)
                    xs = tl.where(inb, x, 0)
                    if HAS_Q:
                        qx = tl.load(q_ptr + (base + child) * V + xs).to(tl.float32)
                        qx = tl.where((qx == qx) & inb, qx, 0.0)
                    else:
                        qx = tl.where(inb, 1.0, 0.0)
                    if in_ws == 0:
                        rx = tl.load(p_row + xs).to(tl.float32)
                    else:
                        rx = tl.load(ws + xs)
                    rx = tl.where((rx == rx) & inb, rx, 0.0) / scale
                    u = tl.load(u_ptr + base + child).to(tl.float32)
                    if (u * qx < rx) & inb:
                        found = child
                    else:
                        if in_ws == 0:
                            scale = _residual_step(p_row, scale, q_ptr + (base + child) * V, x, ws, V, HAS_Q,
                                                   BLOCK_V)
                        else:
                            scale = _residual_step(ws, scale, q_ptr + (base + child) * V, x, ws, V, HAS_Q,
                                                   BLOCK_V)
                        in_ws = 1
                child = tl.where(found == -1, tl.load(ns_ptr + base + child), child)
                steps += 1
            if found == -1:
                done = 1
            else:
                tl.store(out_ptr + base + a, tl.load(tok_ptr + base + found))
                a += 1
                tl.store(path_ptr + base + a, found)
                cur = found
                in_ws = 0
                scale = 1.0
    p_row = p_ptr + (base + cur) * V
    e_row = e_ptr + b * V
    if greedy:
        final = row_argmax(p_row, V, BLOCK_V)
    else:
        if in_ws == 0:
            best_idx, best_val = row_race(p_row, e_row, V, BLOCK_V)
        else:
            best_idx, best_val = row_race(ws, e_row, V, BLOCK_V)
        final = best_idx
        if best_val < 0:
            fb_idx, fb_val = row_race(p_row, e_row, V, BLOCK_V)
            final = tl.where(fb_val >= 0, fb_idx, 0)
    tl.store(out_ptr + base + a, final)
    tl.store(acc_ptr + b, a)


# ---- public wrappers ----------------------------------------------------------------------------------


def _check_tree(tokens, first_child, next_sibling):
    check_tensor(tokens, "tokens", 2, "int")
    b, t = tokens.shape
    if t < 1:
        raise ValueError("tokens: a tree needs at least the root node")
    check_tensor(first_child, "first_child", 2, "int", (b, t))
    check_tensor(next_sibling, "next_sibling", 2, "int", (b, t))
    check_linked_tree(first_child, next_sibling)
    return b, t


def tree_verify_greedy(tokens: torch.Tensor,  # [B, T] int: the full tree, node 0 the root
                       first_child: torch.Tensor,  # [B, T] int, -1: none
                       next_sibling: torch.Tensor,  # [B, T] int, -1: none
                       target_argmax: torch.Tensor,  # [B, T] int: after each node
                       *, backend: str | None = None):
    """Greedy tree walk: follow the child whose token is the target's argmax after its parent.

    Returns (out_tokens [B, T], out_path [B, T], num_accepted [B]), padded with -1."""
    b, t = _check_tree(tokens, first_child, next_sibling)
    check_tensor(target_argmax, "target_argmax", 2, "int", (b, t))
    check_same_device(tokens.device, first_child=first_child, next_sibling=next_sibling,
                      target_argmax=target_argmax)
    args = [x.long().contiguous() for x in (tokens, first_child, next_sibling, target_argmax)]
    if backend_for(tokens, backend) == "torch":
        return (tree_verify_greedy_batched if b >= BATCHED_FROM else tree_verify_greedy_ref)(*args)
    out = torch.full((b, t), -1, dtype=torch.long, device=tokens.device)
    path = torch.full((b, t), -1, dtype=torch.long, device=tokens.device)
    acc = torch.zeros(b, dtype=torch.long, device=tokens.device)
    if b:
        args[1], args[2] = links_in_tree(args[1]), links_in_tree(args[2])
        _tree_greedy_kernel[(b,)](out, path, acc, *args, t)
    return out, path, acc


def tree_verify_random(tokens: torch.Tensor,  # [B, T] int: the full tree, node 0 the root
                       first_child: torch.Tensor,  # [B, T] int, -1: none
                       next_sibling: torch.Tensor,  # [B, T] int, -1: none
                       target_probs: torch.Tensor,  # [B, T, V] float: after each node
                       draft_probs: torch.Tensor | None,  # [B, T, V] float: what each node was drawn from
                       uniforms: torch.Tensor,  # [B, T] float in [0, 1)
                       exp_noise: torch.Tensor,  # [B, V] float, Exp(1) draws
                       is_greedy: torch.Tensor,  # [B] bool
                       *, backend: str | None = None, block_v: int | None = None):
    """Multi-draft speculative sampling over a tree (greedy rows use the argmax walk).

    `draft_probs[b, i]` is the distribution node i's token was drawn from (row 0 unused; None = one-hot);
    `uniforms[b, i]` is node i's coin; `exp_noise[b]` drives the final sample.
    Returns (out_tokens [B, T], out_path [B, T], num_accepted [B])."""
    b, t = _check_tree(tokens, first_child, next_sibling)
    check_tensor(target_probs, "target_probs", 3, "float", (b, t, None))
    v = target_probs.shape[2]
    if draft_probs is not None:
        check_tensor(draft_probs, "draft_probs", 3, "float", (b, t, v))
    check_tensor(uniforms, "uniforms", 2, "float", (b, t))
    check_tensor(exp_noise, "exp_noise", 2, "float", (b, v))
    check_tensor(is_greedy, "is_greedy", 1, "any", (b,))
    check_same_device(tokens.device, first_child=first_child, next_sibling=next_sibling, target_probs=target_probs,
                      draft_probs=draft_probs, uniforms=uniforms, exp_noise=exp_noise, is_greedy=is_greedy)
    tokens, first_child, next_sibling = (x.long().contiguous() for x in (tokens, first_child, next_sibling))
    if backend_for(tokens, backend) == "torch":
        walk = tree_verify_random_batched if b >= BATCHED_FROM else tree_verify_random_ref
        return walk(tokens, first_child, next_sibling, target_probs, draft_probs, uniforms, exp_noise,
                    is_greedy.bool())
    out = torch.full((b, t), -1, dtype=torch.long, device=tokens.device)
    path = torch.full((b, t), -1, dtype=torch.long, device=tokens.device)
    acc = torch.zeros(b, dtype=torch.long, device=tokens.device)
    if b:
        p = target_probs.float().contiguous()
        q = draft_probs.float().contiguous() if draft_probs is not None else p  # dummy when absent
        ws = torch.empty(b, v, dtype=torch.float32, device=tokens.device)
        first_child, next_sibling = links_in_tree(first_child), links_in_tree(next_sibling)
        _tree_random_kernel[(b,)](out, path, acc, tokens, first_child, next_sibling, p, q,
                                  uniforms.float().contiguous(), exp_noise.float().contiguous(),
                                  is_greedy.to(torch.int8).contiguous(), ws, t, v, HAS_Q=draft_probs is not None,
                                  BLOCK_V=vocab_block(v, block_v))
    return out, path, acc
