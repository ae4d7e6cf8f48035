"""The speculative rows of a speed table as data: each row is defined once (its name, drafter, draft shape and
whether the sampling table has it too), and `method_table` turns rows into the methods a `Recorder` times."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .recorder import Fresh, with_role

# run(ids, drafter, tree, options) -> the output of one speculative generation
RunRow = Callable[[Any, Any, Any, Mapping[str, Any]], Any]


def is_factory(drafter: Any) -> bool:
    """A drafter class or a function that makes one (not a drafter, nor a model: a model is callable too)."""
    return isinstance(drafter, (type, types.FunctionType, functools.partial))


@dataclass(frozen=True)
class Row:
    """One speculative row.

    `drafter`: a drafter (or a draft model) used as is, or a factory (`is_factory`) called for every input,
    or, with `fresh`, once per timed round: a training-free drafter keeps what it learns across the inputs of a
    round (Token Recycling's hot start, SuffixDecoding's earlier outputs), as across a user's requests, and
    starts over at the next round (in a repeated round it would draft its own earlier output back). `tree`:
    the draft shape. `sampled`: the sampling table has the row too. `options`: the row's own keywords for
    `speculative_generate` (an `engine=`, ...)."""

    name: str
    drafter: Any
    tree: Any
    fresh: bool = False
    sampled: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    role: str = "speculative"  # `recorder.with_role`: "control" for our engine without drafts

    def method(self, run: RunRow) -> Any:
        """The row as a `Recorder` method (a callable of the inputs, or a `Fresh`), tagged with its role."""
        return with_role(self.role, self._method(run))

    def _method(self, run: RunRow) -> Any:
        if self.fresh:
            if not is_factory(self.drafter):
                raise TypeError(f"{self.name}: a fresh row needs a drafter factory, got {type(self.drafter).__name__}")
            return Fresh(lambda: _bound(run, self.drafter(), self))
        if is_factory(self.drafter):
            return lambda ids: run(ids, self.drafter(), self.tree, self.options)
        return _bound(run, self.drafter, self)


def _bound(run: RunRow, drafter: Any, row: Row) -> Callable[[Any], Any]:
    return lambda ids: run(ids, drafter, row.tree, row.options)


def method_table(rows: Sequence[Row], run: RunRow, sampled: bool = False) -> dict[str, Any]:
    """The methods of `rows` by name (only the rows marked `sampled` when `sampled`); a name given twice raises."""
    out: dict[str, Any] = {}
    for row in rows:
        if row.name in out:
            raise ValueError(f"rows: {row.name!r} is defined twice")
        if row.sampled or not sampled:
            out[row.name] = row.method(run)
    return out


def leading(methods: dict, names: Sequence[str]) -> dict:
    """`methods` with `names` (those it has) first, in that order: the baseline and the controls lead a table."""
    return {name: methods[name] for name in [*(n for n in names if n in methods), *methods] if name in methods}


def keep_rows(methods: dict, only: Sequence[str] | None, always: Sequence[str], table: str) -> dict:
    """`methods` restricted to `only` (and `always`, the baseline and peers; None: every row); unknown names fail
    in the greedy table (which holds every row name) with the rows there are."""
    if only is None:
        return methods
    if table == "greedy":
        unknown = [n for n in only if n not in methods]
        if unknown:
            raise ValueError(f"--methods: no row {', '.join(unknown)}; rows: {', '.join(methods)}")
    return {name: fn for name, fn in methods.items() if name in only or name in always}


__all__ = ["Row", "is_factory", "keep_rows", "leading", "method_table"]
