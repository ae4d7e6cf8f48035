"""The options every benchmark shares, as one object: each bench's `run(pair, options, <its own few>)`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from ..tree import DynamicTree

# the command line's spelling where it differs from the field's
_ARG_NAMES = {"json_path": "json"}


@dataclass(frozen=True)
class BenchOptions:
    """What `add_speed_options` (and the benches' shared --weights, --split, --seed) declare. None: the bench's
    own default (each bench's docstring names it).

    `quick`: the smaller run; `json_path`: also write the results there; `threads`: torch CPU threads;
    `rounds`: timed rounds over the inputs; `max_new_tokens`: per prompt; `temperature`: of the sampling rows;
    `chain_k`: the chain rows' draft length (an int, "auto" where a bench calibrates it, or a sequence of
    lengths where a bench sweeps them); `tree`: the dynamic tree rows' shape; `weights`: a retrained folder of the
    pair instead of the shipped one; `split`: the inputs' split ('test'/'heldout' or 'validation'); `seed`: of
    the sampling generators."""

    quick: bool = False
    json_path: str | None = None
    threads: int | None = None
    rounds: int | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    chain_k: int | str | Sequence[int] | None = None
    tree: DynamicTree | None = None
    weights: str | None = None
    split: str | None = None
    seed: int = 0

    def __post_init__(self):
        for name in ("threads", "rounds", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {value!r}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature: expected > 0 or None, got {self.temperature!r}")
        if self.tree is not None and not isinstance(self.tree, DynamicTree):
            raise TypeError(f"tree: expected a DynamicTree or None, got {type(self.tree).__name__}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOptions:
        """The options a command declared (a bench without --weights leaves `weights` None, and so on)."""
        given = vars(args)
        return cls(**{f.name: given[_ARG_NAMES.get(f.name, f.name)] for f in fields(cls)
                      if _ARG_NAMES.get(f.name, f.name) in given})

    def rounds_or(self, default: int, quick_default: int | None = None) -> int:
        """`rounds`, else `quick_default` for a quick run (when given), else `default`."""
        if self.rounds is not None:
            return self.rounds
        return quick_default if self.quick and quick_default is not None else default

    def apply_threads(self) -> None:
        """Set torch's CPU threads where `threads` is given (before anything is timed)."""
        if self.threads:
            torch.set_num_threads(self.threads)
