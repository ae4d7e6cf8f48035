"""A toy continuous autoregressive model whose conditional density is known in closed form: each vector
follows a Gaussian mixture whose means depend linearly on the previous vector,
x_t | x_{t-1} ~ sum_k w_k N(A_k x_{t-1} + b_k, s^2 I). It is the reference for testing continuous
speculative sampling (`multispec.continuous`): target, drafter and plain sampling in a few lines each."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .rules import ContinuousDraft
from .sampling import normal


@dataclass
class MixtureNodes:
    """Per node [B, T]: mixture weights `log_weights` [K], component means `means` [B, T, K, D], std `scale`."""

    log_weights: torch.Tensor
    means: torch.Tensor
    scale: float

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        sq = ((x[:, :, None] - self.means) ** 2).sum(-1)  # [B, T, K]
        log_normal = -0.5 * sq / self.scale ** 2 - d * math.log(self.scale) - 0.5 * d * math.log(2 * math.pi)
        return torch.logsumexp(self.log_weights + log_normal, dim=-1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        b, t, k, d = self.means.shape
        weights = self.log_weights.exp().expand(b * t, k)
        where = weights.device if generator is None else generator.device  # draw where the generator is
        which = torch.multinomial(weights.to(where), 1, generator=generator).to(self.means.device).view(b, t)
        mean = self.means.gather(2, which[..., None, None].expand(b, t, 1, d))[:, :, 0]
        return mean + self.scale * normal((b, t, d), generator, mean.device, mean.dtype)


class GaussianMixtureAR:
    """x_t | x_{t-1} ~ sum_k w_k N(A_k x_{t-1} + b_k, scale^2 I)."""

    def __init__(self, weights: torch.Tensor, matrices: torch.Tensor, offsets: torch.Tensor, scale: float):
        self.log_weights = (weights / weights.sum()).log()
        self.matrices, self.offsets, self.scale = matrices, offsets, float(scale)

    @staticmethod
    def random(dim: int = 2, components: int = 3, scale: float = 0.5, seed: int = 0) -> "GaussianMixtureAR":
        g = torch.Generator().manual_seed(seed)
        weights = torch.rand(components, generator=g) + 0.5
        # contractions (spectral norm 0.7), so the chain stays in a bounded region
        q, _ = torch.linalg.qr(torch.randn(components, dim, dim, generator=g))
        return GaussianMixtureAR(weights, 0.7 * q, 2.0 * torch.randn(components, dim, generator=g), scale)

    def perturbed(self, noise: float, seed: int = 1) -> "GaussianMixtureAR":
        """A draft: the same family with every parameter moved by `noise` (relative) and a wider scale."""
        g = torch.Generator().manual_seed(seed)
        jitter = lambda t: t + noise * t.abs().mean() * torch.randn(t.shape, generator=g)  # noqa: E731
        return GaussianMixtureAR(self.log_weights.exp() * (1 + noise * torch.rand(len(self.log_weights), generator=g)),
                                 jitter(self.matrices), jitter(self.offsets), self.scale * (1 + noise))

    def to(self, device) -> "GaussianMixtureAR":
        """The same model with its parameters on `device`."""
        out = GaussianMixtureAR.__new__(GaussianMixtureAR)
        out.log_weights, out.matrices, out.offsets = (t.to(device) for t in (self.log_weights, self.matrices,
                                                                             self.offsets))
        out.scale = self.scale
        return out

    def conditionals(self, previous: torch.Tensor) -> MixtureNodes:
        """The distribution of the vector after each of `previous` [B, T, D]."""
        means = torch.einsum("kij,btj->btki", self.matrices, previous) + self.offsets
        return MixtureNodes(self.log_weights, means, self.scale)

    def sample(self, values: torch.Tensor, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Plain ancestral sampling of `n` vectors after `values` [B, L, D]: the reference law."""
        out = [values]
        last = values[:, -1:]
        for _ in range(n):
            last = self.conditionals(last).sample(generator)
            out.append(last)
        return torch.cat(out, 1)


class GMMTarget:
    """`GaussianMixtureAR` as a continuous target (a Markov chain: the state is the last vector)."""

    def __init__(self, model: GaussianMixtureAR):
        self.model = model

    def prefill(self, values: torch.Tensor) -> None:
        self.last = values[:, -1]

    def score(self, chain: torch.Tensor) -> MixtureNodes:
        return self.model.conditionals(chain)

    def commit(self, kept: torch.Tensor) -> None:
        self.last = kept[:, -1]


class GMMDrafter:
    """Drafts k vectors by ancestral sampling from another `GaussianMixtureAR`, with their log-densities."""

    payload = "continuous"

    def __init__(self, model: GaussianMixtureAR):
        self.model = model

    def start(self, values: torch.Tensor) -> None:
        pass

    def propose(self, roots: torch.Tensor, k: int, generator: torch.Generator | None = None) -> ContinuousDraft:
        previous, drafts, logq = roots[:, None], [], []
        for _ in range(k):
            dist = self.model.conditionals(previous)
            x = dist.sample(generator)
            logq.append(dist.log_prob(x))
            drafts.append(x)
            previous = x
        payload = torch.cat(drafts, 1)
        chain = torch.cat([roots[:, None], payload[:, :-1]], 1)
        return ContinuousDraft(payload, torch.cat(logq, 1), self.model.conditionals(chain))

    def commit(self, kept: torch.Tensor) -> None:
        pass
