"""Triton kernels for the tree scan and the tree conv, with dispatch to the PyTorch references in
`ssm.tree_scan` (the semantics; see there for the formulas).

- `tree_ssd_chunk_kernel`: SSD's chunk scan with the tree's ancestor mask as the causal mask. One program per
  (row, head, block of BT output nodes, block of BP head channels); it loops over source blocks of BT nodes,
  skipping blocks that hold no ancestor of its nodes (most of them: a parent's index is below its child's in
  the usual order, but any order is correct), and over the state in BN-wide slices, so every product is a
  small `tl.dot` on tensor cores and no tile grows with the tree. Path decays are summed in-kernel from the
  mask, again in BT-wide slices. A one-tile kernel (the whole tree per program, fp32 FMA products) ran
  12-18x slower than the reference at realistic sizes: its tiles spilled registers (BENCHMARKS.md, GPU).
- `tree_conv_kernel`: one program per (row, block of nodes, block of channels); each node's window is read
  from `sources` when the caller computed them once per tree, else found in-kernel by walking `parents`
  K - 1 steps up (no host-side walk over the whole tree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from multispec.plugin import backend_for

from .tree_scan import tree_conv1d, tree_ssd

# Products in 3xTF32: tensor cores at close to fp32 accuracy (plain TF32 keeps 10 mantissa bits, enough to
# flip a greedy argmax against the fp32 reference). The interpreter computes in fp32 whatever this says.
SCAN_PRECISION = "tf32x3"


@triton.jit
def _path_decay(anc_ptr, a_ptr, nodes, node_mask, T, sat, sas, dt_stride, A, BT: tl.constexpr):
    """sum_s anc[node, s] * dt_s * A for a block of nodes, over source slices of BT."""
    acc = tl.zeros([BT], dtype=tl.float32)
    for f0 in range(0, T, BT):
        f = f0 + tl.arange(0, BT)
        fm = f < T
        a = tl.load(a_ptr + f * dt_stride, mask=fm, other=0.0).to(tl.float32) * A
        anc = tl.load(anc_ptr + nodes[:, None] * sat + f[None, :] * sas, mask=node_mask[:, None] & fm[None, :],
                      other=0) != 0
        acc += tl.sum(tl.where(anc, a[None, :], 0.0), axis=1)
    return acc


@triton.jit
def tree_ssd_chunk_kernel(x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, anc_ptr, h0_ptr, y_ptr,
                          T, P, N, heads_per_group, p_blocks,
                          sxb, sxt, sxh, sxp, sdb, sdt, sdh, sbb, sbt, sbg, sbn, scb, sct, scg, scn,
                          sab, sat, sas, shb, shh, shp, shn, syb, syt, syh, syp,
                          HAS_D: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
                          PRECISION: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    t_block = tl.program_id(2) // p_blocks
    p_block = tl.program_id(2) % p_blocks
    group = head // heads_per_group
    t = t_block * BT + tl.arange(0, BT)
    p = p_block * BP + tl.arange(0, BP)
    tm, pm = t < T, p < P
    A = tl.load(a_ptr + head).to(tl.float32)
    anc_row = anc_ptr + row * sab
    dt_row = dt_ptr + row * sdb + head * sdh
    c_row = c_ptr + row * scb + group * scg
    b_row = b_ptr + row * sbb + group * sbg
    x_row = x_ptr + row * sxb + head * sxh
    acum_t = _path_decay(anc_row, dt_row, t, tm, T, sat, sas, sdt, A, BT)

    # initial-state term: exp(Acum_t) C_t . h0, the state in slices of BN
    y = tl.zeros([BT, BP], dtype=tl.float32)
    for n0 in range(0, N, BN):
        n = n0 + tl.arange(0, BN)
        nm = n < N
        C = tl.load(c_row + t[:, None] * sct + n[None, :] * scn, mask=tm[:, None] & nm[None, :], other=0.0)
        h0 = tl.load(h0_ptr + row * shb + head * shh + p[None, :] * shp + n[:, None] * shn,
                     mask=nm[:, None] & pm[None, :], other=0.0)  # [BN, BP] = h0^T
        y += tl.dot(C.to(tl.float32), h0.to(tl.float32), input_precision=PRECISION)
    y = y * tl.exp(acum_t)[:, None]

    for s0 in range(0, T, BT):
        s = s0 + tl.arange(0, BT)
        sm = s < T
        anc = tl.load(anc_row + t[:, None] * sat + s[None, :] * sas, mask=tm[:, None] & sm[None, :], other=0) != 0
        if tl.max(anc.to(tl.int32)) > 0:  # this source block holds an ancestor of some node of ours
            acum_s = _path_decay(anc_row, dt_row, s, sm, T, sat, sas, sdt, A, BT)
            dt_s = tl.load(dt_row + s * sdt, mask=sm, other=0.0).to(tl.float32)
            cb = tl.zeros([BT, BT], dtype=tl.float32)
            for n0 in range(0, N, BN):
                n = n0 + tl.arange(0, BN)
                nm = n < N
                C = tl.load(c_row + t[:, None] * sct + n[None, :] * scn, mask=tm[:, None] & nm[None, :], other=0.0)
                B = tl.load(b_row + s[:, None] * sbt + n[None, :] * sbn, mask=sm[:, None] & nm[None, :], other=0.0)
                cb += tl.dot(C.to(tl.float32), tl.trans(B.to(tl.float32)), input_precision=PRECISION)
            # masked before exp: off-path differences could overflow
            decay = tl.exp(tl.where(anc, acum_t[:, None] - acum_s[None, :], 0.0))
            w = tl.where(anc, cb * decay * dt_s[None, :], 0.0)
            x = tl.load(x_row + s[:, None] * sxt + p[None, :] * sxp, mask=sm[:, None] & pm[None, :], other=0.0)
            y += tl.dot(w, x.to(tl.float32), input_precision=PRECISION)
    if HAS_D:
        x_t = tl.load(x_row + t[:, None] * sxt + p[None, :] * sxp, mask=tm[:, None] & pm[None, :], other=0.0)
        y += tl.load(d_ptr + head).to(tl.float32) * x_t.to(tl.float32)
    tl.store(y_ptr + row * syb + t[:, None] * syt + head * syh + p[None, :] * syp, y,
             mask=tm[:, None] & pm[None, :])


def _block(n: int, cap: int) -> int:
    """A tile side for n: a power of two, at least 16 (`tl.dot`'s minimum), at most cap."""
    return min(cap, max(16, triton.next_power_of_2(max(n, 1))))


@dataclass(frozen=True)
class ScanTiles:
    """`tree_ssd_chunk_kernel`'s tuning knobs: tile sides over nodes, head dim and state (None: the next power
    of two of the size, from 16 to 64) and warps per program (the sweep: BENCHMARKS.md, GPU)."""

    block_t: int | None = None
    block_p: int | None = None
    block_n: int | None = None
    num_warps: int = 4


def tree_ssd_triton(x, dt, A, B, C, D, ancestors, initial_state, *, tiles: ScanTiles = ScanTiles(),
                    precision: str = SCAN_PRECISION):
    """`tree_ssd` by `tree_ssd_chunk_kernel`, tiled by `tiles`."""
    block_t, block_p, block_n, num_warps = tiles.block_t, tiles.block_p, tiles.block_n, tiles.num_warps
    b, t, heads, p = x.shape
    g, n = B.shape[2], B.shape[3]
    y = torch.empty(b, t, heads, p, dtype=torch.float32, device=x.device)
    if b == 0 or t == 0:
        return y
    anc = ancestors if ancestors.dtype == torch.int8 else ancestors.to(torch.int8)
    bt, bp, bn = block_t or _block(t, 64), block_p or _block(p, 64), block_n or _block(n, 64)
    p_blocks = triton.cdiv(p, bp)
    d = D if D is not None else A
    tree_ssd_chunk_kernel[(b, heads, triton.cdiv(t, bt) * p_blocks)](
        x, dt, A, B, C, d, anc, initial_state, y, t, p, n, heads // g, p_blocks,
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *anc.stride(), *initial_state.stride(), *y.stride(),
        HAS_D=D is not None, BT=bt, BP=bp, BN=bn, PRECISION=precision, num_warps=num_warps)
    return y


def _check_ssd(x, dt, A, B, C, D, ancestors, initial_state) -> None:
    if x.dim() != 4:
        raise ValueError(f"x: expected [batch, nodes, heads, head_dim], got shape {tuple(x.shape)}")
    b, t, heads, p = x.shape
    if dt.shape != (b, t, heads):
        raise ValueError(f"dt: expected {(b, t, heads)}, got {tuple(dt.shape)}")
    if A.shape != (heads,) or (D is not None and D.shape != (heads,)):
        raise ValueError(f"A/D: expected ({heads},), got {tuple(A.shape)} / {None if D is None else tuple(D.shape)}")
    if B.dim() != 4 or B.shape[:2] != (b, t) or B.shape != C.shape or heads % B.shape[2]:
        raise ValueError(f"B/C: expected equal [batch, nodes, groups | heads, state], got {tuple(B.shape)}, "
                         f"{tuple(C.shape)}")
    if ancestors.shape != (b, t, t):
        raise ValueError(f"ancestors: expected {(b, t, t)}, got {tuple(ancestors.shape)}")
    if initial_state.shape != (b, heads, p, B.shape[3]):
        raise ValueError(f"initial_state: expected {(b, heads, p, B.shape[3])}, got {tuple(initial_state.shape)}")


def tree_ssd_dispatch(x, dt, A, B, C, D, ancestors, initial_state, backend: str | None = None) -> torch.Tensor:
    """`tree_ssd` on the backend chosen for `x` (Triton on CUDA, the reference elsewhere)."""
    _check_ssd(x, dt, A, B, C, D, ancestors, initial_state)
    if backend_for(x, backend) == "triton":
        return tree_ssd_triton(x, dt, A, B, C, D, ancestors, initial_state)
    return tree_ssd(x, dt, A, B, C, D, ancestors, initial_state)


# ---- tree conv ----------------------------------------------------------------------------------------


@triton.jit
def tree_conv_kernel(xbc_ptr, state_ptr, src_ptr, par_ptr, w_ptr, bias_ptr, out_ptr, T, C,
                     sxb, sxt, sxc, ssb, ssc, ssk, srb, srt, srk, spb, spt, swc, swk, sob, sot, soc,
                     K: tl.constexpr, HAS_BIAS: tl.constexpr, WALK: tl.constexpr, BTN: tl.constexpr,
                     BC: tl.constexpr):
    row = tl.program_id(0)
    t = tl.program_id(1) * BTN + tl.arange(0, BTN)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    tm, cm = t < T, c < C
    both = tm[:, None] & cm[None, :]
    acc = tl.zeros([BTN, BC], dtype=tl.float32)
    cur = t  # the j-th ancestor of each node while walking (-1 past the root)
    missing = tl.zeros([BTN], dtype=tl.int32)
    for j in tl.static_range(K):  # j-th ancestor = window slot K - 1 - j (the window is oldest first)
        if WALK:
            on_tree = cur >= 0
            missing += (~on_tree).to(tl.int32)
            # past the root, slots read the conv state from its newest column (K - 1) backwards
            src = tl.where(on_tree, K + cur, K - missing)
            if j + 1 < K:
                up = tl.load(par_ptr + row * spb + tl.maximum(cur, 0) * spt, mask=tm & on_tree, other=-1)
                cur = tl.where(on_tree, up.to(tl.int32), -1)
        else:
            src = tl.load(src_ptr + row * srb + t * srt + (K - 1 - j) * srk, mask=tm, other=0).to(tl.int32)
        in_tree = src >= K
        from_tree = tl.load(xbc_ptr + row * sxb + tl.maximum(src - K, 0)[:, None] * sxt + c[None, :] * sxc,
                            mask=both & in_tree[:, None], other=0.0)
        from_state = tl.load(state_ptr + row * ssb + c[None, :] * ssc + tl.minimum(src, K - 1)[:, None] * ssk,
                             mask=both & (src < K)[:, None], other=0.0)
        val = tl.where(in_tree[:, None], from_tree.to(tl.float32), from_state.to(tl.float32))
        acc += val * tl.load(w_ptr + c * swc + (K - 1 - j) * swk, mask=cm, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=cm, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + row * sob + t[:, None] * sot + c[None, :] * soc, acc, mask=both)


def tree_conv1d_triton(xbc, conv_state, parents, weight, bias, sources=None, *, block_nodes: int | None = None,
                       block_c: int | None = None, num_warps: int = 4):
    """`tree_conv1d` by `tree_conv_kernel`; without `sources` the kernel walks `parents` itself."""
    b, t, c = xbc.shape
    k = conv_state.shape[-1]
    out = torch.empty(b, t, c, dtype=torch.float32, device=xbc.device)
    if b == 0 or t == 0:
        return out
    walk = sources is None
    src = parents if walk else sources  # unused by the other branch; any tensor with strides will do
    btn = block_nodes or min(16, triton.next_power_of_2(t))
    bc = block_c or min(128, triton.next_power_of_2(c))
    tree_conv_kernel[(b, triton.cdiv(t, btn), triton.cdiv(c, bc))](
        xbc, conv_state, src, parents, weight, bias if bias is not None else weight, out, t, c,
        *xbc.stride(), *conv_state.stride(), *(src.stride() if not walk else (0, 0, 0)), *parents.stride(),
        *weight.stride(), *out.stride(),
        K=k, HAS_BIAS=bias is not None, WALK=walk, BTN=btn, BC=bc, num_warps=num_warps)
    return out


def tree_conv1d_dispatch(xbc, conv_state, parents, weight, bias, backend: str | None = None, sources=None):
    """Pre-activation conv [B, T, C] of every node along its path (see `ssm.tree_scan.tree_conv_windows`);
    `sources`: `conv_sources(parents, K)` when the caller computed it once for all layers."""
    if xbc.dim() != 3 or conv_state.shape[:2] != (xbc.shape[0], xbc.shape[2]):
        raise ValueError(f"conv_state: expected [batch, channels, K] matching xbc {tuple(xbc.shape)}, got "
                         f"{tuple(conv_state.shape)}")
    if weight.shape != (xbc.shape[2], conv_state.shape[2]):
        raise ValueError(f"weight: expected {(xbc.shape[2], conv_state.shape[2])}, got {tuple(weight.shape)}")
    if parents.shape != xbc.shape[:2]:
        raise ValueError(f"parents: expected {tuple(xbc.shape[:2])}, got {tuple(parents.shape)}")
    if sources is not None and sources.shape != (*parents.shape, conv_state.shape[2]):
        raise ValueError(f"sources: expected {(*parents.shape, conv_state.shape[2])}, got {tuple(sources.shape)}")
    if backend_for(xbc, backend) == "triton":
        return tree_conv1d_triton(xbc, conv_state, parents, weight, bias, sources)
    return tree_conv1d(xbc, conv_state, parents, weight, bias, sources)
