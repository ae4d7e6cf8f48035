"""The training loop every drafter kind shares: a fixed global batch, gradient accumulation, bf16 autocast on a
GPU, data parallelism under `accelerate launch` / `torchrun`, checkpoints a killed run resumes from, and a
progress bar with the loss, the top-1 accuracy and tokens per second.

Determinism across launches: the items of step s are positions [s B, (s + 1) B) of a stream of seeded
permutations of the training items (one per epoch), so the data order depends on the seed and the step alone.
Each of W processes takes its contiguous B / W of them and splits them into `grad_accum` micro-batches; the
gradients are averaged over the micro-batches and then over the processes (an all-reduce), which is the
gradient of the global batch's mean loss, as one process computes it. A checkpoint holds the trained module,
the optimiser and schedule, the step and the random state; a run started on a folder that holds one continues
from that step.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..shards import Shards, current

CHECKPOINT = "checkpoint"


@dataclass
class LoopConfig:
    steps: int
    batch_size: int = 8  # sequences per optimiser step, over every process
    grad_accum: int = 1  # micro-batches per step, in each process
    lr: float = 5e-4
    warmup_steps: int = 50
    grad_clip: float = 0.5
    weight_decay: float = 0.0
    checkpoint_every: int = 100  # steps; 0: only at the end
    halt_after: int | None = None  # stop once this run has taken this many steps, checkpointed (time-boxed runs)
    seed: int = 0
    autocast: str = "auto"  # "auto": bf16 on CUDA, none elsewhere; "bf16"; "none"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if self.autocast not in ("auto", "bf16", "none"):
            raise ValueError(f"autocast: expected auto, bf16 or none, got {self.autocast!r}")


# losses(items, step) -> {"total": loss tensor, "acc": top-1 accuracy, "tokens": tokens the batch trained on, ...};
# any randomness an item needs is drawn from `item_generator(seed, step, item)`, so that the draws do not depend
# on how the batch is split over processes and micro-batches
Losses = Callable[[Sequence[int], int], dict[str, torch.Tensor | float]]


def item_generator(seed: int, step: int, item: int, device="cpu") -> torch.Generator:
    """The random stream of one item at one step (the same in any launch)."""
    return torch.Generator(device).manual_seed((seed * 1_000_003 + step) * 1_000_033 + item)


def batch_items(step: int, batch_size: int, n_items: int, seed: int) -> list[int]:
    """The global batch of `step`: positions of the stream of seeded permutations of range(n_items)."""
    out, position = [], step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, n_items)
        order = torch.randperm(n_items, generator=torch.Generator().manual_seed(seed * 1000003 + epoch)).tolist()
        take = order[offset: offset + batch_size - len(out)]
        out += take
        position += len(take)
    return out


class TrainLoop:
    """Train the parameters of `module` that require grad on `losses` over `n_items` items (see the module
    docstring); `out_dir` holds the checkpoint and the history."""

    def __init__(self, module: torch.nn.Module, losses: Losses, n_items: int, config: LoopConfig,
                 out_dir: str | Path, shards: Shards | None = None, desc: str = "train"):
        self.module, self.losses, self.n_items, self.config = module, losses, n_items, config
        self.out_dir, self.desc = Path(out_dir), desc
        self.shards = shards or current()
        per_process = config.batch_size / self.shards.world
        if per_process != int(per_process) or int(per_process) % config.grad_accum:
            raise ValueError(f"batch_size: {config.batch_size} must split evenly over {self.shards.world} "
                             f"process(es) x {config.grad_accum} micro-batches")
        if n_items < 1:
            raise ValueError("data: no training items")
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_factor)
        self.step, self.history = 0, []
        self._broadcast_parameters()

    def _lr_factor(self, step: int) -> float:
        c = self.config
        if step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        return 0.5 * (1 + math.cos(math.pi * (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps)))

    def _autocast(self):
        device = next(self.module.parameters()).device
        on = self.config.autocast == "bf16" or (self.config.autocast == "auto" and device.type == "cuda")
        return torch.autocast(device.type, dtype=torch.bfloat16) if on else nullcontext()

    # ---- distribution ------------------------------------------------------------------------------------
    def _broadcast_parameters(self) -> None:
        """Every process starts from rank 0's parameters."""
        if self.shards.world > 1:
            import torch.distributed as dist

            for p in self.module.parameters():
                dist.broadcast(p.data, 0)

    def _average_gradients(self) -> None:
        # a parameter the batch did not reach (a SpecVLM branch no row picked) steps with a zero gradient in
        # every launch: AdamW skips a parameter whose grad is None but moves one with momentum and a zero grad,
        # so None in one process and zeros from another would part the launches
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.shards.world > 1:
            import torch.distributed as dist

            for p in self.params:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= self.shards.world

    def _mean_over_processes(self, values: dict[str, float]) -> dict[str, float]:
        if self.shards.world == 1:
            return values
        import torch.distributed as dist

        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.shards.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        summed = dict(zip(keys, t.tolist()))
        return {k: (v if k == "tokens" else v / self.shards.world) for k, v in summed.items()}

    # ---- one step ----------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        c, shards = self.config, self.shards
        items = batch_items(self.step, c.batch_size, self.n_items, c.seed)
        mine = items[shards.rank * len(items) // shards.world: (shards.rank + 1) * len(items) // shards.world]
        micro = len(mine) // c.grad_accum
        self.opt.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for i in range(c.grad_accum):
            with self._autocast():
                parts = self.losses(mine[i * micro: (i + 1) * micro], self.step)
            (parts["total"] / c.grad_accum).backward()
            for k, v in parts.items():
                value = float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
                sums[k] = sums.get(k, 0.0) + (value if k == "tokens" else value / c.grad_accum)
        self._average_gradients()
        if c.grad_clip:
            torch.nn.utils.clip_grad_value_(self.params, c.grad_clip)
        self.opt.step()
        self.sched.step()
        self.step += 1
        return self._mean_over_processes(sums)

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """On rank 0: the module, the optimiser and schedule, the step and the history (a folder replaced whole)."""
        if not self.shards.main:
            return
        folder = self.out_dir / CHECKPOINT
        tmp = self.out_dir / f"{CHECKPOINT}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        torch.save({"module": self.module.state_dict(), "opt": self.opt.state_dict(),
                    "sched": self.sched.state_dict(), "step": self.step, "history": self.history,
                    "config": asdict(self.config)}, tmp / "state.pt")
        if folder.exists():
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
        tmp.rename(folder)

    def resume(self) -> bool:
        """Continue from the folder's checkpoint, if it has one (True when it did)."""
        path = self.out_dir / CHECKPOINT / "state.pt"
        if not path.exists():
            return False
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state["config"]["batch_size"] != self.config.batch_size or state["config"]["seed"] != self.config.seed:
            raise ValueError(f"--out: {self.out_dir} holds a checkpoint of another run (batch size "
                             f"{state['config']['batch_size']}, seed {state['config']['seed']}); use a new folder")
        self.module.load_state_dict(state["module"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.step, self.history = state["step"], state["history"]
        return True

    # ---- the run ---------------------------------------------------------------------------------------------
    def run(self) -> list[dict]:
        """Train to `steps` (from the checkpoint's step when there is one); returns the per-step history."""
        c = self.config
        resumed = self.resume()
        self.module.train()
        bar = tqdm(total=c.steps, initial=self.step, desc=self.desc + (" (resumed)" if resumed else ""), unit="step",
                   disable=not self.shards.main)
        try:
            self._steps(bar)
        except KeyboardInterrupt:  # Ctrl-C: say where the run can continue from (a checkpoint is whole or absent)
            bar.close()
            if self.shards.main:
                path = self.out_dir / CHECKPOINT / "state.pt"
                kept = torch.load(path, map_location="cpu", weights_only=False)["step"] if path.exists() else None
                where = (f"its checkpoint at step {kept} is in {self.out_dir}: the same command continues from it"
                         if kept is not None else "no checkpoint was written yet (--checkpoint-every)")
                print(f"\ntraining interrupted at step {self.step} of {c.steps}; {where}", file=sys.stderr)
            raise
        bar.close()
        self.module.eval()
        if self.shards.main:
            (self.out_dir / "history.json").write_text(json.dumps(self.history) + "\n")
        return self.history

    def _steps(self, bar) -> None:
        c = self.config
        start_step, t0, tokens = self.step, time.perf_counter(), 0.0
        while self.step < c.steps:
            metrics = self.train_step()
            tokens += metrics.get("tokens", 0.0)
            self.history.append({"step": self.step, **{k: round(v, 6) for k, v in metrics.items()}})
            rate = tokens / max(time.perf_counter() - t0, 1e-9)
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['total']:.4f}", acc=f"{metrics.get('acc', float('nan')):.3f}",
                            tok_s=f"{rate:.0f}")
            halted = c.halt_after is not None and self.step - start_step >= c.halt_after
            if (c.checkpoint_every and self.step % c.checkpoint_every == 0) or self.step == c.steps or halted:
                self.save_checkpoint()
            if halted:
                break

    @property
    def finished(self) -> bool:
        return self.step >= self.config.steps


__all__ = ["CHECKPOINT", "LoopConfig", "TrainLoop", "batch_items", "item_generator"]
