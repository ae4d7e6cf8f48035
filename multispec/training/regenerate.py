"""Self-distillation: the target writes (part of) the training text itself, as EAGLE's recipe does, so the
drafter learns the text and the features it will meet when drafting for this target.

- conversations: each assistant turn rewritten by the target from the turns before it;
- plain text: sequences continued by the target from the first `prompt_len` tokens of training chunks (added
  beside the human text, as the zoo's recipes do).
Greedy, in batches of left-padded prompts, with a progress bar.
"""

from __future__ import annotations

import random

import torch
from tqdm.auto import tqdm

from .data import Document, encode, render


def left_padded(prompts: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] ids and mask of prompts of different lengths, padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def continue_texts(target, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                   eos: int | list[int] | None, pad: int, desc: str) -> list[list[int]]:
    """The target's greedy continuation of each prompt (the prompt not included; cut after the first of the `eos`
    ids)."""
    stops = set([eos] if isinstance(eos, int) else eos or [])
    device = next(target.parameters()).device
    out = []
    for i in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch"):
        ids, mask = left_padded(prompts[i: i + batch_size], pad, device)
        seqs = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                               eos_token_id=eos, pad_token_id=pad)[:, ids.shape[1]:].tolist()
        for seq in seqs:
            end = next((i for i, t in enumerate(seq) if t in stops), None)
            out.append(seq if end is None else seq[: end + 1])
    return out


def regenerate_conversations(target, tokenizer, docs: list[Document], count: int, max_new_tokens: int,
                             batch_size: int = 8, eos: int | list[int] | None = None, pad: int = 0) -> list[Document]:
    """The first `count` conversations with every assistant turn written by the target, turn by turn."""
    chosen = [d for d in docs if d.messages][:count]
    replies: list[list[dict]] = [[] for _ in chosen]
    # turn k of every conversation at once: the prompt is everything before that assistant turn
    for k in range(max((sum(m["role"] == "assistant" for m in d.messages) for d in chosen), default=0)):
        todo, prompts = [], []
        for i, d in enumerate(chosen):
            turns = _before_assistant(d.messages, k, replies[i])
            if turns is not None:
                todo.append(i)
                prompts.append(encode(tokenizer, render(turns, tokenizer, add_generation_prompt=True)))
        texts = continue_texts(target, prompts, max_new_tokens, batch_size, eos, pad, f"self-distillation, turn {k + 1}")
        for i, ids in zip(todo, texts):
            replies[i].append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
    out = []
    for d, own in zip(chosen, replies):
        merged = _merge(d.messages, own)
        out.append(Document(encode(tokenizer, render(merged, tokenizer)), merged, d.source + " (regenerated)"))
    return out


def _before_assistant(messages: list[dict], k: int, written: list[dict]) -> list[dict] | None:
    """The turns before the k-th assistant turn, the earlier assistant turns replaced by the target's; None if
    the conversation has fewer than k + 1 assistant turns."""
    out, seen = [], 0
    for m in messages:
        if m["role"] == "assistant":
            if seen == k:
                return out
            out.append(written[seen])
            seen += 1
        else:
            out.append(m)
    return None


def _merge(messages: list[dict], written: list[dict]) -> list[dict]:
    it = iter(written)
    return [next(it) if m["role"] == "assistant" else m for m in messages]


def regenerate_text(target, sequences: list[list[int]], count: int, prompt_len: int, seq_len: int,
                    batch_size: int = 8, seed: int = 0, pad: int = 0) -> list[list[int]]:
    """`count` sequences of `seq_len` tokens: the first `prompt_len` tokens of randomly chosen training
    sequences, continued greedily by the target (no EOS: every one runs to its length)."""
    if not sequences or count <= 0:
        return []
    rng = random.Random(seed)
    picks = [sequences[rng.randrange(len(sequences))][:prompt_len] for _ in range(count)]
    written = continue_texts(target, picks, seq_len - prompt_len, batch_size, None, pad, "self-distillation")
    return [(p + w)[:seq_len] for p, w in zip(picks, written) if len(p) + len(w) >= seq_len]


__all__ = ["continue_texts", "left_padded", "regenerate_conversations", "regenerate_text"]
