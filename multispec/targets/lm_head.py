"""An optional LM-head layout for verification on CPUs: the same product laid out as (V x H)(H x M).

Verifying a draft tree asks the LM head for a handful of rows (M = 2..16) of a large vocabulary. On some
CPUs the BLAS picks a poor kernel for `F.linear(x, W)` with such a short, wide output, and `W @ x.T` (a
tall GEMM) is faster; on others the opposite holds (see BENCHMARKS.md, "Verification cost and the
LM-head layout"). The two differ only in summation order (~1e-6 on logits), which is enough to flip a
near-tie between two tokens.

So the default is the model's own `F.linear`: output is bit-compatible with the model's forward and the
same in every process. `MULTISPEC_FAST_HEAD` opts in: `1` always uses the tall layout; `auto` times both
layouts the first time a head meets a row count M (best of 3) and keeps the faster for that (shape,
dtype, M, threads), which can differ from one process to the next; `0` (or unset) never. Applies while a
target adapter runs its model, on CPU, to heads of at least `MIN_VOCAB` rows.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.nn.functional as F

MIN_VOCAB = 16384  # smaller heads are cheap either way
MAX_ROWS = 16  # beyond this the tall layout stops winning (BENCHMARKS.md, "Verification cost and the LM-head layout")


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


def _mode() -> str:
    mode = os.environ.get("MULTISPEC_FAST_HEAD", "0").strip().lower() or "0"
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"MULTISPEC_FAST_HEAD: expected 0, 1 or auto, got {mode!r}")
    return mode


def head_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The LM head as `tall_lm_head` runs it: `MULTISPEC_FAST_HEAD` decides the layout."""
    mode = _mode()
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if mode == "1" or (mode != "0" and tall_wins(weight, m)):
        return tall_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def fast_head_applies(model: torch.nn.Module) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (_mode() != "0" and type(head) is torch.nn.Linear
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
