"""What the continuous family's trainers share: batches, the optimiser and schedule, and the weights of the
sampling grid's transitions in the trajectory log ratio."""

from __future__ import annotations

import torch

from multispec.plugin import adamw_cosine

from ..data import shifted
from .diffusion_head import Trajectory
from .patch_ar import PatchARConfig


def batches(images: torch.Tensor, labels: torch.Tensor, batch_size: int, g: torch.Generator):
    while True:
        idx = torch.randint(0, len(images), (batch_size,), generator=g)
        x = shifted(images[idx], 2, g)[:, 0] * 2 - 1
        yield x, labels[idx]


def optimizer(model: torch.nn.Module, lr: float, steps: int):
    """(optimiser, schedule) of the pair's models: AdamW (weight decay 0.02 on the matrices), a warmup over
    a thirtieth of `steps`, then a half cosine to 0."""
    return adamw_cosine(model, lr, steps, weight_decay=0.02)


def grid_weights(config: PatchARConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(timesteps [S - 1], w [S - 1]): the grid's transition steps and the weight w_i with which a noise-
    prediction difference δε enters the trajectory log ratio, log p/q ~ -1/2 Σ_i w_i |δε_i|² (w_i =
    (c0_i sqrt(1 - ᾱ_i) / sqrt(ᾱ_i))² / σ_i², c0 the posterior mean's x̂0 coefficient)."""
    traj = Trajectory.make(config.steps, config.stop)
    a = traj.alphas_cumprod[:-1]
    return traj.timesteps[:-1], (traj.mean_x0 * (1 - a).sqrt() / a.sqrt()) ** 2 / traj.std ** 2
