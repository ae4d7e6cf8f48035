"""Triton kernels for the tree scan and the tree conv, with dispatch to the PyTorch references in
`ssm.tree_scan` (the semantics; see there for the formulas).

- `tree_ssd_kernel`: one program per (row, head); the whole tree (T <= 128 nodes) is one tile: path
  decays from the ancestor mask, (C B^T) masked by the tree and weighted by exp(Acum_t - Acum_s) dt_s,
  times x, plus the initial-state term and D x. Node order is free.
- `tree_conv_kernel`: one program per (row, channel block, node); the window's K source positions are
  precomputed (`conv_sources`: conv-state column j < K, or tree node t stored as K + t), the kernel gathers and
  applies the depthwise weights and bias.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multispec.kernels.dispatch import backend_for

from .tree_scan import conv_sources, tree_conv1d, tree_ssd

MAX_TREE = 128


@triton.jit
def tree_ssd_kernel(x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, anc_ptr, h0_ptr, y_ptr,
                    T, P, N, heads_per_group,
                    sxb, sxt, sxh, sxp, sdb, sdt, sdh, sbb, sbt, sbg, sbn, scb, sct, scg, scn,
                    sab, sat, sas, shb, shh, shp, shn, syb, syt, syh, syp,
                    HAS_D: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    group = head // heads_per_group
    t = tl.arange(0, BT)
    p = tl.arange(0, BP)
    n = tl.arange(0, BN)
    tm, pm, nm = t < T, p < P, n < N
    A = tl.load(a_ptr + head).to(tl.float32)
    dt = tl.load(dt_ptr + row * sdb + t * sdt + head * sdh, mask=tm, other=0.0).to(tl.float32)
    anc = tl.load(anc_ptr + row * sab + t[:, None] * sat + t[None, :] * sas,
                  mask=tm[:, None] & tm[None, :], other=0) != 0  # [BT(t), BT(s)]
    a = dt * A
    acum = tl.sum(tl.where(anc, a[None, :], 0.0), axis=1)  # [BT]
    C = tl.load(c_ptr + row * scb + t[:, None] * sct + group * scg + n[None, :] * scn,
                mask=tm[:, None] & nm[None, :], other=0.0).to(tl.float32)  # [BT, BN]
    B = tl.load(b_ptr + row * sbb + t[:, None] * sbt + group * sbg + n[None, :] * sbn,
                mask=tm[:, None] & nm[None, :], other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * sxb + t[:, None] * sxt + head * sxh + p[None, :] * sxp,
                mask=tm[:, None] & pm[None, :], other=0.0).to(tl.float32)  # [BT, BP]
    cb = tl.dot(C, tl.trans(B), input_precision="ieee")  # [BT, BT]
    diff = tl.where(anc, acum[:, None] - acum[None, :], 0.0)  # masked before exp: no overflow off-path
    w = tl.where(anc, cb * tl.exp(diff) * dt[None, :], 0.0)
    y = tl.dot(w, x, input_precision="ieee")  # [BT, BP]
    h0 = tl.load(h0_ptr + row * shb + head * shh + p[None, :] * shp + n[:, None] * shn,
                 mask=nm[:, None] & pm[None, :], other=0.0).to(tl.float32)  # [BN, BP] = h0^T
    y += tl.exp(acum)[:, None] * tl.dot(C, h0, input_precision="ieee")
    if HAS_D:
        y += tl.load(d_ptr + head).to(tl.float32) * x
    tl.store(y_ptr + row * syb + t[:, None] * syt + head * syh + p[None, :] * syp, y,
             mask=tm[:, None] & pm[None, :])


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def tree_ssd_triton(x, dt, A, B, C, D, ancestors, initial_state):
    b, t, heads, p = x.shape
    g, n = B.shape[2], B.shape[3]
    if t > MAX_TREE:
        raise ValueError(f"x: trees of at most {MAX_TREE} nodes per tile, got {t}")
    y = torch.empty(b, t, heads, p, dtype=torch.float32, device=x.device)
    if b == 0 or t == 0:
        return y
    anc = ancestors.to(torch.int8).contiguous()
    d = D if D is not None else A
    tree_ssd_kernel[(b, heads)](
        x, dt, A, B, C, d, anc, initial_state, y, t, p, n, heads // g,
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *anc.stride(), *initial_state.stride(), *y.stride(),
        HAS_D=D is not None, BT=_block(t), BP=_block(p), BN=_block(n))
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
    if backend_for(x, backend) == "triton" and x.shape[1] <= MAX_TREE:
        return tree_ssd_triton(x, dt, A, B, C, D, ancestors, initial_state)
    return tree_ssd(x, dt, A, B, C, D, ancestors, initial_state)


# ---- tree conv ----------------------------------------------------------------------------------------


@triton.jit
def tree_conv_kernel(xbc_ptr, state_ptr, src_ptr, w_ptr, bias_ptr, out_ptr, T, C,
                     sxb, sxt, sxc, ssb, ssc, ssk, srb, srt, srk, swc, swk, sob, sot, soc,
                     K: tl.constexpr, HAS_BIAS: tl.constexpr, BC: tl.constexpr):
    row = tl.program_id(0)
    node = tl.program_id(1)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    cm = c < C
    acc = tl.zeros([BC], dtype=tl.float32)
    for j in tl.static_range(K):
        src = tl.load(src_ptr + row * srb + node * srt + j * srk)
        in_tree = src >= K
        from_tree = tl.load(xbc_ptr + row * sxb + tl.maximum(src - K, 0) * sxt + c * sxc, mask=cm & in_tree,
                            other=0.0)
        from_state = tl.load(state_ptr + row * ssb + c * ssc + tl.minimum(src, K - 1) * ssk, mask=cm & (src < K),
                             other=0.0)
        val = tl.where(in_tree, from_tree.to(tl.float32), from_state.to(tl.float32))
        acc += val * tl.load(w_ptr + c * swc + j * swk, mask=cm, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=cm, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * sob + node * sot + c * soc, acc, mask=cm)


def tree_conv1d_triton(xbc, conv_state, parents, weight, bias, sources=None):
    b, t, c = xbc.shape
    k = conv_state.shape[-1]
    out = torch.empty(b, t, c, dtype=torch.float32, device=xbc.device)
    if b == 0 or t == 0:
        return out
    src = (conv_sources(parents, k) if sources is None else sources).contiguous()
    bc = min(128, triton.next_power_of_2(c))
    tree_conv_kernel[(b, t, triton.cdiv(c, bc))](
        xbc, conv_state, src, weight, bias if bias is not None else weight, out, t, c,
        *xbc.stride(), *conv_state.stride(), *src.stride(), *weight.stride(), *out.stride(),
        K=k, HAS_BIAS=bias is not None, BC=bc)
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
    if backend_for(xbc, backend) == "triton":
        return tree_conv1d_triton(xbc, conv_state, parents, weight, bias, sources)
    return tree_conv1d(xbc, conv_state, parents, weight, bias, sources)
