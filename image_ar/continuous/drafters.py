"""Drafters of the continuous loop: a small `PatchAR` with its own head (`PatchARDrafter`), and an
EAGLE-style draft (`PatchEagle`, `PatchEagleDrafter`): it predicts the target's conditions z and samples
with the target's own head (trained by `eagle_train.train_eagle`).

Why: the acceptance of a draft trajectory is set by how far the draft's transition means are from the
target's, and most of that gap sits in the last, low-noise transitions, where a small draft head cannot
follow a large one (`benchmarks/studies/continuous_draft_bound.py`). A draft that shares the target's head differs
only in the condition it feeds it, and a draft layer that reads the target's features predicts that
condition closely. The head is then part of the draft's cost, so it can pay only where the head is cheap
next to the target's transformer (MAR's proportions); `benchmarks/studies/continuous_eagle.py` measures both.

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

from .head_sampler import HeadConditions, HeadSampler
from .patch_ar import PatchAR, PatchCache, run_layers, run_layers_at
from .runner import Runner
from .trajectory import TrajectoryDraft, TrajectoryNodes


class PatchARDrafter:
    """A small `PatchAR` drafting chains of trajectories (payload "continuous")."""

    payload = "continuous"

    def __init__(self, model: PatchAR, labels: torch.Tensor, sampler: HeadSampler):
        self.runner = Runner(model, labels, sampler)
        self.sampler = sampler

    def start(self, values: torch.Tensor) -> None:
        self.runner.start(values[:, :-1])

    def propose(self, roots: torch.Tensor, k: int, generator: torch.Generator | None = None) -> TrajectoryDraft:
        b = roots.shape[0]
        previous = roots[:, None]
        payloads, means, logq, conds = [], [], [], []
        for j in range(k):
            cond = self.runner.conditions(self.runner.feed(previous, offset=j))
            states, mean = self.sampler.sample(cond, self.sampler.noise(b, generator))
            payloads.append(states.reshape(b, 1, -1))
            means.append(mean)
            logq.append(self.sampler.log_density(states, mean))
            conds.append(cond)
            previous = payloads[-1]
        self._fed = k
        conditions = HeadConditions(torch.stack([c.cond for c in conds], 1).flatten(0, 1),
                                    None if conds[0].uncond is None else torch.stack([c.uncond for c in conds], 1).flatten(0, 1),
                                    conds[0].scale)
        payload = torch.cat(payloads, 1)
        return TrajectoryDraft(payload, torch.stack(logq, 1), TrajectoryNodes(self.sampler, conditions, (b, k)),
                               torch.stack(means, 1))

    def commit(self, kept: torch.Tensor) -> None:
        n = kept.shape[1]
        if n > self._fed:  # every draft accepted: the last one was never fed
            self.runner.feed(kept[:, self._fed - 1: self._fed], offset=self._fed)
        self.runner.cache.commit(n)


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

    def new_cache(self, batch: int, extra: int = 0) -> PatchCache:
        """Room for every draft position, plus `extra` (a static step's pairs past the end)."""
        c = self.config
        return PatchCache(c.layers, batch, c.heads, c.tokens + extra, c.hidden // c.heads, self.pos.device,
                          self.pos.dtype)

    def _fused(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        c = self.config
        f = F.rms_norm(features, (c.hidden,), self.norm_feature.weight, self.norm_feature.eps)
        return F.linear(torch.cat([f, F.linear(tokens, self.embed.weight, self.embed.bias)], -1),
                        self.fuse.weight, self.fuse.bias)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, cache: PatchCache | None = None,
                offset: int = 0) -> torch.Tensor:
        """Predicted conditions [B, T, H] from pairs (features [B, T, H], tokens [B, T, D]) at draft
        positions cache.length + offset + 1.. (written to the cache, not committed)."""
        start = (0 if cache is None else cache.length) + offset
        h = self._fused(features, tokens)
        return run_layers(self, h + self.pos[start: start + h.shape[1]], cache, offset)

    def forward_at(self, features: torch.Tensor, tokens: torch.Tensor, cache: PatchCache,
                   positions: torch.Tensor) -> torch.Tensor:
        """`forward` at cache positions `positions` [T] (a tensor: the continuous loop's static step); a position
        past the last (pairs overhanging the image) takes the last position's embedding, its output unused."""
        pos = self.pos[positions.clamp(max=len(self.pos) - 1)]
        return run_layers_at(self, self._fused(features, tokens) + pos, cache, positions)


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
