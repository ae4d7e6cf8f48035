"""The plain training loop the zoo's from-scratch models share, its usual optimiser, and resumable runs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm


def train_steps(model: torch.nn.Module, next_batch: Callable[[int], dict] | None, total: int,
                optim: tuple[torch.optim.Optimizer, Any], desc: str, *, checkpoint: Checkpoint | None = None,
                after_step: Callable[[int, list[float]], None] | None = None,
                loss: Callable[[int], torch.Tensor] | None = None, clip: float | None = 1.0,
                progress: bool = True) -> list[float]:
    """Optimiser steps up to `total` on `model(**next_batch(step)).loss` (or on `loss(step)`, a model whose loss
    is not its forward's) with `optim` = (optimiser, schedule) (`adamw_cosine`'s pair), the gradient norm clipped
    to `clip` (None: not clipped), each step followed by one schedule step, with a progress bar showing the running
    loss; returns the loss of every step. `checkpoint`: resumes where its file left off (its earlier steps' losses
    included) and saves every `checkpoint.every` steps. `after_step(steps_done, losses)` runs after each step."""
    if (next_batch is None) == (loss is None):
        raise ValueError("next_batch / loss: give exactly one (the batches of model(**batch).loss, or the loss itself)")
    opt, sched = optim
    step_loss = loss if loss is not None else (lambda step: model(**next_batch(step)).loss)
    start, losses = checkpoint.restore() if checkpoint is not None else (0, [])
    bar = tqdm(range(start, total), desc=desc, unit="step", initial=start, total=total, disable=not progress)
    for step in bar:
        value = step_loss(step)
        opt.zero_grad(set_to_none=True)
        value.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        losses.append(float(value.detach()))
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if checkpoint is not None:
            checkpoint(step + 1, losses)
        if after_step is not None:
            after_step(step + 1, losses)
    return losses


def adamw_cosine(model: torch.nn.Module, lr: float, steps: int, weight_decay: float):
    """(optimiser, schedule): AdamW (betas 0.9, 0.95) with `weight_decay` on the matrices (parameters of 2 or
    more dimensions) and none on the rest, the learning rate warmed up linearly over a thirtieth of `steps`,
    then decayed along a half cosine to 0 at `steps`."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 30)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    return opt, sched


class Checkpoint:
    """A training run that survives being cut off: every `every` steps the model, optimiser, schedule, RNG
    state, losses and time spent go to one file (`path`); a restart with the same `recipe` resumes there
    (a different recipe is refused, naming the file). Pass it as `train_steps`' `checkpoint`.

    `state` / `load_state` carry whatever else the run needs to resume exactly (e.g. a data stream's
    `random.Random` state)."""

    def __init__(self, path, recipe: dict, model: torch.nn.Module, opt: torch.optim.Optimizer, sched,
                 every: int = 200, total: int | None = None, state: Callable[[], dict] | None = None,
                 load_state: Callable[[dict], None] | None = None):
        self.path, self.recipe = Path(path), recipe
        self.model, self.opt, self.sched, self.every, self.total = model, opt, sched, every, total
        self.state, self.load_state = state, load_state
        self.spent = 0.0
        self._t0 = time.time()

    def restore(self) -> tuple[int, list[float]]:
        """(the step to start from, the losses of the steps already done): (0, []) with no checkpoint."""
        if not self.path.exists():
            return 0, []
        saved = torch.load(self.path, weights_only=False)
        if saved["recipe"] != self.recipe:
            raise ValueError(f"{self.path}: written for another recipe ({saved['recipe']}); delete it to start over")
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["opt"])
        self.sched.load_state_dict(saved["sched"])
        torch.set_rng_state(saved["torch_rng"])
        if self.load_state is not None:
            self.load_state(saved["extra"])
        self.spent, self._t0 = saved["seconds"], time.time()
        return saved["step"], saved["losses"]

    def seconds(self) -> float:
        """Training time over every run so far."""
        return self.spent + time.time() - self._t0

    def __call__(self, done: int, losses: list[float]) -> None:
        if done % self.every or (self.total is not None and done >= self.total):
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save({"recipe": self.recipe, "model": self.model.state_dict(), "opt": self.opt.state_dict(),
                    "sched": self.sched.state_dict(), "torch_rng": torch.get_rng_state(),
                    "extra": self.state() if self.state is not None else None, "step": done, "losses": losses,
                    "seconds": self.seconds()}, tmp)
        tmp.replace(self.path)  # a run cut off while saving keeps the previous checkpoint

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
