"""The main job's pair: a deeper, wider byte-level Llama on the stdlib corpus, its EAGLE head, and the
`stdlib-bytes` target as its small draft model.

`stdlib-bytes`' target costs little more than its EAGLE head's forward, so speculation has little to save
there; this target costs ten head forwards or more (BENCHMARKS.md, "Text: stdlib-bytes-large pair";
`benchmarks/probes/cost_ratio.py`), the regime speculative decoding is for. On 2 CPU cores a forward this small is
mostly per-operation overhead, so its cost follows the number of layers rather than their width: the target is
deep (20 layers) and narrow (hidden 256, MLP 448; 11M parameters). It is shipped in int8
(`multispec.zoo.int8`) to stay inside the zoo's budget; the head is trained on the dequantized target, the
model every figure is measured on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .bytes_lm import TRAINED_CONTEXT, ByteRecipe, ByteTokenizer, eagle_train_config, train_target
from .int8 import load_int8, save_int8
from .train_eagle import HeadData, HeadShape, train_eagle


def large_target_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=448, num_hidden_layers=20,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TRAINED_CONTEXT,
                       tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)


def load_large_target(folder: str | Path) -> LlamaForCausalLM:
    return load_int8(LlamaForCausalLM, Path(folder) / "target")


def train_large(folder: str | Path) -> dict:
    """Train the target from scratch (same corpus, seed and token budget as `stdlib-bytes`' target), store it
    in int8, then train the EAGLE head on the dequantized target."""
    folder = Path(folder)
    fp16 = folder / "target-fp16"
    report = {"target": train_target(fp16, ByteRecipe(lr=2e-3),
                                     make_model=lambda: LlamaForCausalLM(large_target_config()),
                                     desc="large byte target")}
    save_int8(LlamaForCausalLM.from_pretrained(fp16, dtype=torch.float32), folder / "target")
    shutil.copy(fp16 / "training_report.json", folder / "target" / "training_report.json")
    target = load_large_target(folder)
    report["eagle"] = train_eagle(target, ByteTokenizer().encode, folder / "eagle",
                                  shape=HeadShape(draft_vocab=256, intermediate_size=704, num_heads=4, kv_heads=2,
                                                  sliding_window=128),
                                  data=HeadData(train_chars=600_000, vocab_chars=100_000, generated=256),
                                  train=eagle_train_config(), int8=True)
    return report
