"""How the C heap treats large freed blocks, set once for a process that generates on the CPU.

Why: glibc hands large freed blocks back to the kernel (a block over its mmap threshold is unmapped when freed;
the heap's top is trimmed once more than its trim threshold lies free there), so the next tensor of that size
faults in fresh zeroed pages, 4 KiB at a time. Which allocations meet that fate depends on the order of the
allocations before them, not on the arithmetic: a batched prefill of our engine faulted its MLP intermediates in
again and again where `transformers`' `generate`, in the same process, did not (measured in
docs/benchmarks/chat.md, "Where our no-draft step's gap to plain batched `generate` came from"). A timed
comparison should compare computation, not heap luck, so every benchmark's `Recorder` and the CLI keep freed
memory for the whole process, and `machine_info` records it.

The cost: the process keeps the memory of its largest batch (its resident size does not shrink afterwards).
`MULTISPEC_KEEP_FREED_MEMORY=0` in the environment turns it off; library users opt in with `keep_freed_memory()`.
Elsewhere than glibc (macOS, musl) it does nothing and says so.
"""

from __future__ import annotations

import ctypes
import os

ENV = "MULTISPEC_KEEP_FREED_MEMORY"
# mallopt parameters (malloc.h); setting either also turns off glibc's dynamic mmap threshold
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
# blocks up to 1 GiB come from the heap, and up to 1 GiB may lie free at its top before it is trimmed
KEEP_BYTES = 1 << 30
# the heap grows by 16 MiB more than asked: without it, a 64-byte aligned block of the size just freed (what
# torch's allocator asks for) does not fit the freed top and faults its pages in again (measured, glibc 2.36)
TOP_PAD_BYTES = 16 << 20

_state: str | None = None  # what the first call did: "kept", "off (...)" or "unavailable (...)"


def keep_freed_memory() -> bool:
    """Keep large freed blocks in the process's heap (see the module docstring); once per process, later calls
    return the first answer. True when set; False when the environment turned it off or the C library is not
    glibc."""
    global _state
    if _state is None:
        _state = _apply()
    return _state == "kept"


def heap_state() -> str:
    """What `keep_freed_memory` did in this process: "kept", "off (...)", "unavailable (...)", or "default" when it
    was not called (benchmarks store it with their machine)."""
    return _state or "default"


def available() -> bool:
    """Whether the C library lets the heap be set here (glibc)."""
    return _glibc_mallopt() is not None


def _apply() -> str:
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"off ({ENV}={os.environ[ENV]})"
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return "unavailable (not glibc)"
    if not (mallopt(M_MMAP_THRESHOLD, KEEP_BYTES) and mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)
            and mallopt(M_TOP_PAD, TOP_PAD_BYTES)):
        return "unavailable (mallopt refused)"
    return "kept"


def _glibc_mallopt():
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has (its C library's among them): no lookup
        gnu_get_libc_version = libc.gnu_get_libc_version  # glibc only: musl and macOS's libc lack it
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    gnu_get_libc_version.restype = ctypes.c_char_p
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt
