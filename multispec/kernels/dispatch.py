"""Choose between a Triton kernel and its PyTorch reference.

Triton runs on CUDA tensors; everything else uses the reference. `MULTISPEC_KERNELS=torch|triton|auto`
(or a `backend=` argument) forces a choice; Triton on CPU tensors needs `TRITON_INTERPRET=1`, which is
how the test suite runs the kernels without a GPU.
"""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "triton", "torch")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - triton is a Linux dependency
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def backend_for(tensor: torch.Tensor, backend: str | None = None) -> str:
    """'triton' or 'torch' for an operation on `tensor`."""
    choice = (backend or os.environ.get("MULTISPEC_KERNELS", "auto")).lower()
    if choice not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {choice!r} (argument or MULTISPEC_KERNELS)")
    if choice == "torch":
        return "torch"
    on_gpu = tensor.is_cuda
    if choice == "auto":
        return "triton" if on_gpu and triton_available() else "torch"
    if not triton_available():
        raise RuntimeError("backend: 'triton' requested but triton is not importable")
    if not on_gpu and not interpreting():
        raise RuntimeError(
            "backend: 'triton' on CPU tensors needs TRITON_INTERPRET=1 set before multispec is imported")
    return "triton"
