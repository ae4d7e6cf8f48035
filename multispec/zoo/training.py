"""The plain training loop the zoo's from-scratch models share."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm


def train_steps(model: torch.nn.Module, next_batch: Callable[[int], dict], total: int,
                opt: torch.optim.Optimizer, sched, desc: str) -> list[float]:
    """`total` optimiser steps on `model(**next_batch(step)).loss` (gradient norm clipped to 1), with a
    progress bar showing the running loss; returns the loss of every step."""
    losses = []
    bar = tqdm(range(total), desc=desc, unit="step")
    for step in bar:
        loss = model(**next_batch(step)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    return losses
