"""A faster LM head for verification on CPUs: the same product, laid out as (V x H)(H x M) where that
measures faster.

Verifying a draft tree asks the LM head for a handful of rows (M = 2..16) of a large vocabulary. On some
CPUs the BLAS picks a poor kernel for `F.linear(x, W)` with such a short, wide output: measured on
Gemma 3's 262k x 640 head (2 cores of one machine), M = 1: 45 ms, M = 2: 89 ms, M = 3: 131 ms, M = 8:
81 ms, while `W @ x.T` (a tall GEMM) took 20, 21, 24 and 42 ms. On another machine (2 cores of an
AVX-512/AMX Xeon) the opposite held: the tall layout made plain decoding 1.8x slower. So the layout is
chosen by measurement: the first time a head meets a row count M, both layouts are timed (best of 3)
and the faster is kept for that (shape, dtype, M, threads). Results differ from `F.linear` only in
summation order (~1e-6 absolute on logits). Used while a target adapter runs its model, on CPU, for
heads of at least `MIN_VOCAB` rows. `MULTISPEC_FAST_HEAD`: `auto` (default, measured), `1` (always
tall), `0` (never).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.nn.functional as F

MIN_VOCAB = 16384  # smaller heads are cheap either way
MAX_ROWS = 16  # beyond this the tall layout stops winning (measured equal at 24 rows)


def tall_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed as weight @ x.T when x has at most MAX_ROWS rows."""
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    if m > MAX_ROWS or m == 0:
        return F.linear(x, weight, bias)
    if m == 1:  # the matrix-vector kernel is as slow as F.linear: use two rows
        rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
    out = (weight @ rows.T).T[:m]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


# (weight shape, dtype, rows, threads) -> whether the tall layout measured faster
_TALL_WINS: dict[tuple, bool] = {}


def _best_ms(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def measure_layouts(weight: torch.Tensor, m: int) -> tuple[float, float]:
    """Milliseconds (best of 3, after a warm-up) of `F.linear` and of `tall_linear` for m rows."""
    probe = torch.randn(m, weight.shape[1], dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        F.linear(probe, weight), tall_linear(probe, weight)
        return _best_ms(lambda: F.linear(probe, weight)), _best_ms(lambda: tall_linear(probe, weight))


def tall_wins(weight: torch.Tensor, m: int) -> bool:
    """Whether the tall layout is the faster for m rows of this head (measured once, then cached);
    it must win by 10% to replace the stock kernel."""
    if m == 0 or m > MAX_ROWS:
        return False
    key = (tuple(weight.shape), weight.dtype, m, torch.get_num_threads())
    if key not in _TALL_WINS:
        linear_ms, tall_ms = measure_layouts(weight, m)
        _TALL_WINS[key] = tall_ms < 0.9 * linear_ms
    return _TALL_WINS[key]


def head_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The LM head as `tall_lm_head` runs it: `MULTISPEC_FAST_HEAD` decides the layout (default: measured)."""
    mode = os.environ.get("MULTISPEC_FAST_HEAD", "auto")
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if mode == "1" or (mode != "0" and tall_wins(weight, m)):
        return tall_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def fast_head_applies(model: torch.nn.Module) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (os.environ.get("MULTISPEC_FAST_HEAD", "auto") != "0" and type(head) is torch.nn.Linear
            and head.weight.device.type == "cpu" and head.weight.shape[0] >= MIN_VOCAB)


@contextlib.contextmanager
def tall_lm_head(model: torch.nn.Module):
    """Within the block, `model`'s LM head runs `head_forward` (the model itself is restored afterwards)."""
    if not fast_head_applies(model):
        yield
        return
    head = model.get_output_embeddings()
    head.forward = lambda x: head_forward(x, head.weight, head.bias)  # shadows Linear.forward
    try:
        yield
    finally:
        del head.forward
