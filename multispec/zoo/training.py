"""The plain training loop the zoo's from-scratch models share."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm


def train_steps(model: torch.nn.Module, next_batch: Callable[[int], dict], total: int,
                opt: torch.optim.Optimizer, sched, desc: str, start: int = 0, losses: list[float] | None = None,
                after_step: Callable[[int, list[float]], None] | None = None) -> list[float]:
    """Optimiser steps `start`..`total` on `model(**next_batch(step)).loss` (gradient norm clipped to 1), with
    a progress bar showing the running loss; returns the loss of every step (`losses`: those of a resumed
    run's earlier steps). `after_step(steps_done, losses)` runs after each step (e.g. to checkpoint)."""
    losses = [] if losses is None else losses
    bar = tqdm(range(start, total), desc=desc, unit="step", initial=start, total=total)
    for step in bar:
        loss = model(**next_batch(step)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if after_step is not None:
            after_step(step + 1, losses)
    return losses
