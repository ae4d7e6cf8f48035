"""The zoo's state-space entries: byte-level Mamba-2, Bamba and Zamba2 targets trained on CPython's stdlib,
drafted by the stdlib-bytes Llama (same 256-byte vocabulary, same corpus) or by a small byte-level Mamba-2.
The Zamba2 pair's weights do not ship (the zoo's 100 MB are spent): `multispec zoo train stdlib-zamba2`
trains them here (about 15 minutes on two cores) and `zoo.load("stdlib-zamba2", weights=folder)` loads them.

    from multispec import zoo
    pair = zoo.load("stdlib-mamba2")                   # target, drafter, tokenizer
    zoo.load("stdlib-mamba2-ssm-draft").drafter        # the state-space draft model

Their shipped weights stay with the core's (`multispec.zoo.path(name)`); this module says how to build,
load and retrain them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (BambaConfig, BambaForCausalLM, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM,
                          PretrainedConfig, PreTrainedModel, Zamba2Config, Zamba2ForCausalLM)

from multispec import zoo
from multispec.plugin import ByteRecipe, ByteTokenizer, ModelDrafter, TRAINED_CONTEXT, ZooEntry, ZooPair, train_target

# The draft Llama of the SSM pairs attends to the last DRAFT_WINDOW bytes only: on the bench prompts it
# accepts as much as with its whole context, and its cost per step stops growing with the prompt
# (BENCHMARKS.md, state-space section).
DRAFT_WINDOW = 256


def mamba2_config() -> Mamba2Config:
    """The SSM zoo target: a byte-level Mamba-2, 8 layers, hidden 256 (3.5M parameters)."""
    return Mamba2Config(vocab_size=256, hidden_size=256, num_hidden_layers=8, num_heads=16, head_dim=32, expand=2,
                        state_size=32, n_groups=1, conv_kernel=4, chunk_size=64, tie_word_embeddings=False,
                        bos_token_id=None, eos_token_id=None, pad_token_id=0)


def mamba2_draft_config() -> Mamba2Config:
    """A state-space draft for the SSM zoo targets: a byte-level Mamba-2, 2 layers, hidden 128."""
    return Mamba2Config(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_heads=8, head_dim=32, expand=2,
                        state_size=32, n_groups=1, conv_kernel=4, chunk_size=64, tie_word_embeddings=False,
                        bos_token_id=None, eos_token_id=None, pad_token_id=0)


def bamba_config() -> BambaConfig:
    """The hybrid zoo target: the Mamba-2 above with layers 3 and 7 (of 8) full attention instead."""
    return BambaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=4, attn_layer_indices=[3, 7], mamba_n_heads=16,
                       mamba_d_head=32, mamba_n_groups=1, mamba_d_state=32, mamba_d_conv=4, mamba_chunk_size=64,
                       max_position_embeddings=TRAINED_CONTEXT, tie_word_embeddings=False, bos_token_id=None,
                       eos_token_id=None, pad_token_id=0)


def zamba2_config() -> Zamba2Config:
    """A second hybrid zoo target: Zamba2's layout at the Mamba-2 target's size, 8 Mamba-2 blocks of hidden 256,
    one shared transformer block (attention over [hidden, embeddings], RoPE, MLP, per-layer rank-8 adapters)
    before blocks 3 and 7."""
    kinds = ["hybrid" if i in (3, 7) else "mamba" for i in range(8)]
    return Zamba2Config(vocab_size=256, hidden_size=256, num_hidden_layers=8, layers_block_type=kinds,
                        num_attention_heads=8, num_key_value_heads=8, intermediate_size=512, n_mamba_heads=16,
                        mamba_headdim=32, mamba_ngroups=1, mamba_d_state=32, mamba_d_conv=4, chunk_size=64,
                        num_mem_blocks=1, use_shared_attention_adapter=True, adapter_rank=8, use_mem_rope=True,
                        max_position_embeddings=TRAINED_CONTEXT, tie_word_embeddings=False, bos_token_id=None,
                        eos_token_id=None, pad_token_id=0)


def _pair_loader(name: str, cls: type[PreTrainedModel]) -> Callable[[Path], ZooPair]:
    """A byte-level SSM (or hybrid) target drafted by the stdlib-bytes Llama (`ModelDrafter`)."""

    def load_pair(folder: Path) -> ZooPair:
        if not (folder / "target" / "config.json").exists():
            raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train {name}`")
        target = cls.from_pretrained(folder / "target", dtype=torch.float32).eval()
        draft = LlamaForCausalLM.from_pretrained(zoo.path("stdlib-bytes") / "target", dtype=torch.float32).eval()
        return ZooPair(target, ModelDrafter(draft, window=DRAFT_WINDOW), ByteTokenizer(), name)

    return load_pair


def _pair_trainer(config_fn: Callable[[], PretrainedConfig], cls: type[PreTrainedModel]) -> Callable[[Path], dict]:
    def train_pair(folder: Path) -> dict:
        config = config_fn()
        # Fewer steps than the Llama target: the SSMs' PyTorch scan trains slowly on a CPU.
        return {"target": train_target(folder / "target", ByteRecipe(steps=500, long_steps=150),
                                       make_model=lambda: cls(config), desc=config.model_type)}

    return train_pair


def _load_ssm_draft_pair(folder: Path) -> ZooPair:
    """The Mamba-2 zoo target drafted by a small byte-level Mamba-2 (a state-space draft model)."""
    if not (folder / "draft" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained draft; run `multispec zoo train stdlib-mamba2-ssm-draft`")
    target = Mamba2ForCausalLM.from_pretrained(zoo.path("stdlib-mamba2") / "target", dtype=torch.float32).eval()
    draft = Mamba2ForCausalLM.from_pretrained(folder / "draft", dtype=torch.float32).eval()
    return ZooPair(target, ModelDrafter(draft), ByteTokenizer(), "stdlib-mamba2-ssm-draft")


def _train_ssm_draft(folder: Path) -> dict:
    config = mamba2_draft_config()
    return {"draft": train_target(folder / "draft", ByteRecipe(steps=500, long_steps=150),
                                  make_model=lambda: Mamba2ForCausalLM(config), desc="mamba2 draft")}


def zoo_entries() -> list[ZooEntry]:
    """The SSM entries, in the order `multispec zoo list` shows them."""
    return [
        ZooEntry("stdlib-mamba2", "byte-level Mamba-2 (8 layers, hidden 256) trained on CPython's stdlib, drafted by "
                 "the stdlib-bytes Llama; the SSM pair (multispec.ssm)", None,
                 _pair_loader("stdlib-mamba2", Mamba2ForCausalLM), _pair_trainer(mamba2_config, Mamba2ForCausalLM)),
        ZooEntry("stdlib-bamba", "byte-level Bamba hybrid (6 Mamba-2 + 2 attention layers, hidden 256) trained on "
                 "CPython's stdlib, drafted by the stdlib-bytes Llama", None,
                 _pair_loader("stdlib-bamba", BambaForCausalLM), _pair_trainer(bamba_config, BambaForCausalLM)),
        ZooEntry("stdlib-zamba2", "byte-level Zamba2 hybrid (8 Mamba-2 blocks, a shared attention block before 2 of "
                 "them, hidden 256) trained on CPython's stdlib, drafted by the stdlib-bytes Llama; not shipped: "
                 "`multispec zoo train stdlib-zamba2`", None,
                 _pair_loader("stdlib-zamba2", Zamba2ForCausalLM), _pair_trainer(zamba2_config, Zamba2ForCausalLM)),
        ZooEntry("stdlib-mamba2-ssm-draft", "the stdlib-mamba2 target drafted by a byte-level Mamba-2 (2 layers, "
                 "hidden 128) trained on the same corpus: a state-space draft model", None, _load_ssm_draft_pair,
                 _train_ssm_draft),
    ]
