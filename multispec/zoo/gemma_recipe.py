"""The training recipe of the `gemma3-270m-eagle` zoo head (fixed seeds; about 25 minutes on 2 CPU cores)."""

from __future__ import annotations

from pathlib import Path

from ..drafters.eagle_train import EagleTrainConfig
from .train_eagle import HeadData, HeadShape, train_eagle

TRAIN_CHARS = 560_000  # about 150k Gemma tokens of stdlib source
RECIPE = EagleTrainConfig(seq_len=256, batch_size=8, epochs=6, lr=1e-3, warmup_steps=20, feature_batch=4)


def train_gemma_eagle(target, tokenizer, out_dir: str | Path) -> dict:
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    return train_eagle(target, encode, out_dir,
                       shape=HeadShape(draft_vocab=8192, intermediate_size=1536, num_heads=8, kv_heads=2,
                                       sliding_window=128),
                       data=HeadData(train_chars=TRAIN_CHARS, vocab_chars=3_000_000), train=RECIPE,
                       int8=True)  # int8: the zoo's budget
