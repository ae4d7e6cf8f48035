"""Vision tab: ask the zoo VLM about a chart, shapes or a table (a procedural sample or your own image);
plain decoding and each VLM drafter (plain EAGLE, ViSpec, SpecVLM) answer in the same request, timed, with
the answer's tokens coloured by how they came: accepted drafts green, the target's own token blue."""

from __future__ import annotations

import functools
import html
import random
import time

from multispec import DynamicTree, EngineConfig, StoppingConfig, speculative_generate, zoo
from multispec.trace import StepRecorder
from multispec.vision.vqa_synth import KINDS, generate_vqa
from multispec.vision.zoo_pair import NAME, load_drafters
from multispec.vision.zoo_vlm import EOS, PAD

from .compare import shown as shown_errors

DRAFTERS = ("eagle", "vispec", "specvlm")


@functools.cache
def _pair():
    pair = zoo.load(NAME)
    return pair.target, pair.tokenizer, load_drafters(pair.target)


def sample(kind: str = "bar", seed: int | None = None):
    """(image, question) from the procedural generator; a random long-answer question when seed is None."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    s = generate_vqa(1, seed=random.randrange(10**6) if seed is None else int(seed), kinds=(kind,),
                     long_fraction=1.0)[0]
    return s.image, s.question


def highlight(steps, decode) -> str:
    """The answer as HTML: tokens from accepted drafts green, each step's correction/bonus token blue."""
    parts = []
    for st in steps:
        for i, tok in enumerate(st.emitted):
            colour = "#c8f7c5" if i < len(st.accepted) else "#cfe3ff"
            parts.append(f'<span style="background:{colour}">{html.escape(decode([tok]))}</span>')
    return '<div style="font-family:monospace;white-space:pre-wrap">' + "".join(parts) + "</div>"


def run(image, question: str, max_new_tokens: int = 160, chain_k: int = 8, depth: int = 8, topk: int = 2,
        total: int = 16) -> tuple[str, str, str]:
    """Returns (summary markdown, plain answer, highlighted answer of the fastest drafter)."""
    if image is None:
        raise ValueError("image: pick a sample or upload an image")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question: expected a non-empty string")
    if not isinstance(max_new_tokens, (int, float)) or int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens: expected a positive int, got {max_new_tokens!r}")
    model, processor, drafters = _pair()
    inputs = processor(image, question)
    n0, n = inputs["input_ids"].shape[1], int(max_new_tokens)
    stop = dict(eos_token_id=EOS, pad_token_id=PAD)
    t0 = time.perf_counter()
    plain = model.generate(**inputs, max_new_tokens=n, do_sample=False, **stop)[0, n0:].tolist()
    plain_s = time.perf_counter() - t0
    plain = plain[:plain.index(EOS) + 1] if EOS in plain else plain
    rows = ["| method | tok/s | vs plain | accepted length | same answer as plain |",
            "| --- | --- | --- | --- | --- |", f"| plain | {len(plain) / plain_s:.1f} | 1.00x | - | - |"]
    best = None
    tree = DynamicTree(int(depth), int(topk), int(total))
    for name, drafter in drafters.items():
        for label, spec in ((f"chain k={int(chain_k)}", int(chain_k)), (f"tree {tree.depth}/{tree.topk}/{tree.total}", tree)):
            rec = StepRecorder()
            t0 = time.perf_counter()
            out = speculative_generate(model, drafter, max_new_tokens=n, tree=spec, engine=EngineConfig(on_step=rec),
                                       stopping=StoppingConfig(**stop), **inputs)
            secs = time.perf_counter() - t0
            new = out.sequences[0, n0:n0 + out.num_new_tokens[0]].tolist()
            speed = len(new) / secs
            same = "yes" if new == plain else "NO"
            rows.append(f"| {name} {label} | {speed:.1f} | {speed / (len(plain) / plain_s):.2f}x | "
                        f"{out.stats.mean_accepted_length:.2f} | {same} |")
            if best is None or speed > best[0]:
                best = (speed, f"{name} {label}", rec.row(0))
    answer = processor.decode([t for t in plain if t != EOS])
    shown = f"<p>{best[1]} (fastest)</p>" + highlight(best[2], lambda ids: processor.decode([t for t in ids if t != EOS]))
    return "\n".join(rows), answer, shown


def build() -> None:
    import gradio as gr

    gr.Markdown("Ask the zoo VLM (a Llava with a SigLIP tower, trained here on procedural charts, shapes and "
                "tables) about an image. Every row decodes greedily and stops at end of answer; speeds are "
                "measured in this request. Green: tokens the target accepted from the draft; blue: its own.")
    first_image, first_question = sample("bar", seed=0)
    with gr.Row():
        image = gr.Image(first_image, type="pil", label="image (64x64 is what the model sees)", height=256)
        with gr.Column():
            kind = gr.Dropdown(list(KINDS), value="bar", label="procedural sample")
            new = gr.Button("new sample", elem_id="vision_sample-run")
            question = gr.Textbox(first_question, label="question")
            max_new = gr.Slider(8, 256, value=160, step=8, label="new tokens at most", elem_id="vision-max-new")
            k = gr.Slider(1, 12, value=8, step=1, label="chain length k")
    go = gr.Button("answer", variant="primary", elem_id="vision-run")
    table = gr.Markdown(label="comparison", elem_id="vision-table")
    answer = gr.Textbox(label="answer (plain decoding)")
    gr.Markdown("**the EAGLE chain's answer** (green: accepted drafts, blue: the target's own tokens)")
    shown = gr.HTML(label="accepted tokens")
    new.click(shown_errors(sample), [kind], [image, question], api_name="vision_sample")
    go.click(shown_errors(answer_question), [image, question, max_new, k], [table, answer, shown],
             api_name="vision")


def answer_question(image, question: str, max_new_tokens: float, chain_k: float):
    """The button's endpoint (`/vision`)."""
    return run(image, question, int(max_new_tokens), int(chain_k))
