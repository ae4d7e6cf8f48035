"""Reasoning tab: a problem from the `arith-reasoning` test split (or your own question); the base model alone,
the small model alone, SpecReason and Speculative Thinking solve it in the same request, timed; the SpecReason
chain of steps is shown coloured by who wrote each (green: the small model's step, accepted; blue: the base
model's, with the small draft it rejected struck through), each with the base model's 0-9 score."""

from __future__ import annotations

import functools
import html

COLOURS = {"small": "#c8f7c5", "base": "#cfe3ff", "large": "#cfe3ff", "prompt": "#eee"}


@functools.cache
def _pair():
    from multispec.reasoning import load_pair

    return load_pair()


def default_threshold() -> float:
    from multispec.reasoning import Settings

    return Settings().threshold


def chain_html(steps) -> str:
    parts = []
    for s in steps:
        score = "" if s.score is None else f'<span style="color:#555;font-size:smaller"> [score {s.score:.1f}]</span>'
        rejected = ""
        if s.rejected is not None:
            rejected = (f'<div style="color:#b00;text-decoration:line-through;font-size:smaller">'
                        f"{html.escape(s.rejected.strip())}</div>")
        text = html.escape(s.text.replace("\x03", "").strip()) or "&nbsp;"
        parts.append(f'<div style="background:{COLOURS.get(s.author, "#fff")};padding:4px;margin:3px 0;'
                     f'border-radius:4px"><b>{s.author}</b>{score}{rejected}<div>{text}</div></div>')
    return "".join(parts)


def run(problem: int = 0, question: str = "", threshold: float | None = None):
    """Returns (results markdown, SpecReason chain HTML, Speculative Thinking chain HTML)."""
    from multispec.drafters import ModelDrafter
    from multispec.reasoning import SpecReason, SpecReasonConfig, SpeculativeThinking, Writer
    from multispec.reasoning.bench import zoo_thinking
    from multispec.reasoning.data import format_prompt, is_correct

    pair = _pair()
    if not isinstance(problem, int) or not 0 <= problem < len(pair.test):
        raise ValueError(f"problem: expected an index in [0, {len(pair.test)}) of the test split, got {problem!r}")
    threshold = default_threshold() if threshold is None else threshold
    if not 0 <= float(threshold) <= 10:
        raise ValueError(f"threshold: expected a score in [0, 10], got {threshold!r}")
    answer = None
    if question.strip():
        q = question.strip()
    else:
        q, answer = pair.test[problem].question, pair.test[problem].answer
    tok = pair.tokenizer
    prompt = tok.encode(format_prompt(q))
    rows = ["| method | time | vs base | answer | correct |", "| --- | --- | --- | --- | --- |"]
    results = {}
    for name, model in (("base alone", pair.target), ("small alone", pair.small)):
        import time

        t0 = time.perf_counter()
        writer = Writer.open(model, eos_token_id=tok.eos_token_id)
        writer.start(prompt)
        text = tok.decode(writer.write(320))
        results[name] = (text, time.perf_counter() - t0)
    sr = SpecReason(pair.small, pair.target, tok, "likelihood",
                    SpecReasonConfig(threshold=float(threshold), token_budget=320),
                    base_drafter=ModelDrafter(pair.small), base_tree=4).run(prompt)
    results["SpecReason"] = (sr.text, sr.seconds)
    st = SpeculativeThinking(pair.small, pair.target, tok, zoo_thinking(320),
                             large_drafter=ModelDrafter(pair.small), large_tree=4).run(prompt)
    results["Speculative Thinking"] = (st.text, st.seconds)
    base_s = results["base alone"][1]
    from multispec.reasoning import extract_answer

    for name, (text, seconds) in results.items():
        got = extract_answer(text)
        correct = "-" if answer is None else ("yes" if is_correct(text, answer) else "no")
        rows.append(f"| {name} | {seconds * 1e3:.0f} ms | {base_s / seconds:.2f}x | {got if got is not None else '-'} "
                    f"| {correct} |")
    summary = "\n".join(rows) + (f"\n\nSpecReason: {sr.counters['accepted']} small steps accepted, "
                                 f"{sr.counters['rejected']} rewritten by the base model.")
    return summary, chain_html(sr.steps), chain_html(st.steps)


def build() -> None:
    import gradio as gr

    gr.Markdown("Step-level speculation on the zoo's `arith-reasoning` pair (byte-level Llamas trained on synthetic "
                "step-by-step arithmetic: a 12-layer base and a small model). SpecReason: the small model "
                "writes each step, the base model scores it (its likelihood of the step, 0-9) and rewrites the steps "
                "scoring under the threshold. Speculative Thinking: the small model writes and the base takes over "
                "after reflective words (check, verify, wait, yes). Green: the small model's text; blue: the base's.")
    with gr.Row():
        problem = gr.Number(0, label="test problem #", precision=0)
        threshold = gr.Slider(0, 10, value=default_threshold(), step=0.5,
                              label="SpecReason threshold (10: every step is the base's)")
    question = gr.Textbox(label="or your own question (arithmetic in the training style)", lines=2)
    go = gr.Button("solve", variant="primary")
    table = gr.Markdown()
    with gr.Row():
        chain = gr.HTML(label="SpecReason")
        thinking = gr.HTML(label="Speculative Thinking")
    go.click(lambda p, q, t: run(int(p), q, float(t)), [problem, question, threshold], [table, chain, thinking])
