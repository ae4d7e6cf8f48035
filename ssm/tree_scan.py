"""Mamba-2 (SSD) over a token tree in one pass, and the state after any node in closed form.

Per head, Mamba-2 is the linear recurrence h_t = exp(a_t) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t
with a scalar decay a_t = dt_t * A. Along one root-to-node path this is an ordinary recurrence, so with
the ancestor-or-self mask L and the path-summed decay Acum_t = sum_s L[t, s] a_s, every node t gets

    y_t = exp(Acum_t) C_t . h0 + sum_s L[t, s] exp(Acum_t - Acum_s) dt_s (C_t . B_s) x_s + D x_t
    h_t = exp(Acum_t) h0 + sum_s L[t, s] exp(Acum_t - Acum_s) dt_s x_s B_s^T

(the SSD "semiseparable" form with the causal mask replaced by the tree mask). Shapes, per batch row b:
x [B, T, H, P], dt [B, T, H] (already softplus-ed and clamped), A [H] (negative), B/C [B, T, G, N] with
H divisible by G, initial state h0 [B, H, P, N], ancestors [B, T, T] bool (ancestor-or-self).

`tree_ssd` needs no particular node order; `tree_state` and the conv helpers assume the usual
topological order (every parent index below its child's), which `multispec.DraftTree` guarantees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def path_decay(dt: torch.Tensor, A: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """Acum [B, T, H]: the sum of dt_s * A over node t's ancestors-or-self s."""
    return torch.bmm(ancestors.float(), dt.float() * A.float())


def _by_group(t: torch.Tensor) -> torch.Tensor:
    """[B, T, G, N] -> [B, G, 1, T, N]: broadcasts against per-head tensors viewed as [B, G, H/G, ...]."""
    return t.float().permute(0, 2, 1, 3)[:, :, None]


# Written as a few batched matmuls over [B, G, H/G, ...] views rather than einsums with repeated groups:
# on a CPU, trees of a dozen nodes make this op-count bound, and the target runs it once per layer per step.


def tree_ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor | None, ancestors: torch.Tensor, initial_state: torch.Tensor) -> torch.Tensor:
    """Outputs y [B, T, H, P] (float32) of every tree node, each as if its path were run alone."""
    b, t, heads, p = x.shape
    g = B.shape[2]
    if heads % g:
        raise ValueError(f"B: {g} groups do not divide {heads} heads")
    r = heads // g
    dt = dt.float()
    acum = path_decay(dt, A, ancestors).transpose(1, 2).reshape(b, g, r, t)  # [B, G, R, T]
    # exp(Acum_t - Acum_s) only where s is on t's path (elsewhere the exponent could overflow): -inf -> 0
    diff = acum[..., :, None] - acum[..., None, :]  # [B, G, R, T(t), T(s)]
    decay = diff.masked_fill(~ancestors[:, None, None], float("-inf")).exp()
    Cg, Bg = _by_group(C), _by_group(B)  # [B, G, 1, T, N]
    cb = Cg @ Bg.transpose(-1, -2)  # [B, G, 1, T, S]
    weights = cb * decay * dt.transpose(1, 2).reshape(b, g, r, 1, t)
    xg = x.float().permute(0, 2, 1, 3).reshape(b, g, r, t, p)  # [B, G, R, S, P]
    h0 = initial_state.float().reshape(b, g, r, p, -1)
    y = weights @ xg + acum.exp()[..., None] * (Cg @ h0.transpose(-1, -2))  # [B, G, R, T, P]
    y = y.reshape(b, heads, t, p).transpose(1, 2)
    if D is not None:
        y = y + D.float()[None, None, :, None] * x.float()
    return y


def tree_state(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, path: torch.Tensor,
               initial_state: torch.Tensor) -> torch.Tensor:
    """The state [B, H, P, N] after the last node of `path` ([B, T] bool: the nodes of a root-to-node
    path, e.g. a row of the ancestor mask); an empty path returns `initial_state`. One weighted
    (P x T)(T x N) product per head: cheaper than replaying T recurrent steps."""
    b, t, heads, p = x.shape
    g = B.shape[2]
    a = dt.float() * A.float() * path[..., None]  # [B, T, H]; off-path nodes add 0
    total = a.sum(dim=1)  # Acum of the last path node
    before = torch.cumsum(a, dim=1)  # Acum_s for path nodes s
    w = (torch.exp(total[:, None, :] - before) * dt.float()).masked_fill(~path[..., None], 0.0)
    wx = (w[..., None] * x.float()).permute(0, 2, 3, 1).reshape(b, g, heads // g, p, t)  # [B, G, R, P, T]
    state = (wx @ _by_group(B)).reshape(b, heads, p, -1)
    return state + torch.exp(total)[:, :, None, None] * initial_state.float()


def chunked_ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                D: torch.Tensor | None, chunk: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain sequence (a chain) from a zero state, for prefill: outputs y [B, L, H, P] and the final
    state [B, H, P, N]. Chunks of `chunk` tokens become batch rows: their states from zero (`tree_state`),
    a short sequential pass carrying the state across chunks, then every chunk's outputs with its start
    state (`tree_ssd` with a causal mask). Padding the tail with dt = 0, x = 0 leaves the state as is."""
    b, length, heads, p = x.shape
    g, n = B.shape[2], B.shape[3]
    chunks = max(1, -(-length // chunk))
    pad = chunks * chunk - length
    if pad:
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    rows = b * chunks
    xc, dtc = x.reshape(rows, chunk, heads, p), dt.reshape(rows, chunk, heads)
    Bc, Cc = B.reshape(rows, chunk, g, n), C.reshape(rows, chunk, g, n)
    zero = torch.zeros(rows, heads, p, n, device=x.device)
    full = torch.ones(rows, chunk, dtype=torch.bool, device=x.device)
    own = tree_state(xc, dtc, A, Bc, full, zero).view(b, chunks, heads, p, n)  # each chunk from zero
    decay = torch.exp((dtc.float() * A.float()).sum(dim=1)).view(b, chunks, heads, 1, 1)
    starts = [torch.zeros(b, heads, p, n, device=x.device)]
    for c in range(chunks):
        starts.append(decay[:, c] * starts[-1] + own[:, c])
    h0 = torch.stack(starts[:-1], dim=1).reshape(rows, heads, p, n)
    causal = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=x.device)).expand(rows, chunk, chunk)
    y = tree_ssd(xc, dtc, A, Bc, Cc, D, causal, h0).reshape(b, chunks * chunk, heads, p)
    return y[:, :length], starts[-1]


def ancestor_at(parents: torch.Tensor, steps: int) -> torch.Tensor:
    """[steps, B, T]: entry k is node t's k-th ancestor (k = 0: t itself), -1 past the root."""
    b, t = parents.shape
    cur = torch.arange(t, device=parents.device).expand(b, t)
    out = [cur]
    for _ in range(steps - 1):
        cur = torch.where(cur >= 0, parents.gather(1, cur.clamp(min=0)), -1)
        out.append(cur)
    return torch.stack(out)


def conv_sources(parents: torch.Tensor, width: int, depth: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, K]: where each node's conv window reads from, oldest first, as an index into the conv state's
    K columns followed by the T tree nodes (column c -> c, node t -> K + t). The window is the last K
    entries of [conv state ; the node's root path], so slots older than the root come from state columns
    K + depth - j (j-th ancestor). `depth` [B, T] (0 at the root; e.g. the ancestor mask's row sums - 1)
    saves walking the whole tree. The same for every layer: compute it once per tree."""
    b, t = parents.shape
    up = ancestor_at(parents, width)  # [K, B, T]
    if depth is None:
        depth = (ancestor_at(parents, t + 1) >= 0).sum(0) - 1 if t else parents.new_zeros(b, 0)
    cols = []
    for j in range(width - 1, -1, -1):
        col = (width + depth - j).clamp(min=0, max=width - 1)
        cols.append(torch.where(up[j] >= 0, up[j] + width, col))
    return torch.stack(cols, dim=-1)


def gather_windows(xbc: torch.Tensor, conv_state: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """Windows [B, S, C, K] (oldest first) read from `sources` [B, S, K] (see `conv_sources`)."""
    return _window_rows(xbc, conv_state, sources).transpose(2, 3)


def _window_rows(xbc: torch.Tensor, conv_state: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """Windows as [B, S, K, C]: one row gather (`index_select`) from each row's state columns followed by
    its tree nodes, flattened over the batch."""
    b, s, k = sources.shape
    c = xbc.shape[2]
    both = torch.cat([conv_state.transpose(1, 2).to(xbc.dtype), xbc], dim=1)  # [B, K + T, C]
    if b > 1:
        sources = sources + (torch.arange(b, device=sources.device) * both.shape[1])[:, None, None]
    return both.reshape(-1, c).index_select(0, sources.reshape(-1)).view(b, s, k, c)


def tree_conv_windows(xbc: torch.Tensor, conv_state: torch.Tensor, parents: torch.Tensor,
                      sources: torch.Tensor | None = None) -> torch.Tensor:
    """The causal-conv input window [B, T, C, K] of every node (oldest first). `conv_state` [B, C, K] holds
    the last K committed pre-conv inputs, newest last; `parents` [B, T] are tree indices, -1 = root;
    `sources`, if given, is `conv_sources(parents, K)`."""
    if sources is None:
        sources = conv_sources(parents, conv_state.shape[-1])
    return gather_windows(xbc, conv_state, sources)


def tree_conv1d(xbc: torch.Tensor, conv_state: torch.Tensor, parents: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, sources: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise causal conv of every node along its path, before the activation: [B, T, C]."""
    if sources is None:
        sources = conv_sources(parents, conv_state.shape[-1])
    rows = _window_rows(xbc, conv_state, sources)  # [B, T, K, C]
    out = (rows * weight.t().to(rows.dtype)).sum(2)
    return out if bias is None else out + bias.to(out.dtype)


def conv_from_windows(windows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Depthwise conv [B, T, C] of windows [B, T, C, K] with weight [C, K] (and bias [C])."""
    out = (windows * weight.to(windows.dtype)[None, None]).sum(-1)
    return out if bias is None else out + bias.to(out.dtype)
