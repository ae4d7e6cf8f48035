"""The model zoo: named target/draft pairs, their shipped weights, and how to retrain them.

    from multispec import zoo
    pair = zoo.load("stdlib-bytes")          # target, drafter, tokenizer
    zoo.names(); zoo.path("gemma3-270m-eagle")

CLI: `multispec zoo list | path NAME | train NAME [--out DIR]`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import LlamaForCausalLM

from ..draft_length import StepProfile
from ..drafters.eagle import EagleDrafter, EagleHead
from ..drafters.recycling import tree_from_text
from ..tree import DynamicTree, StaticTree
from ..targets import load_adapter_plugins
from .bytes_large import load_large_target, train_large
from .bytes_lm import ByteTokenizer, eagle_train_config, train_target
from .gemma import load_gemma
from .gemma_recipe import train_gemma_eagle
from .train_eagle import HeadData, HeadShape, train_eagle

WEIGHTS = Path(__file__).parent / "weights"


@dataclass
class ZooPair:
    target: Any  # a transformers causal LM
    drafter: Any  # a multispec Drafter
    tokenizer: Any  # callable(text, return_tensors="pt") and .decode(ids)
    name: str
    draft_model: Any = None  # a small causal LM of the same tokenizer (a `ModelDrafter`, assisted generation)
    # the drafter's chain length and dynamic tree chosen for this pair on the validation split
    # (`draft_shape.json` beside its weights, written by `multispec zoo tune`); None: not chosen
    chain_k: int | None = None
    tree: DynamicTree | None = None
    # what each candidate chain length drafted and committed on the validation split (same file), so that a
    # benchmark can choose the length for the machine it runs on (`multispec.draft_length`); None: not profiled
    step_profiles: list[StepProfile] | None = None
    # the drafter those profiles ran ("eagle" or "ngram"): the row a calibrated bench pads
    profiled_drafter: str | None = None
    # Token Recycling's static tree chosen for this pair on the validation split (same file, written by
    # `multispec zoo tune --what recycling`); None: not chosen (the bench uses `cpu_tree()`)
    recycling_tree: StaticTree | None = None
    # prompt lookup for chat, (chain length, shortest n-gram), chosen on the chat set's validation split (same file,
    # written by `multispec zoo tune --what chat-lookup`); None: not chosen (`eval chat` has no such row)
    chat_lookup: tuple[int, int] | None = None
    # the same for eval chat's sampled table (`zoo tune --what chat-lookup --sampled`): (chain length or "auto",
    # shortest n-gram); None: not chosen (the sampled table runs the greedy choice)
    chat_lookup_sampled: tuple[int | str, int] | None = None


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    requires: str | None  # the pip extra it needs beyond the base install, if any
    loader: Callable[[Path], ZooPair]
    trainer: Callable[[Path], dict]


def _load_bytes(folder: Path) -> ZooPair:
    if not (folder / "target" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train stdlib-bytes`")
    target = LlamaForCausalLM.from_pretrained(folder / "target", dtype=torch.float32).eval()
    return ZooPair(target, EagleDrafter(EagleHead.load(folder / "eagle"), target), ByteTokenizer(), "stdlib-bytes")


def _train_bytes(folder: Path) -> dict:
    report = {"target": train_target(folder / "target")}
    target = LlamaForCausalLM.from_pretrained(folder / "target", dtype=torch.float32).eval()
    report["eagle"] = train_eagle(target, ByteTokenizer().encode, folder / "eagle",
                                  shape=HeadShape(draft_vocab=256, intermediate_size=512, num_heads=4, kv_heads=2,
                                                  sliding_window=128),
                                  data=HeadData(train_chars=600_000, vocab_chars=100_000, generated=256),
                                  train=eagle_train_config())
    return report


def _load_bytes_large(folder: Path) -> ZooPair:
    if not (folder / "target" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train stdlib-bytes-large`")
    target = load_large_target(folder)
    draft = _load_bytes(WEIGHTS / "stdlib-bytes").target  # the small pair's target: same bytes, same corpus
    return ZooPair(target, EagleDrafter(EagleHead.load(folder / "eagle"), target), ByteTokenizer(),
                   "stdlib-bytes-large", draft_model=draft, **_draft_shape(folder))


def _draft_shape(folder: Path) -> dict:
    """`chain_k`, `tree`, `step_profiles` (and their `profiled_drafter`), `recycling_tree`, `chat_lookup` and
    `chat_lookup_sampled` from the pair's `draft_shape.json`, if it has one."""
    file = folder / "draft_shape.json"
    if not file.exists():
        return {}
    shape = json.loads(file.read_text())
    # a file written by a chat-lookup tuning alone has no chain length
    out = {"chain_k": int(shape["chain_k"])} if shape.get("chain_k") is not None else {}
    if shape.get("profiles"):
        out["step_profiles"] = [StepProfile.from_json(p) for p in shape["profiles"]]
        out["profiled_drafter"] = shape.get("profiled_drafter", "eagle")  # files before the field: EAGLE's
    if shape.get("tree"):  # a choice may fix the chain length only
        depth, topk, total = (int(x) for x in shape["tree"].split("/"))
        out["tree"] = DynamicTree(depth=depth, topk=topk, total=total)
    if shape.get("recycling_tree"):
        out["recycling_tree"] = tree_from_text(shape["recycling_tree"])
    if shape.get("chat_lookup"):
        out["chat_lookup"] = (int(shape["chat_lookup"]["chain_k"]), int(shape["chat_lookup"]["min_ngram"]))
    if shape.get("chat_lookup_sampled"):
        k = shape["chat_lookup_sampled"]["chain_k"]
        out["chat_lookup_sampled"] = (k if k == "auto" else int(k), int(shape["chat_lookup_sampled"]["min_ngram"]))
    return out


def _load_gemma(folder: Path) -> ZooPair:
    if not (folder / "eagle_config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained head; run `multispec zoo train gemma3-270m-eagle`")
    target, tokenizer = load_gemma()
    return ZooPair(target, EagleDrafter(EagleHead.load(folder), target), tokenizer, "gemma3-270m-eagle",
                   **_draft_shape(folder))


def _train_gemma(folder: Path) -> dict:
    target, tokenizer = load_gemma()
    return train_gemma_eagle(target, tokenizer, folder)


ENTRIES: dict[str, ZooEntry] = {
    e.name: e for e in [
        ZooEntry("stdlib-bytes", "byte-level Llama (4 layers, 1.7M params) trained on CPython's stdlib + EAGLE head; "
                 "fully local, used by the tests", None, _load_bytes, _train_bytes),
        ZooEntry("stdlib-bytes-large", "byte-level Llama (20 layers, hidden 256, 11M params, int8) trained on "
                 "CPython's stdlib + EAGLE head; stdlib-bytes' target as its draft model; the README's first "
                 "command", None, _load_bytes_large, train_large),
        ZooEntry("gemma3-270m-eagle", "Gemma 3 270M (GGUF from PyPI, dequantized to fp32) + EAGLE head with an "
                 "8192-token draft vocabulary, trained on CPython's stdlib", "gemma", _load_gemma, _train_gemma),
    ]
}


def register_entry(new: ZooEntry) -> None:
    """Add a modality's pair (its package calls this when imported; see `multispec.adapters`). The entry's
    weights ship under `path(name)`, with the core's."""
    ENTRIES[new.name] = new


def names() -> list[str]:
    load_adapter_plugins()
    return list(ENTRIES)


def entry(name: str) -> ZooEntry:
    load_adapter_plugins()
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
    folder = Path(out) if out is not None else Path(os.environ.get("MULTISPEC_CACHE", Path.home() / ".cache" /
                                                                    "multispec")) / "zoo" / name
    folder.mkdir(parents=True, exist_ok=True)
    return entry(name).trainer(folder)
