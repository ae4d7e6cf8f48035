"""Training a `PatchEagle` for a diffusion-head AR target: it learns to predict the target's conditions
(and, through the target's head, its transitions), and its acceptance measured with teacher forcing."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from multispec.plugin import train_steps

from .diffusion_head import Trajectory, schedule_scheduler
from .drafters import PatchEagle, PatchEagleConfig
from .head_sampler import HeadSampler
from .patch_ar import PatchAR, patchify
from .trajectory_kernel import trajectory_log_ratio
from .training import grid_weights, optimizer


@torch.no_grad()
def target_features(target: PatchAR, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator):
    """(clean tokens [B, L, D], fed tokens [B, L, D] (noised to the stop level, as sampling emits them),
    z [2B, L, H]: the target's conditions, conditional rows then unconditional (null class) rows)."""
    c = target.config
    ac = schedule_scheduler().alphas_cumprod[c.stop]
    x0 = patchify(images, c.patch)
    fed = ac.sqrt() * x0 + (1 - ac).sqrt() * torch.randn(x0.shape, generator=generator)
    both = torch.cat([labels, torch.full_like(labels, target.null_class)])
    z = target.transform(target.inputs(both, fed[:, :-1].repeat(2, 1, 1), 0))
    return x0, fed, z


def eagle_loss(eagle: PatchEagle, target: PatchAR, x0, fed, z, *, guidance_scale: float, head_weight: float,
               rollout: bool, samples: int, generator: torch.Generator) -> torch.Tensor:
    """MSE to the target's conditions plus `head_weight` x the MSE of the guided noise prediction of the
    target's head on the predicted vs the true conditions, at the sampling grid's transition steps drawn in
    proportion to their weight in the acceptance log ratio (so the second term estimates the expected
    log ratio a draft pays). `rollout`: feed the draft's own (detached) predictions as features, as in a
    chain. Rows: z [2B, L, H] (conditional then unconditional halves), tokens [B, L, D]."""
    b, length, d = x0.shape
    h = z.shape[-1]
    features, tokens, truth = z[:, :-1], fed[:, :-1].repeat(2, 1, 1), z[:, 1:]
    pred = eagle(features, tokens)
    if rollout:
        own = torch.cat([features[:, :1], pred.detach()[:, :-1]], 1)
        pred = eagle(own, tokens)
    loss = F.mse_loss(pred, truth)
    if head_weight:
        grid, weights = grid_weights(target.config)
        pick = torch.randint(0, b * (length - 1), (samples,), generator=generator)
        halves = lambda t: (t[:b].reshape(-1, h)[pick], t[b:].reshape(-1, h)[pick])  # noqa: E731
        (pc, pu), (tc, tu) = halves(pred), halves(truth)
        x = x0[:, 1:].reshape(-1, d)[pick]
        t = grid[torch.multinomial(weights, samples, replacement=True, generator=generator)]
        a = schedule_scheduler().alphas_cumprod[t][:, None]
        xt = a.sqrt() * x + (1 - a).sqrt() * torch.randn(x.shape, generator=generator)
        head = target.head
        with torch.no_grad():
            teacher = torch.lerp(head(xt, t, tu), head(xt, t, tc), guidance_scale)
        student = torch.lerp(head(xt, t, pu), head(xt, t, pc), guidance_scale)
        loss = loss + head_weight * F.mse_loss(student, teacher)
    return loss


@dataclass(frozen=True)
class PatchEagleRecipe:
    """A `PatchEagle`'s training run: `steps` optimiser steps of `batch_size` draws from `pool` images, AdamW at
    `lr` with warm-up and cosine decay, the head's loss weighted by `head_weight`, seeded by `seed`."""

    steps: int
    batch_size: int = 32
    pool: int = 6144
    lr: float = 1e-3
    head_weight: float = 1.0
    seed: int = 0


def train_eagle(target: PatchAR, images: torch.Tensor, labels: torch.Tensor, recipe: PatchEagleRecipe, *,
                guidance_scale: float = 2.0, ffn: int = 4, layers: int = 1,
                progress: bool = True) -> tuple[PatchEagle, list[float]]:
    """Train a `PatchEagle` (`ffn`, `layers`: its shape) for `target` by `recipe` on `recipe.pool` images (their
    target features computed once, one noise draw each), every other step with the feature rollout, the
    teacher's head guided at `guidance_scale`. The target (and its head) stay frozen."""
    steps, batch_size, pool, lr = recipe.steps, recipe.batch_size, recipe.pool, recipe.lr
    head_weight, seed = recipe.head_weight, recipe.seed
    c = target.config
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    eagle = PatchEagle(PatchEagleConfig(hidden=c.hidden, heads=c.heads, token_dim=c.token_dim, tokens=c.tokens, ffn=ffn,
                                        layers=layers))
    target.requires_grad_(False)
    pool = min(pool, len(images))
    parts = [target_features(target, images[i:i + 64, 0] * 2 - 1, labels[i:i + 64], g)
             for i in tqdm(range(0, pool, 64), desc="target features", unit="batch", disable=not progress)]
    x0, fed = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    zc = torch.cat([p[2][: len(p[0])] for p in parts])
    zu = torch.cat([p[2][len(p[0]):] for p in parts])
    opt, sched = optimizer(eagle, lr, steps)

    def step_loss(step: int) -> torch.Tensor:
        idx = torch.randint(0, len(x0), (batch_size,), generator=g)
        return eagle_loss(eagle, target, x0[idx], fed[idx], torch.cat([zc[idx], zu[idx]]),
                          guidance_scale=guidance_scale, head_weight=head_weight, rollout=step % 2 == 1,
                          samples=512, generator=g)

    eagle.train()
    losses = train_steps(eagle, None, steps, (opt, sched), "eagle draft", loss=step_loss, progress=progress)
    return eagle.eval(), losses


@torch.no_grad()
def teacher_forced_acceptance(target: PatchAR, eagle: PatchEagle, images: torch.Tensor, labels: torch.Tensor,
                              guidance_scale: float = 2.0, rollout: bool = False, seed: int = 5) -> float:
    """E[min(1, p(τ)/q(τ))] of one draft trajectory per token of held-out `images` (true prefixes; with
    `rollout` the draft reads its own predicted features throughout, a pessimistic stand-in for deep chain
    positions)."""
    c = target.config
    g = torch.Generator().manual_seed(seed)
    _, fed, z = target_features(target, images[:, 0] * 2 - 1, labels, g)
    features, tokens = z[:, :-1], fed[:, :-1].repeat(2, 1, 1)
    pred = eagle(features, tokens)
    if rollout:
        pred = eagle(torch.cat([features[:, :1], pred[:, :-1]], 1), tokens)
    s = HeadSampler(target, Trajectory.make(c.steps, c.stop), guidance_scale)
    b, h = len(labels), c.hidden
    flat = lambda t: t.reshape(-1, h)  # noqa: E731
    q = s.conditions(flat(pred[:b]), flat(pred[b:]))
    p = s.conditions(flat(z[:b, 1:]), flat(z[b:, 1:]))
    states, mean_q = s.sample(q, s.noise(len(q), g))
    mean_p, _ = s.means(p, states)
    log_ratio = trajectory_log_ratio(states[:, 1:], mean_p, mean_q, s.std, backend="torch")
    return float(log_ratio.clamp(max=0).exp().mean())
