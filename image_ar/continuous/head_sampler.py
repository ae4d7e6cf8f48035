"""Sampling a `PatchAR`'s diffusion head along a trajectory grid, with classifier-free guidance.

Guidance is applied to the noise prediction, ε = ε_u + s (ε_c - ε_u), both halves evaluated on the same
state (MAR's `forward_with_cfg`). A trajectory is stored as its S states [.., S, D] (x at t_0 = T - 1 down
to x at t_stop); the emitted token is the last state. Its log-density is the start's N(0, I) plus the S - 1
Gaussian transitions; the readout (x̂0 from the last state, the deterministic last step) is separate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from multispec.plugin import normal

from .diffusion_head import Trajectory


@dataclass
class HeadConditions:
    """Per row: the head's condition projections of the conditional (and unconditional) transformer outputs."""

    cond: torch.Tensor  # [N, W]
    uncond: torch.Tensor | None  # [N, W], None when unguided
    scale: float

    def take(self, index: torch.Tensor) -> "HeadConditions":
        return HeadConditions(self.cond[index], None if self.uncond is None else self.uncond[index], self.scale)

    def __len__(self) -> int:
        return len(self.cond)


@dataclass(frozen=True)
class HeadSampling:
    """How the diffusion heads sample each token, the target's and the draft's alike: `steps` grid points of a
    trajectory (None: the target's config), `temperature` MAR's noise temperature, `guidance_scale`
    classifier-free guidance on ε (None: unguided)."""

    steps: int | None = None
    temperature: float = 1.0
    guidance_scale: float | None = 2.0

    def __post_init__(self):
        if self.steps is not None and (isinstance(self.steps, bool) or not isinstance(self.steps, int)
                                       or self.steps < 2):
            raise ValueError(f"steps: expected an int >= 2 or None, got {self.steps!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature: expected > 0, got {self.temperature!r}")
        if self.guidance_scale is not None and not self.guidance_scale > 0:
            raise ValueError(f"guidance_scale: expected > 0 or None, got {self.guidance_scale!r}")


class HeadSampler:
    """One model's head on one grid (`trajectory`), guided at `guidance_scale` (None or 1: unguided)."""

    def __init__(self, model, trajectory: Trajectory, guidance_scale: float | None):
        if guidance_scale is not None and not guidance_scale > 0:
            raise ValueError(f"guidance_scale: expected > 0 or None, got {guidance_scale!r}")
        self.model, self.head = model, model.head
        self.trajectory = trajectory.to(model.pos.device)
        self.guided = guidance_scale is not None and guidance_scale != 1
        self.scale = float(guidance_scale) if self.guided else 1.0
        with torch.no_grad():
            self.time = self.head.time_features(self.trajectory.timesteps.float())  # [S, W]
        self.std = self.trajectory.transition_std()  # [S - 1]
        self.dim = model.config.token_dim
        # per transition, as Python floats for the sampling loop: mean = a_i x - b_i ε, x' = mean + s_i ξ
        traj = self.trajectory
        root_a = traj.alphas_cumprod.double().sqrt()
        root_1ma = (1 - traj.alphas_cumprod.double()).sqrt()
        self._a = (traj.mean_x0.double() / root_a[:-1] + traj.mean_xt.double()).tolist()
        self._b = (traj.mean_x0.double() * root_1ma[:-1] / root_a[:-1]).tolist()
        self._s = self.std.double().tolist()

    @property
    def steps(self) -> int:
        return self.trajectory.steps

    def conditions(self, z_cond: torch.Tensor, z_uncond: torch.Tensor | None) -> HeadConditions:
        """From transformer outputs [N, H] (the unconditional half is ignored when unguided)."""
        proj = lambda z: torch.nn.functional.linear(z, self.head.cond.weight, self.head.cond.bias)  # noqa: E731
        return HeadConditions(proj(z_cond), proj(z_uncond) if self.guided else None, self.scale)

    def _halves(self, conditions: HeadConditions) -> torch.Tensor:
        """[1 or 2, N, W]: the condition projections of each guidance half."""
        if conditions.uncond is None:
            return conditions.cond[None]
        return torch.stack([conditions.cond, conditions.uncond])

    def _guide(self, e: torch.Tensor, conditions: HeadConditions) -> torch.Tensor:
        """ε [1 or 2, N, D] per half -> the guided ε_u + s (ε_c - ε_u)."""
        if e.shape[0] == 1:
            return e[0]
        return torch.lerp(e[1], e[0], conditions.scale)

    def eps(self, conditions: HeadConditions, x: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
        """Guided noise prediction at states x [N, D], grid step(s) `step` (an int or [N]); both halves in
        one call, the input layer shared (it does not see the condition)."""
        mod = self.head.modulation(self.time[step] + self._halves(conditions))
        return self._guide(self.head.predict(x, mod), conditions)

    def sample(self, conditions: HeadConditions, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the reverse process from `noise` [N, S, D] (noise[:, 0] is the start, noise[:, i + 1] the
        transition i draw): (states [N, S, D], means [N, S - 1, D])."""
        n = self.steps - 1
        # the adaLN modulation of every step at once: [steps, halves, N, M]
        mods = self.head.modulation(self.time[:n, None, None] + self._halves(conditions)[None])
        x = noise[:, 0]
        states, means = [x], []
        for i in range(n):
            eps = self._guide(self.head.predict(x, mods[i]), conditions)
            mean = torch.add(x * self._a[i], eps, alpha=-self._b[i])
            x = torch.add(mean, noise[:, i + 1], alpha=self._s[i])
            states.append(x)
            means.append(mean)
        return torch.stack(states, 1), torch.stack(means, 1)

    def means(self, conditions: HeadConditions, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This head's transition means along given trajectories `states` [N, S, D], all steps in one
        batched call: (means [N, S - 1, D], readout [N, D] = x̂0 from the last state)."""
        n, s, d = states.shape
        step = torch.arange(s, device=states.device).repeat(n)
        rows = torch.arange(n, device=states.device).repeat_interleave(s)
        x = states.reshape(n * s, d)
        eps = self.eps(conditions.take(rows), x, step)
        x0 = self.trajectory.x0(x, eps, step).view(n, s, d)
        x, eps = x.view(n, s, d), eps.view(n, s, d)
        traj = self.trajectory
        means = traj.mean_x0[:, None] * x0[:, :-1] + traj.mean_xt[:, None] * x[:, :-1]
        return means, x0[:, -1]

    def readout(self, conditions: HeadConditions, last: torch.Tensor) -> torch.Tensor:
        """x̂0 from emitted tokens `last` [N, D] (the deterministic last step)."""
        s = self.steps - 1
        return self.trajectory.x0(last, self.eps(conditions, last, s), s)

    def log_density(self, states: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        """log-density of trajectories [N, S, D] whose transition means are `means` [N, S - 1, D]."""
        d = states.shape[-1]
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        start = -0.5 * (states[:, 0] ** 2).sum(-1) - d * half_log_2pi
        z = (states[:, 1:] - means) / self.std[:, None]
        steps = -0.5 * (z ** 2).sum(-1) - d * (self.std.log() + half_log_2pi)
        return start + steps.sum(-1)

    def noise(self, n: int, generator: torch.Generator | None) -> torch.Tensor:
        """[n, S, D] standard normal draws from `generator` (made on its device) on the model's device."""
        return normal((n, self.steps, self.dim), generator, self.model.pos.device)
