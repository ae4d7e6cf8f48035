"""An EAGLE-style draft for a diffusion-head AR target: it predicts the target's conditions z and samples
with the target's own head.

Why: the acceptance of a draft trajectory is set by how far the draft's transition means are from the
target's, and most of that gap sits in the last, low-noise transitions, where a small draft head cannot
follow a large one (`benchmarks/continuous_draft_bound.py`). A draft that shares the target's head differs
only in the condition it feeds it, and a draft layer that reads the target's features predicts that
condition closely. The head is then part of the draft's cost, so it can pay only where the head is cheap
next to the target's transformer (MAR's proportions); `benchmarks/continuous_eagle.py` measures both.

`PatchEagle` is one causal layer over fused (target feature, token) pairs: the pair at draft position j
is (z_{j-1}, x_{j-1}), the condition of token j - 1 and that token, and its output predicts z_j. Inside a
chain the draft feeds its own predictions as features (EAGLE's feature rollout); at the next step the
accepted tokens are fed again with the target's features of the chain it scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn
from tqdm.auto import tqdm

from multispec.zoo.training import train_steps

from .continuous_pair import grid_weights, optimizer
from .diffusion_head import Trajectory, schedule_scheduler
from .head_sampler import HeadConditions, HeadSampler
from .patch_ar import PatchAR, PatchCache, patchify, run_layers
from .trajectory import TrajectoryDraft, TrajectoryNodes
from .trajectory_kernel import trajectory_log_ratio


@dataclass
class PatchEagleConfig:
    hidden: int = 128  # the target's hidden size (the features it reads and predicts)
    heads: int = 4
    token_dim: int = 16
    tokens: int = 49  # the target's tokens per image (draft positions 1..tokens - 1)
    ffn: int = 4  # the layers' MLP width, in multiples of hidden
    layers: int = 1


class PatchEagle(nn.Module, PyTorchModelHubMixin):
    """z_j ≈ layers(fuse(norm(z_{j-1}), embed(x_{j-1})) + pos_j): pre-norm causal layers (`run_layers`), one
    by default (EAGLE's)."""

    def __init__(self, config: PatchEagleConfig | dict | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = PatchEagleConfig(**kwargs)
        elif isinstance(config, dict):
            config = PatchEagleConfig(**config)
        self.config = c = config
        if c.hidden % c.heads:
            raise ValueError(f"heads: {c.heads} does not divide hidden {c.hidden}")
        self.embed = nn.Linear(c.token_dim, c.hidden)
        self.norm_feature = nn.RMSNorm(c.hidden)
        self.fuse = nn.Linear(2 * c.hidden, c.hidden)
        self.pos = nn.Parameter(torch.randn(c.tokens, c.hidden) * 0.02)  # index j - 1 for draft position j
        if c.layers < 1:
            raise ValueError(f"layers: expected >= 1, got {c.layers!r}")
        each = lambda make: nn.ModuleList(make() for _ in range(c.layers))  # noqa: E731
        self.norm1, self.norm2 = each(lambda: nn.RMSNorm(c.hidden)), each(lambda: nn.RMSNorm(c.hidden))
        self.qkv = each(lambda: nn.Linear(c.hidden, 3 * c.hidden, bias=False))
        self.proj = each(lambda: nn.Linear(c.hidden, c.hidden, bias=False))
        self.fc1 = each(lambda: nn.Linear(c.hidden, c.ffn * c.hidden, bias=False))
        self.fc2 = each(lambda: nn.Linear(c.ffn * c.hidden, c.hidden, bias=False))
        self.norm_out = nn.RMSNorm(c.hidden)

    def new_cache(self, batch: int) -> PatchCache:
        c = self.config
        return PatchCache(c.layers, batch, c.heads, c.tokens, c.hidden // c.heads, self.pos.device, self.pos.dtype)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, cache: PatchCache | None = None,
                offset: int = 0) -> torch.Tensor:
        """Predicted conditions [B, T, H] from pairs (features [B, T, H], tokens [B, T, D]) at draft
        positions cache.length + offset + 1.. (written to the cache, not committed)."""
        c = self.config
        start = (0 if cache is None else cache.length) + offset
        f = F.rms_norm(features, (c.hidden,), self.norm_feature.weight, self.norm_feature.eps)
        h = F.linear(torch.cat([f, F.linear(tokens, self.embed.weight, self.embed.bias)], -1),
                     self.fuse.weight, self.fuse.bias)
        return run_layers(self, h + self.pos[start: start + h.shape[1]], cache, offset)


def check_eagle(target: PatchAR, eagle: PatchEagle) -> None:
    t, e = target.config, eagle.config
    for mine, theirs, name in ((e.hidden, t.hidden, "hidden"), (e.token_dim, t.token_dim, "token_dim"),
                               (e.tokens, t.tokens, "tokens")):
        if mine != theirs:
            raise ValueError(f"draft: its {name} ({mine}) differs from the target's ({theirs})")


class PatchEagleDrafter:
    """Drafts chains of trajectories with `eagle` and the target's head (`sampler`), reading the target's
    features from `target_adapter` (a `PatchARTarget`: its prefill features and each scored chain's)."""

    payload = "continuous"

    def __init__(self, eagle: PatchEagle, target_adapter, sampler: HeadSampler):
        self.eagle, self.adapter, self.sampler = eagle, target_adapter, sampler
        self.guided = sampler.guided
        self.dim = sampler.dim
        self.cache = eagle.new_cache(len(target_adapter.runner.labels))
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def _tokens(self, payload: torch.Tensor) -> torch.Tensor:
        x = payload[..., -self.dim:]
        return torch.cat([x, x]) if self.guided else x

    def _conditions(self, z: torch.Tensor) -> HeadConditions:
        c, u = z.chunk(2) if self.guided else (z, None)
        return self.sampler.conditions(c, u)

    def start(self, values: torch.Tensor) -> None:
        # pairs (z_j, x_j) for the prefilled tokens: the target's prefill computed z_0 .. z_{m-1}
        self._pending = (self.adapter.prefill_features, self._tokens(values))

    def propose(self, roots: torch.Tensor, k: int, generator: torch.Generator | None = None) -> TrajectoryDraft:
        b = roots.shape[0]
        features, tokens = self._pending
        z = self.eagle(features, tokens, self.cache)[:, -1:]
        self.cache.commit(features.shape[1])
        payloads, means, logq, conds = [], [], [], []
        for j in range(k):
            cond = self._conditions(z[:, 0])
            states, mean = self.sampler.sample(cond, self.sampler.noise(b, generator))
            payloads.append(states.reshape(b, 1, -1))
            means.append(mean)
            logq.append(self.sampler.log_density(states, mean))
            conds.append(cond)
            if j + 1 < k:  # the next pair: this draft's predicted condition and its token
                z = self.eagle(z, self._tokens(payloads[-1]), self.cache, offset=j)
        conditions = HeadConditions(torch.stack([c.cond for c in conds], 1).flatten(0, 1),
                                    None if conds[0].uncond is None
                                    else torch.stack([c.uncond for c in conds], 1).flatten(0, 1), conds[0].scale)
        return TrajectoryDraft(torch.cat(payloads, 1), torch.stack(logq, 1),
                               TrajectoryNodes(self.sampler, conditions, (b, k)), torch.stack(means, 1))

    def commit(self, kept: torch.Tensor) -> None:
        # kept[t] was drawn (or accepted) at node t of the scored chain, whose condition the target computed
        n = kept.shape[1]
        self._pending = (self.adapter.chain_features[:, :n], self._tokens(kept))


# ---- training --------------------------------------------------------------------------------------------


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


def train_eagle(target: PatchAR, images: torch.Tensor, labels: torch.Tensor, *, steps: int, batch_size: int = 32,
                pool: int = 6144, lr: float = 1e-3, guidance_scale: float = 2.0, head_weight: float = 1.0,
                seed: int = 0, ffn: int = 4, layers: int = 1, progress: bool = True) -> tuple[PatchEagle, list[float]]:
    """Train a `PatchEagle` for `target` on `pool` images (their target features computed once, one noise
    draw each), every other step with the feature rollout. The target (and its head) stay frozen."""
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
    losses = train_steps(eagle, None, steps, opt, sched, "eagle draft", loss=step_loss, progress=progress)
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


__all__ = ["PatchEagle", "PatchEagleConfig", "PatchEagleDrafter", "check_eagle", "eagle_loss", "target_features",
           "teacher_forced_acceptance", "train_eagle"]
