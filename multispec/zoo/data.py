"""Offline corpora: the CPython standard library's own source, split by file into train, validation and
held-out (test)."""

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


# What the text pairs' recipes read of the train split, as {corpus seed: characters}: the targets and vocabulary
# maps the first 3M characters of `corpus_text(seed=0)`, the EAGLE heads (and their self-generated data) the
# first 600k of `corpus_text(seed=1)`. The train-split files outside both are never trained on.
TRAINED_BUDGETS = {0: 3_000_000, 1: 600_000}


def stdlib_files(split: str = "train") -> list[Path]:
    """Sorted stdlib .py files of a split: 'train', 'heldout' (see HELD_OUT: the test split, for reported
    figures) or 'validation' (train-split files no text pair's recipe reads, see TRAINED_BUDGETS: where
    settings are chosen)."""
    if split not in ("train", "heldout", "validation"):
        raise ValueError(f"split: expected 'train', 'validation' or 'heldout', got {split!r}")
    if split == "validation":
        read = set()
        for seed, chars in TRAINED_BUDGETS.items():
            read |= set(_read_files(seed, chars))
        return sorted(set(stdlib_files("train")) - read)
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


def shuffled(files: list[Path], seed: int) -> list[Path]:
    root = stdlib_root()
    return sorted(files, key=lambda p: hashlib.sha1(f"{seed}:{p.relative_to(root)}".encode()).hexdigest())


def _read_files(seed: int, max_chars: int) -> list[Path]:
    """The train-split files `corpus_text("train", max_chars, seed)` reads (the last one possibly in part)."""
    out, total = [], 0
    for p in shuffled(stdlib_files("train"), seed):
        out.append(p)
        total += len(read_source(p))
        if total >= max_chars:
            break
    return out


def corpus_text(split: str = "train", max_chars: int | None = None, seed: int = 0) -> str:
    """The split's files concatenated in a fixed pseudo-random order (by hashed path), up to max_chars."""
    parts, total = [], 0
    for p in shuffled(stdlib_files(split), seed):
        text = read_source(p)
        parts.append(text)
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    out = "\n\n".join(parts)
    return out if max_chars is None else out[:max_chars]
