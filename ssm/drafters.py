"""State-space and hybrid models as *draft* models: the incremental feeding engine `ModelDrafter` drives,
built on the STree target adapters.

A draft model is fed a tree a few nodes at a time (the catch-up chain, then one depth per call), each node
after a parent fed earlier, and keeps only the accepted path at the commit. A target adapter scores one
whole tree per step from the committed states. So this engine keeps the nodes fed since the last commit
and, at every call, has the adapter score all of them again with the new ones (a depth-d tree is scored d
times; for the small models that draft, a call costs its fixed per-op overhead far more than its node
count). The commit is the adapter's: states set from the accepted path in closed form.
"""

from __future__ import annotations

import torch

from multispec.plugin import FeedingEngine, PrefillOutput, Prompt, TargetOutput


class StatefulDraftEngine(FeedingEngine):
    """The core's `FeedingEngine` over an SSM target adapter (`Mamba2Target`, `MambaTarget`,
    `BambaTarget`): parents are pending indices (-1 = the committed prefix)."""

    def __init__(self, adapter, name: str = "draft_model"):
        self.adapter = adapter
        self.name = name
        self.model = adapter.model
        self.vocab_size = adapter.vocab_size
        self.device = adapter.device
        self._reset(0)

    def _reset(self, b: int) -> None:
        empty = torch.zeros(b, 0, dtype=torch.long, device=self.device)
        self.tokens, self.parents, self.valid = empty, empty.clone(), empty.bool()

    @property
    def num_pending(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PrefillOutput:
        """Prefill all prompt tokens but the last (the first roots)."""
        out = self.adapter.prefill(Prompt(input_ids, attention_mask))
        self._reset(input_ids.shape[0])
        return out

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None) -> TargetOutput:
        """Feed M new nodes per row (`parents[b, m]`: the pending index of node m's parent, -1 = the
        committed prefix; new node m becomes pending index `num_pending + m`); their logits [B, M, V]."""
        b, m = tokens.shape
        if parents.shape != (b, m):
            raise ValueError(f"parents: expected shape {(b, m)}, got {tuple(parents.shape)}")
        if b != self.batch_size:
            raise ValueError(f"tokens: batch {b} does not match the {self.batch_size} active rows")
        p0 = self.num_pending
        tokens, parents = tokens.to(self.device), parents.to(self.device)
        valid = torch.ones(b, m, dtype=torch.bool, device=self.device) if valid is None else valid.to(self.device)
        if (parents >= p0 + torch.arange(m, device=self.device)).any():
            raise ValueError("parents: a node's parent must be fed before it")
        self.tokens = torch.cat([self.tokens, tokens], 1)
        self.parents = torch.cat([self.parents, torch.where(valid, parents, -1)], 1)
        self.valid = torch.cat([self.valid, valid], 1)
        if p0:
            self.adapter.discard()
        return TargetOutput(self.adapter.score(self.tokens, self.parents, self.valid).logits[:, p0:])

    @torch.no_grad()
    def commit(self, path: torch.Tensor) -> None:
        """Keep the pending nodes `path[b, :]` (pending indices along one root path, -1 padded) of each row."""
        if self.num_pending:
            self.adapter.commit(path.to(self.device))
        elif (path >= 0).any():
            raise ValueError("path: names pending nodes, but none were fed since the last commit")
        self._reset(self.batch_size)

    def discard(self) -> None:
        if self.num_pending:
            self.adapter.discard()
        self._reset(self.batch_size)

    def select(self, rows: torch.Tensor) -> None:
        if self.num_pending:
            raise RuntimeError("select: commit or discard pending nodes first")
        self.adapter.select(rows)
        self._reset(len(rows))
