"""Reads of device values on the host, and the checks that need one.

On CUDA every read of a device value on the host (`int(t)`, `bool(t)`, `t.tolist()`) waits until every
kernel queued before it has finished, so the GPU idles while Python catches up. The speculative loop
therefore reads the device once per step: the session gathers what the host needs (the verdict's tokens,
the counts, the stats) into one tensor and reads it once (`Session.generate`).

Checks that would read a device value (non-finite logits, a malformed draft tree) go through `require`.
Outside a step they raise at once, as before. Inside `deferred_checks()` on a device of
`DEFERRED_DEVICE_TYPES` (CUDA) the flag is kept on the device and travels with the step's one read; the
error is raised right after it, before anything of that step is committed or returned. On the CPU a read
costs nothing, so checks there run at once (tests that count reads add "cpu" to the set, to see the loop
as CUDA runs it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

DEFERRED_DEVICE_TYPES = {"cuda"}

_pending: ContextVar["DeferredChecks | None"] = ContextVar("multispec_deferred_checks", default=None)


class DeferredChecks:
    """The flags of the checks deferred during one step, and how to raise the first that failed."""

    def __init__(self) -> None:
        self.items: list[tuple[torch.Tensor, Callable[[], Exception]]] = []

    def __len__(self) -> int:
        return len(self.items)

    def flags(self, device: torch.device) -> torch.Tensor:
        """One int64 per deferred check (1 = passed), on `device`, to join the step's read."""
        if not self.items:
            return torch.zeros(0, dtype=torch.long, device=device)
        return torch.stack([ok.reshape(()).to(device=device, dtype=torch.long) for ok, _ in self.items])

    def raise_failed(self, host_flags: list[int]) -> None:
        """Raise the error of the first check whose flag (read with the step) is 0."""
        if len(host_flags) != len(self.items):
            raise RuntimeError(f"deferred checks: {len(host_flags)} flags read for {len(self.items)} checks")
        for (_, error), flag in zip(self.items, host_flags):
            if not flag:
                raise error()


@contextmanager
def deferred_checks() -> Iterator[DeferredChecks]:
    """Collect the device-side checks of one step (see the module docstring)."""
    checks = DeferredChecks()
    token = _pending.set(checks)
    try:
        yield checks
    finally:
        _pending.reset(token)


def require(ok: torch.Tensor, error: Callable[[], Exception]) -> None:
    """Raise `error()` unless `ok` (a one-element bool tensor) holds: at once, or, inside
    `deferred_checks()` on a deferred device type, after the step's one read."""
    checks = _pending.get()
    if checks is not None and ok.device.type in DEFERRED_DEVICE_TYPES:
        checks.items.append((ok, error))
        return
    if not bool(ok):
        raise error()
