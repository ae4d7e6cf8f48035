"""Model-free drafting by prompt lookup: continue the latest earlier occurrence of the current n-gram."""

from __future__ import annotations

import torch

from ..prompt import Prompt
from ..rules import Verdict
from ..tree import Chain, DraftTree
from .base import Drafter


class NGramDrafter(Drafter):
    """Prompt-lookup drafter (as `transformers`' `prompt_lookup_num_tokens`, but batched and ragged).

    For each row, find the most recent earlier occurrence of the last n tokens (n from `max_ngram`
    down to `min_ngram`) in the prompt and generated text, and propose the tokens that followed it.
    Rows without a match propose nothing that step. Drafts carry no probabilities (one-hot q).
    """

    supports_skipped_steps = True  # `commit` reads the committed tokens; nothing depends on the proposal

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, search_window: int | None = None):
        if not (isinstance(min_ngram, int) and isinstance(max_ngram, int) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"max_ngram/min_ngram: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if search_window is not None and search_window < 1:
            raise ValueError(f"search_window: expected a positive int or None, got {search_window}")
        self.max_ngram, self.min_ngram, self.search_window = max_ngram, min_ngram, search_window

    def start(self, prompt: Prompt, features=None) -> None:
        input_ids, attention_mask = prompt.input_ids, prompt.attention_mask
        self.device = input_ids.device
        self.history = [ids[m.bool()].tolist() for ids, m in zip(input_ids.cpu(), attention_mask.cpu())]

    def _lookup(self, seq: list[int], k: int) -> list[int]:
        lo = 0 if self.search_window is None else max(0, len(seq) - self.search_window)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, lo - 1, -1):
                if seq[start:start + n] == tail:
                    return seq[start + n:start + n + k]
        return []

    def propose(self, roots, spec, sampling, generator=None):
        if not isinstance(spec, Chain):
            raise TypeError(f"tree: the n-gram drafter proposes chains only, got {type(spec).__name__}")
        k = spec.k
        drafts = [self._lookup(seq, k) for seq in self.history]
        tokens = torch.zeros(len(drafts), k, dtype=torch.long, device="cpu")  # laid out on the host, then one copy
        for b, d in enumerate(drafts):
            tokens[b, : len(d)] = torch.tensor(d, dtype=torch.long, device="cpu")
        lengths = torch.tensor([len(d) for d in drafts], dtype=torch.long, device="cpu")
        return DraftTree.chain(tokens.to(self.device), lengths.to(self.device))

    def commit(self, draft: DraftTree, verdict: Verdict, features=None) -> None:
        counts = (verdict.num_accepted + 1).tolist()
        for seq, toks, c in zip(self.history, verdict.tokens.tolist(), counts):
            seq.extend(toks[:c])

    def select(self, rows: torch.Tensor) -> None:
        self.history = [self.history[i] for i in rows.tolist()]
