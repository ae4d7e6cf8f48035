"""The per-token diffusion head of a continuous-token AR model (MAR's DiffLoss, written for this suite).

`DenoiserMLP` predicts the noise ε of a noisy token x_t given the step t and the transformer's condition
z (residual MLP blocks modulated by adaLN from t and z). `Trajectory` is the sampling schedule: the
`diffusers` `DDPMScheduler` (cosine betas, ε-prediction, `clip_sample=False`) supplies `alphas_cumprod`
and the timestep grid; the reverse step is written here because the scheduler has no noise temperature:

    x̂0 = (x_t - sqrt(1 - ᾱ_t) ε) / sqrt(ᾱ_t)
    μ   = sqrt(ᾱ_prev) β'/(1 - ᾱ_t) x̂0 + sqrt(1 - β') (1 - ᾱ_prev)/(1 - ᾱ_t) x_t,   β' = 1 - ᾱ_t / ᾱ_prev
    x_prev = μ + τ σ ξ,   σ² = β' (1 - ᾱ_prev)/(1 - ᾱ_t)   (DDPM's "fixed_small" variance; τ: MAR's temperature)

With τ = 1 this is `DDPMScheduler.step` (tested). The grid runs from t_0 = T (S - 1) / S down to a stop level
t_stop; the token a model emits is the state x_{t_stop} after the last *stochastic* transition, whose
trajectory has a density; the deterministic last step (x̂0 from x_{t_stop}) is a readout applied to the
emitted token, not part of the token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TRAIN_STEPS = 1000


def schedule_scheduler(train_steps: int = TRAIN_STEPS):
    """The `diffusers` scheduler whose schedule every model here is trained and sampled with."""
    from diffusers import DDPMScheduler

    return DDPMScheduler(num_train_timesteps=train_steps, beta_schedule="squaredcos_cap_v2", clip_sample=False,
                         prediction_type="epsilon", variance_type="fixed_small")


@dataclass(frozen=True)
class Trajectory:
    """A sampling grid: `timesteps` [S] descending (last = t_stop), with per-transition coefficients for the
    S - 1 stochastic steps t_i -> t_{i+1} (`mean_x0`, `mean_xt`, `std`) and the stop level's ᾱ."""

    timesteps: torch.Tensor  # [S] long
    alphas_cumprod: torch.Tensor  # [S] ᾱ at each grid step
    mean_x0: torch.Tensor  # [S - 1]
    mean_xt: torch.Tensor  # [S - 1]
    std: torch.Tensor  # [S - 1] σ of each transition (before the temperature)
    temperature: float = 1.0

    @staticmethod
    def make(steps: int, stop: int, temperature: float = 1.0, train_steps: int = TRAIN_STEPS) -> "Trajectory":
        """`steps` grid points evenly spaced from T (S - 1) / S down to `stop` (respaced DDPM). The top is
        that of `diffusers`' leading spacing: at t = T - 1 the cosine schedule's ᾱ is ~1e-9 and x̂0 =
        (x - sqrt(1 - ᾱ) ε) / sqrt(ᾱ) would blow any error in ε up by 1e4."""
        if not isinstance(steps, int) or steps < 2:
            raise ValueError(f"steps: expected an int >= 2 (one stochastic transition at least), got {steps!r}")
        if not isinstance(stop, int) or not 0 <= stop < train_steps * (steps - 1) / steps - steps:
            raise ValueError(f"stop: expected an int in [0, {int(train_steps * (steps - 1) / steps) - steps}), got {stop!r}")
        if not temperature > 0:
            raise ValueError(f"temperature: expected > 0, got {temperature!r}")
        scheduler = schedule_scheduler(train_steps)
        grid = torch.linspace(train_steps * (steps - 1) / steps, stop, steps, device="cpu").round().long()
        scheduler.set_timesteps(timesteps=grid.tolist())  # validates the grid as the scheduler sees it
        ac = scheduler.alphas_cumprod.double()
        a_t, a_prev = ac[grid[:-1]], ac[grid[1:]]
        beta = 1 - a_t / a_prev
        mean_x0 = a_prev.sqrt() * beta / (1 - a_t)
        mean_xt = (1 - beta).sqrt() * (1 - a_prev) / (1 - a_t)
        var = (beta * (1 - a_prev) / (1 - a_t)).clamp(min=1e-20)
        return Trajectory(grid, ac[grid].float(), mean_x0.float(), mean_xt.float(), var.sqrt().float(),
                          float(temperature))

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def with_temperature(self, temperature: float) -> "Trajectory":
        if not temperature > 0:
            raise ValueError(f"temperature: expected > 0, got {temperature!r}")
        return Trajectory(self.timesteps, self.alphas_cumprod, self.mean_x0, self.mean_xt, self.std, float(temperature))

    def x0(self, x: torch.Tensor, eps: torch.Tensor, i: int | torch.Tensor) -> torch.Tensor:
        """x̂0 from state `x` at grid step i (an int, or a tensor broadcasting against x[..., :1])."""
        a = self.alphas_cumprod[i]
        if isinstance(i, torch.Tensor):
            a = a[..., None]
        return (x - (1 - a).sqrt() * eps) / a.sqrt()

    def mean(self, x: torch.Tensor, eps: torch.Tensor, i: int | torch.Tensor) -> torch.Tensor:
        """Posterior mean of the transition from grid step i to i + 1."""
        c0, ct = self.mean_x0[i], self.mean_xt[i]
        if isinstance(i, torch.Tensor):
            c0, ct = c0[..., None], ct[..., None]
        return c0 * self.x0(x, eps, i) + ct * x

    def transition_std(self) -> torch.Tensor:
        """[S - 1] the std τσ_i every transition samples with."""
        return self.temperature * self.std

    def to(self, device) -> "Trajectory":
        return Trajectory(*(getattr(self, f).to(device) for f in ("timesteps", "alphas_cumprod", "mean_x0",
                                                                   "mean_xt", "std")), self.temperature)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of (float) timesteps [N] -> [N, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


class _Denoiser(nn.Module):
    """What both heads share: ε = predict(x, modulation(embed(t) + cond(z))), with `time`, `cond`,
    `freq_dim`, `modulation` and `predict` supplied by the head."""

    def time_features(self, t: torch.Tensor) -> torch.Tensor:
        return self.time(timestep_embedding(t, self.freq_dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor, time_features: torch.Tensor | None = None):
        if time_features is None:
            time_features = self.time_features(t)
        return self.predict(x, self.modulation(time_features + self.cond(z)))


class DenoiserMLP(_Denoiser):
    """ε-prediction MLP over one token: `forward(x [N, D], t [N], z [N, C]) -> ε [N, D]`.

    Residual blocks h += g * MLP(LN(h) (1 + scale) + shift), with (shift, scale, g) per block from
    c = embed(t) + proj(z) (adaLN, zero-initialised so each block starts as the identity)."""

    def __init__(self, token_dim: int, cond_dim: int, width: int, blocks: int, freq_dim: int = 64):
        super().__init__()
        self.token_dim, self.width, self.blocks, self.freq_dim = token_dim, width, blocks, freq_dim
        self.inp = nn.Linear(token_dim, width)
        self.time = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))
        self.cond = nn.Linear(cond_dim, width)
        self.ada = nn.Linear(width, blocks * 3 * width + 2 * width)  # per block (shift, scale, gate); final
        self.fc1 = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.fc2 = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.out = nn.Linear(width, token_dim)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def modulation(self, c: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(c), self.ada.weight, self.ada.bias)

    def predict(self, x: torch.Tensor, mod: torch.Tensor) -> torch.Tensor:
        """ε from the adaLN modulation `mod` [..., N, blocks*3W + 2W] (functional: no module dispatch).
        Leading dimensions of `mod` broadcast over x [N, D] (e.g. the two guidance halves)."""
        w = self.width
        h = F.linear(x, self.inp.weight, self.inp.bias)
        for b in range(self.blocks):
            shift, scale, gate = mod[..., 3 * w * b: 3 * w * (b + 1)].chunk(3, -1)
            y = F.layer_norm(h, (w,)) * (1 + scale) + shift
            y = F.linear(F.silu(F.linear(y, self.fc1[b].weight, self.fc1[b].bias)), self.fc2[b].weight, self.fc2[b].bias)
            h = h + gate * y
        shift, scale = mod[..., -2 * w:].chunk(2, -1)
        return F.linear(F.layer_norm(h, (w,)) * (1 + scale) + shift, self.out.weight, self.out.bias)


class DenoiserLeanMLP(_Denoiser):
    """ε-prediction MLP with additive conditioning: ε = out(act(fc_k(... act(inp(x) + c)))), c = embed(t) +
    proj(z), `layers` hidden layers of `width`. The interface of `DenoiserMLP` (`modulation` is the identity:
    the condition enters as the first layer's bias), so `HeadSampler` runs either. Why it exists: on a CPU a
    head's cost is its sequential op count (7 transitions per token, ~8 ops per adaLN block); this head
    needs 5 ops per transition, so a draft that shares the target's head pays little for it."""

    def __init__(self, token_dim: int, cond_dim: int, width: int, layers: int, freq_dim: int = 64):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers: expected >= 1, got {layers!r}")
        self.token_dim, self.width, self.blocks, self.freq_dim = token_dim, width, layers, freq_dim
        self.inp = nn.Linear(token_dim, width)
        self.time = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))
        self.cond = nn.Linear(cond_dim, width)
        self.fc = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.out = nn.Linear(width, token_dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def modulation(self, c: torch.Tensor) -> torch.Tensor:
        return c

    def predict(self, x: torch.Tensor, mod: torch.Tensor) -> torch.Tensor:
        """ε from the condition `mod` [..., N, W] (leading dimensions broadcast over x [N, D])."""
        h = F.silu(torch.add(mod, F.linear(x, self.inp.weight, self.inp.bias)))
        for fc in self.fc:
            h = F.silu(F.linear(h, fc.weight, fc.bias))
        return F.linear(h, self.out.weight, self.out.bias)


def make_head(kind: str, token_dim: int, cond_dim: int, width: int, blocks: int) -> nn.Module:
    """A diffusion head by `kind`: "adaln" (`DenoiserMLP`, MAR's DiffLoss) or "lean" (`DenoiserLeanMLP`)."""
    if kind == "adaln":
        return DenoiserMLP(token_dim, cond_dim, width, blocks)
    if kind == "lean":
        return DenoiserLeanMLP(token_dim, cond_dim, width, blocks)
    raise ValueError(f"head_kind: expected 'adaln' or 'lean', got {kind!r}")


def diffusion_loss(head: DenoiserMLP, x0: torch.Tensor, z: torch.Tensor, stop: int, repeat: int = 4,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """ε-MSE on tokens x0 [N, D] with conditions z [N, C], t uniform in [stop, T) (the levels sampling
    visits), each token noised `repeat` times (MAR's diffusion_batch_mul)."""
    ac = schedule_scheduler().alphas_cumprod.to(x0.device)
    x0, z = x0.repeat(repeat, 1), z.repeat(repeat, 1)
    t = torch.randint(stop, TRAIN_STEPS, (len(x0),), device=x0.device, generator=generator)
    eps = torch.randn(x0.shape, device=x0.device, generator=generator)
    a = ac[t][:, None]
    xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
    return F.mse_loss(head(xt, t, z), eps)
