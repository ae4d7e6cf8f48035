"""Data parallelism for the evaluations: under `accelerate launch` (or `torchrun`) with N processes, each takes
every N-th input of every round and rank 0 gathers what they measured; alone, one process takes everything.

    accelerate launch --num_processes 2 -m multispec eval reasoning --limit 20   # a multi-GPU node
    accelerate launch --multi_gpu --num_processes 2 -m multispec eval reasoning  # CPU processes (gloo)

Inputs are split by position (rank r takes r, r + N, ...), so the union is the single-process run's inputs and
every per-input result (an answer, a token count) is what one process would have computed; times are pooled
(summed seconds and units per round), so a speedup is a ratio of throughputs over all processes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Shards:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def take(self, items: Sequence[Any]) -> list[Any]:
        """This process's inputs: every `world`-th from position `rank`."""
        return list(items[self.rank::self.world])

    def gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, in rank order (on every process; one process: [obj])."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, obj)
        return gathered


def current() -> Shards:
    """The launch this process is part of: a process group is started (gloo on CPUs, nccl on GPUs, through
    `accelerate`) when the launcher set WORLD_SIZE > 1; each process then runs on its own GPU where there are
    GPUs."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Shards()
    try:
        from accelerate import PartialState
    except ImportError as err:
        raise ImportError("a data-parallel run needs accelerate: pip install 'multispec[distributed]'") from err

    state = PartialState(cpu=not torch.cuda.is_available())
    return Shards(state.process_index, state.num_processes, state.device)


def finish() -> None:
    """At the end of a command: wait for every process (rank 0 may still be scoring or writing what the others
    gathered to it) and close the process group; nothing when there is none."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
