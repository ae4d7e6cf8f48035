"""Offline corpora: the CPython standard library's own source, split by file into train and held-out."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

# held-out files for benchmarks (never trained on): ordinary, readable modules present in every CPython
HELD_OUT = ("json/encoder.py", "textwrap.py", "shlex.py", "heapq.py", "bisect.py", "fractions.py",
            "statistics.py", "dataclasses.py", "string.py", "colorsys.py")
SKIP_DIRS = ("test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "tkinter",
             "ensurepip", "__pycache__")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(split: str = "train") -> list[Path]:
    """Sorted stdlib .py files of a split: 'train' or 'heldout' (see HELD_OUT)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split: expected 'train' or 'heldout', got {split!r}")
    root = stdlib_root()
    held = {root / h for h in HELD_OUT}
    if split == "heldout":
        return sorted(p for p in held if p.exists())
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in SKIP_DIRS for part in rel[:-1]) or p in held:
            continue
        files.append(p)
    return files


def read_source(path: Path, max_bytes: int | None = None) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    return text if max_bytes is None else text[:max_bytes]


def corpus_text(split: str = "train", max_chars: int | None = None, seed: int = 0) -> str:
    """The split's files concatenated in a fixed pseudo-random order (by hashed path), up to max_chars."""
    files = stdlib_files(split)
    root = stdlib_root()
    files.sort(key=lambda p: hashlib.sha1(f"{seed}:{p.relative_to(root)}".encode()).hexdigest())
    parts, total = [], 0
    for p in files:
        text = read_source(p)
        parts.append(text)
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    out = "\n\n".join(parts)
    return out if max_chars is None else out[:max_chars]
