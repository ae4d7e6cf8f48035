"""The speculative step's one host read, and a step clock that does not wait for the device.

A step ends with the host needing a few small facts from the device: the tokens each row emits, how many
drafts each row accepted, how many drafts could count for the stats, and the flags of the checks deferred
while the step ran (`multispec.host`). `read_step` joins them into one int64 tensor and reads it once; on
CUDA that is the step's only wait for the GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .host import DeferredChecks
from .rules import Verdict
from .tree import DraftTree


@dataclass
class StepRead:
    """What the host knows of a step after its one read."""

    tokens: list[list[int]]  # per row: the verdict's tokens (-1 padded)
    num_accepted: list[int]  # per row: accepted drafts
    drafted: list[int]  # per row: valid draft nodes
    depth_counts: list[list[int]] | None  # per row: valid nodes at depth 1, 2, ... (trees; None for chains)

    def countable(self, reach: list[int]) -> tuple[int, int]:
        """(drafted, accepted) counting only drafts that could have been emitted: a node deeper than its
        row's reach (the tokens left before `max_new_tokens`, or up to an emitted stop) never could."""
        accepted = sum(min(a, r) for a, r in zip(self.num_accepted, reach))
        if self.depth_counts is None:  # a chain: valid nodes are a prefix, node i at depth i + 1
            return sum(min(d, r) for d, r in zip(self.drafted, reach)), accepted
        drafted = sum(sum(counts[:r]) for counts, r in zip(self.depth_counts, reach))
        return drafted, accepted


def read_step(draft: DraftTree, verdict: Verdict, checks: DeferredChecks, device: torch.device) -> StepRead:
    """Read the step's facts and deferred check flags in one transfer; raise the first failed check."""
    b, width = verdict.tokens.shape
    parts = [verdict.tokens.to(device=device, dtype=torch.long).reshape(-1),
             verdict.num_accepted.to(device=device, dtype=torch.long).reshape(-1),
             draft.valid.to(device).sum(dim=1)]
    n = draft.num_nodes
    tree = not draft.is_chain and n > 0
    if tree:
        depth = draft.depths()[:, 1:].to(device)  # [B, N], 1-based
        hist = torch.zeros(b, n + 1, dtype=torch.long, device=device)
        hist.scatter_add_(1, depth.clamp(max=n), draft.valid.to(device).long())
        parts.append(hist[:, 1:].reshape(-1))
    parts.append(checks.flags(device))
    values = torch.cat(parts).tolist()  # the read
    checks.raise_failed(values[len(values) - len(checks):])
    at = b * width
    tokens = [values[i * width: (i + 1) * width] for i in range(b)]
    num_accepted, drafted = values[at: at + b], values[at + b: at + 2 * b]
    depth_counts = None
    if tree:
        start = at + 2 * b
        depth_counts = [values[start + i * n: start + (i + 1) * n] for i in range(b)]
    return StepRead(tokens, num_accepted, drafted, depth_counts)


class StepClock:
    """Marks the phases of each step (start, drafted, verified, committed). On the CPU it reads
    `perf_counter`; on CUDA it records events, so timing adds no wait for the GPU, and the split is read
    once, when the generation ends (`phases`)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.steps: list[list] = []

    def mark(self, new_step: bool = False) -> None:
        if new_step:
            self.steps.append([])
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self.steps[-1].append(event)
        else:
            self.steps[-1].append(time.perf_counter())

    def step_phases(self, index: int) -> tuple[float, ...]:
        """The seconds between the marks of step `index`, a step whose work the device has finished (an earlier
        step than the one just read: no wait on CUDA)."""
        marks = self.steps[index]
        if self.cuda:
            return tuple(a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:]))
        return tuple(b - a for a, b in zip(marks, marks[1:]))

    def phases(self) -> list[tuple[float, ...]]:
        """Per step, the seconds between its consecutive marks (waits for the last event on CUDA)."""
        if self.cuda and self.steps:
            self.steps[-1][-1].synchronize()
        if self.cuda:
            return [tuple(a.elapsed_time(b) / 1e3 for a, b in zip(m, m[1:])) for m in self.steps]
        return [tuple(b - a for a, b in zip(m, m[1:])) for m in self.steps]
