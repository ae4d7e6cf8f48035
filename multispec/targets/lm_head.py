"""A faster LM head for verification on CPUs: the same product, laid out as (V x H)(H x M).

Verifying a draft tree asks the LM head for a handful of rows (M = 2..16) of a large vocabulary. MKL on
CPU picks a poor kernel for `F.linear(x, W)` with such a short, wide output: measured on Gemma 3's
262k x 640 head (2 cores), M = 1: 45 ms, M = 2: 89 ms, M = 3: 131 ms, M = 8: 81 ms. Written as
`W @ x.T` the same product runs as a tall GEMM: 20, 21, 24 and 42 ms (M = 1 padded to 2 rows, since
the matrix-vector path is as slow as `F.linear`). Results differ from `F.linear` only in summation
order (~1e-6 absolute on logits). Used while a target adapter runs its model, on CPU, for heads of at
least `MIN_VOCAB` rows; `MULTISPEC_FAST_HEAD=0` turns it off.
"""

from __future__ import annotations

import contextlib
import os

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


def fast_head_applies(model: torch.nn.Module) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (os.environ.get("MULTISPEC_FAST_HEAD", "1") != "0" and type(head) is torch.nn.Linear
            and head.weight.device.type == "cpu" and head.weight.shape[0] >= MIN_VOCAB)


@contextlib.contextmanager
def tall_lm_head(model: torch.nn.Module):
    """Within the block, `model`'s LM head computes W @ x.T (the model itself is restored afterwards)."""
    if not fast_head_applies(model):
        yield
        return
    head = model.get_output_embeddings()
    head.forward = lambda x: tall_linear(x, head.weight, head.bias)  # shadows Linear.forward
    try:
        yield
    finally:
        del head.forward
