"""Argument types every `multispec` command shares (argparse `type=` functions): a bad value exits 2 with
argparse's "argument --option: ..." message, before anything loads."""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tree import DynamicTree


def chain_length(text: str) -> int | str:
    """An argparse type: a positive integer, or "auto" (chosen for this machine, `multispec.draft_length`)."""
    return "auto" if text == "auto" else positive_int(text)


def positive_int(text: str) -> int:
    """An argparse type: a positive integer (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_tree(text: str | None) -> DynamicTree | None:
    """`DEPTH/TOPK/TOTAL` (e.g. 4/4/15) as a `DynamicTree`; None stays None (the benchmark's default). An
    argparse type: a bad value exits 2 with argparse's "argument --tree: ..." message."""
    if text is None:
        return None
    try:
        depth, topk, total = (int(x) for x in text.split("/"))
        # `multispec.tree` loads torch: imported here, when a tree is parsed, so that `--help` loads none
        return importlib.import_module("multispec.tree").DynamicTree(depth=depth, topk=topk, total=total)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected DEPTH/TOPK/TOTAL, e.g. 4/4/15; got {text!r} ({err})") from None


def name_list(text: str) -> tuple[str, ...]:
    """argparse type of a comma-separated list of names (at least one, no repeats)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated names, got {text!r}")
    return names


def chain_list(text: str) -> tuple[int | str, ...]:
    """argparse type of `int_list` whose items may also be "auto" (a chain sized each step)."""
    items = [n.strip() for n in text.split(",") if n.strip()]
    try:
        values = tuple("auto" if n == "auto" else positive_int(n) for n in items)
    except argparse.ArgumentTypeError:
        values = ()
    if not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated positive integers or auto, got {text!r}")
    return values


def int_list(text: str) -> tuple[int, ...]:
    """argparse type of a comma-separated list of positive integers (at least one, no repeats)."""
    values = tuple(positive_int(n.strip()) for n in text.split(",") if n.strip())
    if not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated positive integers, got {text!r}")
    return values
