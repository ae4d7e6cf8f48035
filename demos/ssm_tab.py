"""SSM tab: code completion with a state-space zoo target, plain decoding vs chain speculation (state
replay and closed-form commit) vs STree, each timed in the same request, with the drafted trees and the
accepted paths shown step by step."""

from __future__ import annotations

from multispec import DynamicTree
from multispec.ssm import BambaTarget, Mamba2Target, MambaTarget
from multispec.zoo.data import read_source, stdlib_files

from .compare import build_tab, run_tab

PAIRS = ["stdlib-mamba2", "stdlib-bamba"]


def default_prompt() -> str:
    return read_source(stdlib_files("heldout")[1])[:400]


def methods(model, drafter, chain_k: int, tree: DynamicTree) -> dict:
    kind = model.config.model_type
    if kind == "bamba":
        return {f"chain k={chain_k}": (BambaTarget(model), drafter, chain_k),
                f"STree {tree.depth}/{tree.topk}/{tree.total}": (BambaTarget(model), drafter, tree)}
    cls = {"mamba2": Mamba2Target, "mamba": MambaTarget}[kind]
    return {f"chain k={chain_k}, state replay": (cls(model, replay=True), drafter, chain_k),
            f"chain k={chain_k}, closed-form commit": (cls(model), drafter, chain_k),
            f"STree {tree.depth}/{tree.topk}/{tree.total}": (cls(model), drafter, tree)}


def run(pair: str, prompt: str, max_new_tokens: int = 64, chain_k: int = 4, depth: int = 5, topk: int = 3,
        total: int = 12):
    """Returns (summary markdown, plain completion, chain trace html, STree trace html)."""
    return run_tab(PAIRS, methods, pair, prompt, max_new_tokens, chain_k, depth, topk, total)


def build() -> None:
    build_tab("Code completion with a byte-level SSM target trained on CPython's stdlib, drafted by the byte "
              "Llama. Every row decodes greedily; speeds are measured in this request.",
              PAIRS, run, default_prompt(), chain_k=4, tree=DynamicTree(5, 3, 14),
              trace_labels=("chain steps", "STree steps"), api_name="ssm")
