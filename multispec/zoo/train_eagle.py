"""Train an EAGLE head for a target on the stdlib corpus (used by `multispec zoo train`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..drafters.eagle import EagleConfig, EagleHead
from ..drafters.eagle_train import EagleTrainConfig, EagleTrainer, chunk_tokens, top_token_map
from .data import corpus_text


@torch.no_grad()
def self_generated_chunks(target, chunks: list[torch.Tensor], count: int, prompt_len: int, seq_len: int,
                          batch_size: int = 32, seed: int = 0) -> list[torch.Tensor]:
    """Greedy continuations by the target of `count` training-text prompts, each `seq_len` tokens long.

    The drafter meets the target's own outputs at inference, whose features differ from those of human
    text; training on both (as ViSpec's stage 2 does with regenerated answers) keeps it accurate there."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(chunks), (count,), generator=g).tolist()
    out = []
    for i in tqdm(range(0, count, batch_size), desc="self-generated data", unit="batch"):
        prompts = torch.stack([chunks[j][:prompt_len] for j in picks[i:i + batch_size]])
        seqs = target.generate(prompts, max_new_tokens=seq_len - prompt_len, do_sample=False,
                               pad_token_id=0, eos_token_id=None)
        out += list(seqs[:, :seq_len])
    return out


@dataclass(frozen=True)
class HeadShape:
    """A zoo EAGLE head's shape: a draft vocabulary of the `draft_vocab` most frequent training tokens, its FFN
    width, attention heads and key/value heads, and the attention's sliding window (None: full)."""

    draft_vocab: int
    intermediate_size: int
    num_heads: int
    kv_heads: int
    sliding_window: int | None = None


@dataclass(frozen=True)
class HeadData:
    """A zoo EAGLE head's data: `train_chars` of stdlib text to train on, `vocab_chars` to choose the draft
    vocabulary from, and `generated` chunks of the target's own greedy continuations."""

    train_chars: int
    vocab_chars: int
    generated: int = 0


def train_eagle(target, encode, out_dir: str | Path, *, shape: HeadShape, data: HeadData, train: EagleTrainConfig,
                seed: int = 0, int8: bool = False) -> dict:
    """Tokenize stdlib text with `encode(str) -> list[int]`, add the self-generated chunks, train a head, save
    it with a report (`int8`: stored in int8, see `EagleHead.save`)."""
    train_chars, vocab_chars, generated = data.train_chars, data.vocab_chars, data.generated
    draft_vocab, sliding_window = shape.draft_vocab, shape.sliding_window
    torch.manual_seed(seed)
    start = time.time()
    vocab_size = target.get_output_embeddings().weight.shape[0]
    hidden = target.get_output_embeddings().weight.shape[1]
    vocab_ids = torch.tensor(encode(corpus_text("train", max_chars=vocab_chars, seed=seed)), dtype=torch.long)
    d2t = top_token_map([vocab_ids], draft_vocab, vocab_size)
    coverage = torch.isin(vocab_ids, d2t).float().mean().item()
    ids = torch.tensor(encode(corpus_text("train", max_chars=train_chars, seed=seed + 1)), dtype=torch.long)
    chunks = chunk_tokens(ids, train.seq_len)
    if generated:
        chunks += self_generated_chunks(target, chunks, generated, prompt_len=64, seq_len=train.seq_len, seed=seed)
    config = EagleConfig(hidden_size=hidden, draft_vocab_size=len(d2t), target_vocab_size=vocab_size,
                         intermediate_size=shape.intermediate_size, num_attention_heads=shape.num_heads,
                         num_key_value_heads=shape.kv_heads, sliding_window=sliding_window)
    head = EagleHead(config, d2t)
    history = EagleTrainer(target, head, train).fit(chunks)
    head.save(out_dir, int8=int8)
    report = {"train_tokens": int(len(chunks) * train.seq_len), "self_generated_chunks": generated,
              "draft_vocab": len(d2t),
              "draft_vocab_coverage": round(coverage, 4), "epochs": train.epochs, "seconds": round(time.time() - start),
              "history": history, "train_config": train.__dict__}
    Path(out_dir, "training_report.json").write_text(json.dumps(report, indent=2))
    return report
