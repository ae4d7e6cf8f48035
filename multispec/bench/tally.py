"""Per-method tallies shared by the benchmarks: wall time, tokens, acceptance, the time split of our
speculative rows (prefill, draft, verify, commit, other), and how each output compares with plain decoding."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class Tally:
    """Accumulates one method's runs over the prompts."""

    def __init__(self) -> None:
        self.secs = 0.0
        self.tokens = 0
        self.committed = 0
        self.row_forwards = 0
        self.steps = 0
        self.split = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "commit_s": 0.0}
        self.verdicts: list[str] = []

    def run(self, fn: Callable, ids: torch.Tensor) -> torch.Tensor:
        """Time `fn(ids)` (a `generate`-like call or `speculative_generate`), record it, return sequences."""
        start = time.perf_counter()
        out = fn(ids)
        self.secs += time.perf_counter() - start
        seq = out.sequences if hasattr(out, "stats") else out
        self.tokens += seq.shape[1] - ids.shape[1]
        stats = getattr(out, "stats", None)
        if stats is not None:
            self.committed += stats.committed
            self.row_forwards += sum(st.rows for st in stats.steps)
            self.steps += stats.target_forwards
            for key in self.split:
                self.split[key] += getattr(stats, key)
        return seq

    def row(self) -> dict:
        out = {"tokens_per_s": round(self.tokens / self.secs, 3), "seconds": round(self.secs, 3),
               "tokens": self.tokens,
               "mean_accepted_length": round(self.committed / self.row_forwards, 3) if self.row_forwards else None}
        if self.steps:  # per verification step, in ms; "other" is the loop's own time outside the four
            per_step = {k[:-2] + "_ms": round(v / self.steps * 1e3, 3) for k, v in self.split.items()
                        if k != "prefill_s"}
            per_step["other_ms"] = round((self.secs - sum(self.split.values())) / self.steps * 1e3, 3)
            out["per_step"] = per_step
            out["prefill_s"] = round(self.split["prefill_s"], 3)
        if self.verdicts:
            out["outputs"] = {v: self.verdicts.count(v) for v in sorted(set(self.verdicts))}
        return out


def table(tallies: dict[str, Tally], baselines: dict[str, str]) -> dict:
    """Rows of every method with speedups against each baseline row: {"speedup_vs_ar": "plain", ...}."""
    rows = {name: t.row() for name, t in tallies.items()}
    for key, base in baselines.items():
        if base in rows:
            ref = rows[base]["tokens_per_s"]
            for r in rows.values():
                r[key] = round(r["tokens_per_s"] / ref, 3)
    return rows
