"""The fully local zoo pair: a byte-level Llama trained on stdlib source, and an EAGLE head for it.

Bytes need no tokenizer files, so the pair loads anywhere; it is small enough for the test suite.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..drafters.eagle_train import EagleTrainConfig, chunk_tokens
from .data import corpus_text
from .training import train_steps


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    # `add_special_tokens` / `skip_special_tokens`: accepted as `transformers`' tokenizers take them (the chat
    # code passes them); bytes have no special tokens
    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __call__(self, text: str, return_tensors: str | None = None, add_special_tokens: bool = True):
        ids = self.encode(text)
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}


# The target is trained on sequences this long; beyond it its hidden states (and text) degrade, and so
# would any drafter reading them. Bench prompts (1200 bytes + new tokens) stay inside it.
TRAINED_CONTEXT = 1536


def target_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=256, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                       num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=TRAINED_CONTEXT,
                       tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)


@dataclass(frozen=True)
class ByteRecipe:
    """A byte target's training run: `steps` on chunks of `seq_len` learn the language cheaply; the last
    `long_steps` on chunks of `TRAINED_CONTEXT` teach it long positions (without them its text degrades past
    `seq_len`); `chars` of training text, AdamW at `lr` with warm-up and cosine decay, seeded by `seed`."""

    steps: int = 800
    seq_len: int = 256
    batch_size: int = 8
    long_steps: int = 300
    long_batch_size: int = 2
    lr: float = 3e-3
    chars: int = 3_000_000
    seed: int = 0


def train_target(out_dir: str | Path, recipe: ByteRecipe = ByteRecipe(), make_model=None,
                 desc: str = "byte target") -> dict:
    """Train a byte-level target from scratch by `recipe` and save it as a `transformers` checkpoint:
    `make_model()` builds the fresh causal LM of vocabulary 256 (after seeding; default the Llama of
    `target_config`)."""
    steps, seq_len, batch_size, seed = recipe.steps, recipe.seq_len, recipe.batch_size, recipe.seed
    long_steps, long_batch_size, lr, chars = recipe.long_steps, recipe.long_batch_size, recipe.lr, recipe.chars
    torch.manual_seed(seed)
    rng = random.Random(seed)
    start = time.time()
    ids = torch.tensor(ByteTokenizer().encode(corpus_text("train", max_chars=chars, seed=seed)), dtype=torch.long)
    short = torch.stack(chunk_tokens(ids, seq_len + 1))
    long = torch.stack(chunk_tokens(ids, TRAINED_CONTEXT))
    model = make_model() if make_model is not None else LlamaForCausalLM(target_config())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm, total = 50, steps + long_steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm))))
    def next_batch(step: int) -> dict:
        chunks, bs = (short, batch_size) if step < steps else (long, long_batch_size)
        batch = chunks[torch.tensor([rng.randrange(len(chunks)) for _ in range(bs)])]
        return dict(input_ids=batch, labels=batch)  # the model shifts labels itself

    losses = train_steps(model, next_batch, total, (opt, sched), desc)
    model.eval()
    out_dir = Path(out_dir)
    model.to(torch.float16).save_pretrained(out_dir)
    report = {"steps": steps, "long_steps": long_steps,
              "tokens": steps * batch_size * seq_len + long_steps * long_batch_size * TRAINED_CONTEXT, "final_loss": sum(losses[-50:]) / 50,
              "seconds": round(time.time() - start)}
    (out_dir / "training_report.json").write_text(json.dumps(report, indent=2))
    return report


def eagle_train_config() -> EagleTrainConfig:
    return EagleTrainConfig(seq_len=256, batch_size=16, epochs=4, lr=2e-3, warmup_steps=20, feature_batch=16)
