"""Run one prompt through plain decoding and several speculative methods, timed in the same request,
with the speculative steps traced for display. Shared by the demo tabs."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from multispec import DynamicTree, EngineConfig, StoppingConfig, speculative_generate, zoo
from multispec.trace import StepRecorder, render_steps_html


@dataclass
class MethodResult:
    name: str
    token_ids: list[int]
    text: str
    tokens: int
    seconds: float
    mean_accepted_length: float | None
    trace_html: str

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def compare(model, tokenizer, prompt: str, methods: dict[str, tuple[object, object, object]],
            max_new_tokens: int = 64, plain: Callable | None = None) -> list[MethodResult]:
    """`methods`: name -> (target, drafter, tree) for `speculative_generate`. The first row is plain
    greedy decoding (`plain(ids, n)`, default the model's own `generate`); every row decodes greedily
    with no EOS stop, so outputs are comparable token for token."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt: expected a non-empty string")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected a positive int, got {max_new_tokens!r}")
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    if plain is None:
        def plain(x, n):
            return model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
    n0 = ids.shape[1]
    t0 = time.perf_counter()
    seq = plain(ids, max_new_tokens)
    new = seq[0, n0:].tolist()
    results = [MethodResult("plain", new, tokenizer.decode(new), len(new),
                            time.perf_counter() - t0, None, "")]
    for name, (target, drafter, tree) in methods.items():
        rec = StepRecorder()
        t0 = time.perf_counter()
        out = speculative_generate(target, drafter, ids, max_new_tokens=max_new_tokens, tree=tree,
                                   engine=EngineConfig(on_step=rec), stopping=StoppingConfig.never())
        dt = time.perf_counter() - t0
        html = render_steps_html(rec.row(0), decode=lambda t: tokenizer.decode([t]))
        new = out.sequences[0, n0:n0 + out.num_new_tokens[0]].tolist()
        results.append(MethodResult(name, new, tokenizer.decode(new), len(new), dt, out.stats.mean_accepted_length,
                                    html))
    return results


def summary_markdown(results: list[MethodResult]) -> str:
    """A table: tokens/s, speedup over the plain row, mean accepted length, same output as plain."""
    base = results[0]
    rows = ["| method | tok/s | vs plain | accepted length | same output as plain |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        mal = "-" if r.mean_accepted_length is None else f"{r.mean_accepted_length:.2f}"
        rows.append(f"| {r.name} | {r.tokens_per_s:.1f} | {r.tokens_per_s / base.tokens_per_s:.2f}x | {mal} | "
                    f"{'yes' if r.token_ids == base.token_ids else 'NO'} |")
    return "\n".join(rows)


# pairs served from a user's own checkpoints (`multispec demo --target PATH`): name -> a loader returning an object
# with .target, .drafter and .tokenizer, as a zoo pair has
USER_PAIRS: dict[str, Callable] = {}


@functools.cache
def load_pair(pair: str):
    if pair in USER_PAIRS:
        return USER_PAIRS[pair]()
    return zoo.load(pair)


def run_tab(pairs: Sequence[str], methods: Callable, pair: str, prompt: str, max_new_tokens: int, chain_k: int,
            depth: int, topk: int, total: int) -> tuple[str, str, str, str]:
    """A tab's request: load the zoo pair (cached), compare plain decoding with `methods(target, drafter,
    chain_k, tree)`; returns (summary markdown, plain completion, second-to-last and last method's traces)."""
    if pair not in pairs:
        raise ValueError(f"pair: expected one of {list(pairs)}, got {pair!r}")
    p = load_pair(pair)
    tree = DynamicTree(int(depth), int(topk), int(total))
    results = compare(p.target, p.tokenizer, prompt, methods(p.target, p.drafter, int(chain_k), tree),
                      max_new_tokens=int(max_new_tokens))
    return summary_markdown(results), results[0].text, results[-2].trace_html, results[-1].trace_html


# what a bad request raises (an empty prompt, a problem number past the split, a missing extra): its message
# goes to the page; anything else is a bug and keeps Gradio's own report
INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, ImportError, KeyError, IndexError)


def shown(fn: Callable) -> Callable:
    """`fn` as a click handler whose input errors reach the page: raised as `gradio.Error` with the message
    (shown in the app, the server keeps serving) rather than Gradio's generic "error" badge. The signature
    is kept: `gradio_client` users see `fn`'s parameter names."""
    import functools

    @functools.wraps(fn)
    def handler(*args, **kwargs):
        import gradio as gr

        try:
            return fn(*args, **kwargs)
        except INPUT_ERRORS as err:
            raise gr.Error(str(err)) from err

    return handler


TABLE_LEGEND = (
    "*tok/s*: new tokens per second of this request; *vs plain*: that speed over plain decoding's; *accepted "
    "length*: tokens committed per target forward. A speculative row is slower than plain where its drafts are "
    "rejected often or the target is cheap next to the draft (the byte pairs on a CPU): each step pays a draft "
    "and a verification over several tokens, and gains only what is accepted. The first request after a pair "
    "loads runs cold (plain decoding runs first and pays the warm-up): send it twice to compare speeds.")


def build_tab(intro: str, pairs: Sequence[str], run: Callable, prompt: str, chain_k: int, tree: DynamicTree,
              trace_labels: tuple[str, str], api_name: str) -> None:
    """The shared tab layout, added to the enclosing `gr.Blocks` / `gr.Tab` context: pair, lengths and tree
    controls, a prompt, then the comparison table, the plain completion and two step traces; the button's
    endpoint is `/api_name`."""
    import gradio as gr

    gr.Markdown(intro + " In the traces, green nodes were accepted, red rejected, blue is the target's own "
                "next token.")
    with gr.Row():
        pair = gr.Dropdown(list(pairs), value=pairs[0], label="pair")
        max_new = gr.Slider(8, 256, value=64, step=8, label="new tokens")
        k = gr.Slider(1, 8, value=chain_k, step=1, label="chain length k")
    with gr.Row():
        depth = gr.Slider(1, 8, value=tree.depth, step=1, label="tree depth")
        topk = gr.Slider(1, 8, value=tree.topk, step=1, label="tree top-k")
        total = gr.Slider(1, 48, value=tree.total, step=1, label="tree nodes")
    text = gr.Textbox(prompt, lines=8, label="prompt")
    go = gr.Button("generate", variant="primary", elem_id=f"{api_name}-run")
    table = gr.Markdown(label="comparison", elem_id=f"{api_name}-table")
    gr.Markdown(TABLE_LEGEND)
    completion = gr.Textbox(lines=6, label="completion (plain decoding)")
    with gr.Row():
        with gr.Column():
            gr.Markdown(f"**{trace_labels[0]}**")
            first = gr.HTML(label=trace_labels[0])
        with gr.Column():
            gr.Markdown(f"**{trace_labels[1]}**")
            second = gr.HTML(label=trace_labels[1])
    go.click(shown(run), [pair, text, max_new, k, depth, topk, total], [table, completion, first, second],
             api_name=api_name)


def build_image_outputs(api_name: str, legend: str, gallery_label: str, grid_heading: str):
    """The image tabs' button and outputs, added to the enclosing tab: the button (`/api_name`), the comparison
    table with its legend, a gallery of the runs' images and the HTML grid of who wrote each token.
    Returns (button, table, gallery, grid)."""
    import gradio as gr

    go = gr.Button("generate", variant="primary", elem_id=f"{api_name}-run")
    table = gr.Markdown(label="comparison", elem_id=f"{api_name}-table")
    gr.Markdown(legend)
    gallery = gr.Gallery(label=gallery_label, columns=3, height="auto",
                         object_fit="contain")  # "cover" cropped the bottom of every digit
    gr.Markdown(grid_heading)
    grid = gr.HTML(label="token grid")
    return go, table, gallery, grid

