"""Reasoning tab: a problem from the `arith-reasoning` test split (or your own question); the base model alone,
the small model alone, SpecReason and Speculative Thinking solve it in the same request, timed; the SpecReason
chain of steps is shown coloured by who wrote each (green: the small model's step, accepted; blue: the base
model's, with the small draft it rejected struck through), each with the base model's 0-9 score. Below it,
judge decoding at token level: the styled drafter (which phrases steps its own way) drafts, exact decoding and
the judge verify, and the judge's solution is shown token by token coloured by who chose each."""

from __future__ import annotations

import functools
import html
import time

import torch

from multispec import EngineConfig, StoppingConfig, speculative_generate
from multispec.drafters import ModelDrafter
from multispec.reasoning import (Settings, SpecReason, SpecReasonConfig, SpeculativeThinking, Writer, extract_answer,
                                 load_pair)
from multispec.reasoning.bench import zoo_thinking
from multispec.reasoning.data import format_prompt, is_correct
from multispec.rules import Judge, JudgeHead

from .compare import shown

COLOURS = {"small": "#c8f7c5", "base": "#cfe3ff", "large": "#cfe3ff", "prompt": "#eee"}
# judge decoding's tokens: a draft the base would have chosen too, a draft only the judge approved, the base's own
TOKEN_COLOURS = {"exact": "#c8f7c5", "judge": "#ffd59e", "base": "#cfe3ff"}


@functools.cache
def _pair():
    return load_pair()


def default_threshold() -> float:
    return Settings().likelihood_threshold


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


def thinking_html(steps) -> str:
    """Speculative Thinking's text as runs by one author: its segments (look-ahead, paragraph, takeover) end
    where a token budget ends, often mid-word, so consecutive segments by the same model are joined first."""
    runs: list[tuple[str, list[str], str]] = []  # (author, segment kinds, text)
    for s in steps:
        text = s.text.replace("\x03", "")
        if runs and runs[-1][0] == s.author:
            author, kinds, joined = runs[-1]
            runs[-1] = (author, kinds + [s.kind], joined + text)
        else:
            runs.append((s.author, [s.kind], text))
    parts = []
    for author, kinds, text in runs:
        kinds_shown = ", ".join(dict.fromkeys(kinds))
        parts.append(f'<div style="background:{COLOURS.get(author, "#fff")};padding:4px;margin:3px 0;'
                     f'border-radius:4px"><b>{author}</b><span style="color:#555;font-size:smaller"> [{kinds_shown}]'
                     f'</span><div style="white-space:pre-wrap">{html.escape(text.strip()) or "&nbsp;"}</div></div>')
    return "".join(parts)


class TokenAuthors:
    """`on_step` callback: row 0's committed tokens, each labelled "exact" (an accepted draft the base would have
    chosen), "judge" (an accepted draft only the judge approved) or "base" (the correction / bonus token)."""

    def __init__(self) -> None:
        self.tokens: list[tuple[int, str]] = []

    def __call__(self, draft, verdict, rows) -> None:
        if 0 not in rows:
            return
        i = rows.index(0)
        n = int(verdict.num_accepted[i])
        judged = getattr(verdict, "overridden", None)
        for j, t in enumerate(verdict.tokens[i, : n + 1].tolist()):
            author = "base" if j == n else ("judge" if judged is not None and bool(judged[i, j]) else "exact")
            self.tokens.append((t, author))


def tokens_html(tokens: list[tuple[int, str]], decode) -> str:
    spans = "".join(f'<span style="background:{TOKEN_COLOURS[a]}">{html.escape(decode([t]).replace(chr(3), ""))}'
                    f"</span>" for t, a in tokens)
    return f'<div style="font-family:monospace;white-space:pre-wrap">{spans}</div>'


def _problem(pair, problem: int, question: str):
    """(question, reference answer or None) of a test problem index or a question of one's own."""
    if not isinstance(problem, int) or not 0 <= problem < len(pair.test):
        raise ValueError(f"problem: expected an index in [0, {len(pair.test)}) of the test split, got {problem!r}")
    if question.strip():
        return question.strip(), None
    return pair.test[problem].question, pair.test[problem].answer


def _number(x: float | None) -> str:
    """An answer as a person writes it: 42, not 42.0."""
    if x is None:
        return "-"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _heading(question: str, answer: float | None) -> str:
    reference = "none (your own question)" if answer is None else _number(answer)
    return f"**Question:** {html.escape(question)}  \n**Reference answer:** {reference}\n\n"


def run_judge(problem: int = 0, question: str = "", judge_threshold: float | None = None):
    """Token-level judge decoding with the styled drafter (chain of 4) beside exact decoding with it.
    Returns (results markdown, the judge's solution HTML coloured by who chose each token)."""
    pair = _pair()
    if pair.styled is None or pair.styled_judge is None:
        raise ValueError(f"the pair in {pair.folder} has no styled drafter and judge; retrain it")
    settings = Settings()
    judge_threshold = settings.judge_threshold if judge_threshold is None else judge_threshold
    if not 0 <= float(judge_threshold) <= 1:
        raise ValueError(f"judge_threshold: expected a probability in [0, 1], got {judge_threshold!r}")
    q, answer = _problem(pair, problem, question)
    tok = pair.tokenizer
    ids = torch.tensor([tok.encode(format_prompt(q))])
    rows = ["| method | time | answer | correct | accepted length |", "| --- | --- | --- | --- | --- |"]
    authors = TokenAuthors()
    floor = settings.judge_min_prob
    head = pair.styled_judge
    # the control beside the judge: the same rule with a head that approves every token, at the same floor; where
    # it matches the judge, the floor (not the head) made the difference
    control = Judge(JudgeHead.approve_all(head.hidden_size, head.context), float(judge_threshold), floor)
    for name, rule in (("exact", None), ("judge", Judge(head, float(judge_threshold), floor)),
                       (f"control: approve-all head, floor {floor:g}", control)):
        t0 = time.perf_counter()
        out = speculative_generate(pair.target, ModelDrafter(pair.styled), ids, max_new_tokens=320, tree=settings.k,
                                   rule=rule, engine=EngineConfig(on_step=authors if name == "judge" else None),
                                   stopping=StoppingConfig(eos_token_id=tok.eos_token_id))
        seconds = time.perf_counter() - t0
        text = tok.decode(out.sequences[0, ids.shape[1]: ids.shape[1] + out.num_new_tokens[0]].tolist())
        correct = "-" if answer is None else ("yes" if is_correct(text, answer) else "no")
        rows.append(f"| {name} (styled drafter, k={settings.k}) | {seconds * 1e3:.0f} ms | "
                    f"{_number(extract_answer(text))} | {correct} | {out.stats.mean_accepted_length:.2f} |")
    overrides = sum(a == "judge" for _, a in authors.tokens)
    summary = (_heading(q, answer) + "\n".join(rows) + f"\n\nThe judge approved {overrides} drafted tokens the base "
               "would not have chosen. The control row shows what the probability floor alone accepts.")
    return summary, tokens_html(authors.tokens, tok.decode)


def run(problem: int = 0, question: str = "", threshold: float | None = None):
    """Returns (results markdown, SpecReason chain HTML, Speculative Thinking chain HTML)."""
    pair = _pair()
    q, answer = _problem(pair, problem, question)
    threshold = default_threshold() if threshold is None else threshold
    if not 0 <= float(threshold) <= 10:
        raise ValueError(f"threshold: expected a score in [0, 10], got {threshold!r}")
    tok = pair.tokenizer
    prompt = tok.encode(format_prompt(q))
    rows = ["| method | time | vs base | answer | correct |", "| --- | --- | --- | --- | --- |"]
    results = {}
    for name, model in (("base alone", pair.target), ("small alone", pair.small)):
        t0 = time.perf_counter()
        writer = Writer.open(model, eos_token_id=tok.eos_token_id)
        writer.start(prompt)
        text = tok.decode(writer.write(320))
        results[name] = (text, time.perf_counter() - t0)
    # the zoo's base cannot follow a 0-9 scoring prompt: its likelihood of the step is the score
    sr = SpecReason(pair.small, pair.target, tok, "likelihood",
                    SpecReasonConfig(threshold=float(threshold), token_budget=320),
                    base_drafter=ModelDrafter(pair.small), base_tree=4).run(prompt)
    results["SpecReason"] = (sr.text, sr.seconds)
    writer = pair.reflective if pair.reflective is not None else pair.small  # says "Wait" where it tends to err
    st = SpeculativeThinking(writer, pair.target, tok, zoo_thinking(320),
                             large_drafter=ModelDrafter(pair.small), large_tree=4).run(prompt)
    results["Speculative Thinking"] = (st.text, st.seconds)
    base_s = results["base alone"][1]
    for name, (text, seconds) in results.items():
        correct = "-" if answer is None else ("yes" if is_correct(text, answer) else "no")
        rows.append(f"| {name} | {seconds * 1e3:.0f} ms | {base_s / seconds:.2f}x | {_number(extract_answer(text))} "
                    f"| {correct} |")
    summary = _heading(q, answer) + "\n".join(rows) + (f"\n\nSpecReason: {sr.counters['accepted']} small steps accepted, "
                                 f"{sr.counters['rejected']} rewritten by the base model.")
    return summary, chain_html(sr.steps), thinking_html(st.steps)


def build() -> None:
    import gradio as gr

    gr.Markdown("Step-level speculation on the zoo's `arith-reasoning` pair (byte-level Llamas trained on synthetic "
                "step-by-step arithmetic: a 12-layer base and a small model). SpecReason: the small model "
                "writes each step, the base model scores it (its likelihood of the step, 0-9: this base cannot "
                "follow the paper's scoring prompt) and rewrites the steps scoring under the threshold. Speculative Thinking: a small model trained to say \"Wait\" where it tends to err "
                "writes, and the base takes over at reflective words (wait, check, verify, yes). Green: the small "
                "model's text; blue: the base's.")
    with gr.Row():
        problem = gr.Number(0, label="test problem #", precision=0, elem_id="reasoning-problem")
        threshold = gr.Slider(0, 10, value=default_threshold(), step=0.5,
                              label="SpecReason threshold (10: every step is the base's)")
    question = gr.Textbox(label="or your own question (arithmetic in the training style)", lines=2)
    go = gr.Button("solve", variant="primary", elem_id="reasoning-run")
    table = gr.Markdown(label="comparison", elem_id="reasoning-table")
    with gr.Row():
        with gr.Column():
            gr.Markdown("**SpecReason's steps** (with the base model's score of each small step)")
            chain = gr.HTML(label="SpecReason")
        with gr.Column():
            gr.Markdown("**Speculative Thinking's text**")
            thinking = gr.HTML(label="Speculative Thinking")
    go.click(shown(solve), [problem, question, threshold], [table, chain, thinking], api_name="reasoning")
    gr.Markdown("Judge decoding (token level): the styled drafter, which words its steps differently from the base "
                "(\"9 plus 4 is 13\" for \"9 + 4 = 13\"), drafts 4 tokens at a time; exact decoding keeps only the "
                "base's own choices, the judge head (on the base's hidden states) also approves drafts it rates "
                "right. Green: a draft the base would have chosen; orange: a draft only the judge approved; blue: "
                "the base's own token.")
    judge_threshold = gr.Slider(0, 1, value=0.5, step=0.05, label="judge threshold (1: exact decoding)")
    judge_go = gr.Button("judge decoding", elem_id="reasoning_judge-run")
    judge_table = gr.Markdown(label="judge comparison", elem_id="reasoning_judge-table")
    judge_text = gr.HTML(label="judge decoding's solution")
    judge_go.click(shown(judge), [problem, question, judge_threshold], [judge_table, judge_text],
                   api_name="reasoning_judge")


def solve(problem_number: float, question: str, threshold: float):
    """The solve button's endpoint (`/reasoning`)."""
    return run(int(problem_number), question, float(threshold))


def judge(problem_number: float, question: str, judge_threshold: float):
    """The judge button's endpoint (`/reasoning_judge`)."""
    return run_judge(int(problem_number), question, float(judge_threshold))
