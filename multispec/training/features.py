"""What a feature-level drafter learns from, read off the target exactly as the drafter will read it when
drafting (the same hooks as `HFCausalLM`): the final normed hidden state, the residual streams entering given
layers, and the target's next-token distribution restricted to a draft vocabulary."""

from __future__ import annotations

import torch

from ..targets.base import FeatureRequest, Features
from ..targets.hf import captured_features


@torch.no_grad()
def capture(target, ids: torch.Tensor, request: FeatureRequest) -> Features:
    """The target's `request`ed features [B, S, ...] at every position of `ids` [B, S] (its decoder alone runs:
    no logits)."""
    decoder = target.get_decoder()
    with captured_features(decoder, request) as captured:
        decoder(input_ids=ids.to(next(target.parameters()).device))
    return Features(captured.get("hidden"), {i: captured[i] for i in request.layers})


class Teacher:
    """The target's next-token logits over a draft vocabulary `d2t` (draft index -> target id), computed from
    its final hidden state, and whether its own top token lies inside that vocabulary."""

    def __init__(self, target, d2t: torch.Tensor, chunk: int = 512):
        head = target.get_output_embeddings()
        self.weight = head.weight.detach()
        self.bias = None if getattr(head, "bias", None) is None else head.bias.detach()
        self.softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
        self.d2t = d2t.to(self.weight.device)
        self.full = len(d2t) == self.weight.shape[0]
        self.chunk = chunk

    def _logits(self, hidden: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        w = self.weight if rows is None else self.weight[rows]
        logits = hidden.float() @ w.float().T
        if self.bias is not None:
            logits = logits + (self.bias if rows is None else self.bias[rows]).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.no_grad()
    def __call__(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits over the draft vocabulary [B, S, Vd], in_vocab [B, S] bool) for final hidden states [B, S, H]."""
        hidden = hidden.to(self.weight.device)
        return self.draft_logits(hidden), self.in_vocab(hidden)

    @torch.no_grad()
    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._logits(hidden.to(self.weight.device), self.d2t)

    @torch.no_grad()
    def in_vocab(self, hidden: torch.Tensor) -> torch.Tensor:
        """Whether the full vocabulary's top token after each position lies in the draft vocabulary [B, S] (found in
        chunks of positions: a large vocabulary's logits never all at once). Per token and fixed: what a feature
        cache stores beside the features, so a large head (Gemma's 262k rows) is not run every step."""
        hidden = hidden.to(self.weight.device)
        if self.full:
            return torch.ones(hidden.shape[:-1], dtype=torch.bool, device=hidden.device)
        flat = hidden.reshape(-1, hidden.shape[-1])
        best = torch.cat([self._logits(flat[i: i + self.chunk], None).argmax(-1)
                          for i in range(0, len(flat), self.chunk)]).view(hidden.shape[:-1])
        member = torch.zeros(self.weight.shape[0], dtype=torch.bool, device=hidden.device)
        member[self.d2t] = True
        return member[best]


def top_tokens(sequences: list[list[int]], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent ids of the training text (ties by id), sorted: a draft vocabulary."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(torch.tensor(seq, dtype=torch.long), minlength=vocab_size)[:vocab_size]
    size = min(size, vocab_size)
    order = torch.sort(counts, descending=True, stable=True).indices[:size]
    return torch.sort(order).values


__all__ = ["Teacher", "capture", "top_tokens"]
