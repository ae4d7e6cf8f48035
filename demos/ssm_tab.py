"""SSM tab: code completion with a state-space zoo target, plain decoding vs chain speculation (state
replay and closed-form commit) vs STree, each timed in the same request, with the drafted trees and the
accepted paths shown step by step."""

from __future__ import annotations

import functools

from multispec import DynamicTree, zoo
from multispec.ssm import BambaTarget, Mamba2Target, MambaTarget
from multispec.zoo.data import read_source, stdlib_files

from .compare import compare, summary_markdown

PAIRS = ["stdlib-mamba2", "stdlib-bamba"]


def default_prompt() -> str:
    return read_source(stdlib_files("heldout")[1])[:400]


@functools.cache
def load(pair: str):
    if pair not in PAIRS:
        raise ValueError(f"pair: expected one of {PAIRS}, got {pair!r}")
    return zoo.load(pair)


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
    p = load(pair)
    results = compare(p.target, p.tokenizer, prompt,
                      methods(p.target, p.drafter, int(chain_k), DynamicTree(int(depth), int(topk), int(total))),
                      max_new_tokens=int(max_new_tokens))
    return summary_markdown(results), results[0].text, results[-2].trace_html, results[-1].trace_html


def build() -> None:
    """Adds the tab's components to the enclosing `gr.Blocks` / `gr.Tab` context."""
    import gradio as gr

    gr.Markdown("Code completion with a byte-level SSM target trained on CPython's stdlib, drafted by the "
                "byte Llama. Every row decodes greedily; speeds are measured in this request. In the traces, "
                "green nodes were accepted, red rejected, blue is the target's own next token.")
    with gr.Row():
        pair = gr.Dropdown(PAIRS, value=PAIRS[0], label="target")
        max_new = gr.Slider(8, 256, value=64, step=8, label="new tokens")
        chain_k = gr.Slider(1, 8, value=4, step=1, label="chain length k")
    with gr.Row():
        depth = gr.Slider(1, 8, value=5, step=1, label="tree depth")
        topk = gr.Slider(1, 6, value=3, step=1, label="tree top-k")
        total = gr.Slider(1, 48, value=12, step=1, label="tree nodes")
    prompt = gr.Textbox(default_prompt(), lines=8, label="prompt")
    go = gr.Button("generate", variant="primary")
    table = gr.Markdown()
    completion = gr.Textbox(lines=6, label="completion (plain decoding)")
    with gr.Row():
        chain_trace = gr.HTML(label="chain steps")
        tree_trace = gr.HTML(label="STree steps")
    go.click(run, [pair, prompt, max_new, chain_k, depth, topk, total],
             [table, completion, chain_trace, tree_trace])
