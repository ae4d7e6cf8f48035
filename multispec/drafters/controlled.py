"""A drafter whose acceptance is a setting: it proposes the target's own greedy continuation, each token right
with probability `acceptance` and deliberately wrong otherwise, independently. With it a system's efficiency is
measured apart from any drafter's quality, at sizes where no trained drafter exists: the accepted length of a
k-chain is then 1 + p + p^2 + ... + p^k in expectation, and the step cost is the system's alone (drafting is a
table lookup).

The continuation is the target's own `generate` (greedy) from the prompt, computed at `start`; the drafter
follows each row's committed length. Greedy verification only (a sampled token is not known in advance).

Chains and static trees (`StaticTree`: a tree of top-k candidates). In a tree, a node whose ancestors are all
right takes the right token with probability `acceptance` when none of its elder siblings (lower ranks) took
it, and a wrong token otherwise (distinct from its siblings'), as if each rank of a drafter's top-k were an
independent guess: a depth whose right parent has w children holds the right token with probability
1 - (1 - acceptance)^w.

    drafter = ControlledDrafter(model, acceptance=0.8, horizon=max_new_tokens)
    out = speculative_generate(model, drafter, ids, max_new_tokens=128, tree=4)
    drafter.measured_acceptance      # ~0.8
"""

from __future__ import annotations

import random

import torch

from ..prompt import Prompt
from ..rules import Verdict
from ..sampling import SamplingConfig
from ..targets.base import Features
from ..tree import Chain, DraftTree, StaticTree, TreeSpec
from .base import Drafter


class ControlledDrafter(Drafter):
    """See the module docstring. `horizon`: new tokens the continuation covers (the generation's budget);
    `seed`: the drafter's own coin (not the caller's generator: the coin must not change what is verified).
    `continuation` [B, >= horizon]: the target's greedy tokens after the prompt when the caller has them (e.g.
    from a `generate` baseline it times), so that `start` does not run `generate` again; the same for every
    call, so one prompt batch. `vocab_size`: the vocabulary the target generates from (default: its output
    head's)."""

    def __init__(self, target, acceptance: float, horizon: int, seed: int = 0,
                 continuation: torch.Tensor | None = None, vocab_size: int | None = None):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance: expected a probability in [0, 1], got {acceptance!r}")
        if horizon < 1:
            raise ValueError(f"horizon: expected >= 1, got {horizon}")
        self.target, self.acceptance, self.horizon = target, float(acceptance), int(horizon)
        # the generated tokens' vocabulary (default the output head's; Janus generates from its image codebook)
        self.vocab_size = int(vocab_size or target.get_output_embeddings().weight.shape[0])
        self.coin = random.Random(seed)  # host-side: drawing reads nothing from any tensor
        if continuation is not None and (continuation.dim() != 2 or continuation.shape[1] < horizon):
            raise ValueError(f"continuation: expected [B, >= {horizon}] tokens, got {tuple(continuation.shape)}")
        self.given = None if continuation is None else continuation.cpu()
        self.continuation: torch.Tensor | None = None  # [B, horizon + margin] the target's greedy tokens
        self.continuation_lists: list[list[int]] = []
        self.position: list[int] = []  # per active row: how many of its continuation tokens are committed
        self.rows: list[int] = []
        self.accepted = self.rejected = 0  # drafted tokens accepted, and drafts that met a rejection
        self.drafted = 0  # the last chain's length

    @torch.no_grad()
    def start(self, prompt: Prompt, features: Features | None = None) -> None:
        self.position = [0] * prompt.batch_size
        self.rows = list(range(prompt.batch_size))
        if self.given is not None:
            if self.given.shape[0] != prompt.batch_size:
                raise ValueError(f"continuation: {self.given.shape[0]} rows for a batch of {prompt.batch_size}")
            self.continuation = self.given
            self.continuation_lists = self.continuation.tolist()
            return
        device = next(self.target.parameters()).device
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in prompt.inputs.items()}
        out = self.target.generate(prompt.input_ids.to(device), attention_mask=prompt.attention_mask.to(device),
                                   max_new_tokens=self.horizon + 64, do_sample=False, eos_token_id=None,
                                   pad_token_id=0, **inputs)
        # the root (the prompt's last token) is committed; the continuation starts after it
        self.continuation = out[:, prompt.input_ids.shape[1]:].cpu()
        self.continuation_lists = self.continuation.tolist()  # read once: drafting reads no tensor

    def propose(self, roots: torch.Tensor, spec: TreeSpec, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> DraftTree:
        if sampling.do_sample:
            raise ValueError("sampling: the controlled drafter knows the target's greedy continuation only")
        if isinstance(spec, Chain) and spec.k == 0:  # a step without drafts (an adaptive length's choice)
            self.drafted = 0
            return DraftTree.empty(roots.shape[0], roots.device)
        if isinstance(spec, Chain):
            choices = [(0,) * d for d in range(1, spec.k + 1)]
        elif isinstance(spec, StaticTree):
            choices = list(spec.choices)
        else:
            raise ValueError(f"tree: the controlled drafter drafts chains and static trees, got {type(spec).__name__}")
        index = {c: i for i, c in enumerate(choices)}
        parents = torch.tensor([index[c[:-1]] if len(c) > 1 else -1 for c in choices])
        rows = []
        for row, pos in zip(self.rows, self.position):
            cont = self.continuation_lists[row]
            right_at, taken, out = {(): True}, set(), []  # nodes holding the right token; parents whose child did
            for c in choices:
                right = cont[min(pos + len(c) - 1, len(cont) - 1)]
                ok = right_at[c[:-1]] and c[:-1] not in taken and self.coin.random() < self.acceptance
                right_at[c] = ok
                if ok:
                    taken.add(c[:-1])
                out.append(right if ok else (right + 1 + c[-1]) % self.vocab_size)  # wrong: distinct per rank
            rows.append(out)
        tokens = torch.tensor(rows, dtype=torch.long).view(len(rows), len(choices))
        self.drafted = max(len(c) for c in choices)
        if roots.device.type == "cuda":  # a pinned copy: queued behind the step, no wait for the device
            tokens = tokens.pin_memory()
        tokens = tokens.to(roots.device, non_blocking=True)
        if isinstance(spec, Chain):
            return DraftTree.chain(tokens)
        return DraftTree(tokens, parents.to(roots.device).expand_as(tokens).contiguous(),
                         torch.ones_like(tokens, dtype=torch.bool), dense=True)

    def commit(self, draft: DraftTree, verdict: Verdict, features: Features | None = None) -> None:
        counts = verdict.host_counts or tuple((verdict.num_accepted + 1).tolist())
        self.position = [p + c for p, c in zip(self.position, counts)]
        for c in counts:  # every row drafted a whole chain of `drafted` (no read of the tree's valid mask)
            self.accepted += c - 1
            self.rejected += c - 1 < self.drafted

    @property
    def measured_acceptance(self) -> float:
        """Accepted drafts / (accepted drafts + first rejections): the estimate of the probability that a drafted
        token whose parent was accepted is accepted too (in a tree: that a depth holds the right token below a
        right parent); a row's last step, cut by its token budget, counts as a rejection (a bias of one draft a
        row)."""
        return self.accepted / max(1, self.accepted + self.rejected)

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.rows = [self.rows[i] for i in keep]
        self.position = [self.position[i] for i in keep]


__all__ = ["ControlledDrafter"]
