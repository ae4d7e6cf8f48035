"""`multispec eval chat`: speculative decoding on chat questions in the format Spec-Bench and MT-bench share.

    multispec eval chat --pair gemma3-270m-eagle [--data question.jsonl] [--split test] [--per-category N]

The question format: a JSONL file, one object a line with `question_id`, `category` and `turns` (the user's
messages; MT-bench's questions have two, the second asked after the model's own first answer). Categories are
reported by kind as Spec-Bench reports them: MT-bench's eight (writing, roleplay, reasoning, math, coding,
extraction, stem, humanities) together as "multi-turn conversation", then translation, summarization, qa,
math_reasoning and rag; any other category is a kind of its own. An optional `split` field (validation / test)
lets a set hold both; any file of the format runs unchanged. The project ships its own set
(`multispec/bench/data/chat_questions.jsonl`: 60 questions, ten of each kind, half validation, half test).

Every turn is rendered with the rest of the conversation (the tokenizer's chat template, else a turn format:
Gemma's own markers for its GGUF tokenizer, `multispec.chat`), and the model answers until its end of turn or
`--max-new-tokens`. Plain decoding (`generate`, the baseline) reads the whole conversation every turn; the
speculative rows hold it in a `Conversation`, which appends each turn to the caches. A user message longer than
`--max-message-tokens` keeps its first and last halves (the rule is written in the settings). The rows are
`bench text`'s (the pair's EAGLE head, n-gram lookup, Token Recycling, SuffixDecoding, the hybrids, ...) beside
`transformers`' prompt lookup and assisted generation, greedy (each turn's output compared with plain
decoding's) and sampled, timed through the recorder: warmed up, interleaved question by question, in rounds.
The leaderboard, as Spec-Bench's: speedup over plain decoding per kind and overall (medians over rounds, with
their spread), and mean accepted tokens per step.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..chat import Conversation, render_ids, stop_ids, turn_format
from ..metrics import SpeculativeStats
from ..sampling import SamplingConfig
from .recorder import Recorder, repeat, with_role

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
KINDS = ("multi-turn conversation", "translation", "summarization", "qa", "math_reasoning", "rag")
SHIPPED = Path(__file__).parent / "data" / "chat_questions.jsonl"


@dataclass(frozen=True)
class Question:
    question_id: object
    category: str
    turns: tuple[str, ...]
    split: str | None = None
    # a sampled run's draw of it: the runner's seed plus this (`timed(redraw=True)` sets the round's index, so
    # each round samples new answers, every method from the same seed within a round)
    draw: int = 0

    @property
    def kind(self) -> str:
        """Spec-Bench's reporting group: MT-bench's categories are one, the others their own."""
        return KINDS[0] if self.category in MT_BENCH else self.category


def read_questions(path: str | Path) -> list[Question]:
    """The questions of a Spec-Bench / MT-bench `question.jsonl`, or a ValueError naming the line that is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data: {path} is not a file")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"--data: {path}:{n}: not JSON ({err.msg})") from None
        turns = record.get("turns") if isinstance(record, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"--data: {path}:{n}: expected 'turns', a list of the user's messages (non-empty strings)")
        if not isinstance(record.get("category"), str) or "question_id" not in record:
            raise ValueError(f"--data: {path}:{n}: expected 'question_id' and 'category' beside 'turns'")
        out.append(Question(record["question_id"], record["category"], tuple(turns), record.get("split")))
    if not out:
        raise ValueError(f"--data: {path} holds no question")
    return out


def select(questions: list[Question], split: str, per_category: int | None,
           ids: tuple[str, ...] | None = None) -> list[Question]:
    """The questions of `split` ("all", or a split the file names; a file without splits is all test), only those
    whose `question_id` is in `ids` when given (as text), at most `per_category` of each kind, in file order."""
    if split != "all":
        chosen = [q for q in questions if (q.split or "test") == split]
        if not chosen:
            raise ValueError(f"--split: no question of split {split!r} in the file")
        questions = chosen
    if ids is not None:
        known = {str(q.question_id) for q in questions}
        missing = [i for i in ids if i not in known]
        if missing:
            raise ValueError(f"--question-ids: no question {', '.join(missing)} in split {split!r} of the file")
        questions = [q for q in questions if str(q.question_id) in ids]
    if per_category is None:
        return questions
    taken: dict[str, int] = defaultdict(int)
    out = []
    for q in questions:
        if taken[q.kind] < per_category:
            taken[q.kind] += 1
            out.append(q)
    return out


def cut_message(text: str, tokenizer, limit: int | None) -> str:
    """`text` itself, or, past `limit` tokens, its first and last limit // 2 tokens around " ... " (the stated rule
    for long prompts: the question usually sits at one end)."""
    if limit is None:
        return text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= limit:
        return text
    half = limit // 2
    return tokenizer.decode(ids[:half]) + " ... " + tokenizer.decode(ids[-half:])


@dataclass
class ChatOutput:
    """One method's answers to one question: each turn's tokens, the time it took, its speculative statistics."""

    turns: list[list[int]]
    seconds: float
    stats: SpeculativeStats = field(default_factory=SpeculativeStats)

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.turns)


class ChatRunner:
    """Runs a question's turns for one method: plain `generate` on the whole conversation each turn, or a
    `Conversation` that keeps its caches."""

    def __init__(self, target, tokenizer, max_new_tokens: int, fmt_name: str | None, message_limit: int | None,
                 sampling: SamplingConfig, seed: int = 0):
        self.target, self.tokenizer, self.n = target, tokenizer, max_new_tokens
        self.fmt_name, self.fmt = fmt_name, turn_format(tokenizer, fmt_name)
        self.stop = stop_ids(tokenizer, self.fmt)
        self.limit, self.sampling, self.seed = message_limit, sampling, seed

    def messages(self, q: Question) -> list[str]:
        return [cut_message(t, self.tokenizer, self.limit) for t in q.turns]

    def plain(self, q: Question, **generate_options) -> ChatOutput:
        """`generate` on the whole conversation each turn (its own answers in the conversation)."""
        device = next(self.target.parameters()).device
        history, turns = [], []
        sample = dict(do_sample=True, temperature=self.sampling.temperature, top_k=0) if self.sampling.do_sample \
            else dict(do_sample=False)
        if self.sampling.do_sample:
            torch.manual_seed(self.seed + q.draw)
        t0 = time.perf_counter()
        for text in self.messages(q):
            history.append({"role": "user", "content": text})
            ids = torch.tensor([render_ids(history, self.tokenizer, self.fmt)], device=device)
            with torch.no_grad():
                out = self.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.n,
                                           eos_token_id=self.stop or None, pad_token_id=self._pad(), **sample,
                                           **generate_options)
            new = out[0, ids.shape[1]:].tolist()
            new = new[: next((i + 1 for i, t in enumerate(new) if t in self.stop), len(new))]
            turns.append(new)
            answer = new[:-1] if new and new[-1] in self.stop else new
            history.append({"role": "assistant", "content": self.tokenizer.decode(answer, skip_special_tokens=True)})
        return ChatOutput(turns, time.perf_counter() - t0)

    def speculative(self, q: Question, drafter, tree, options: dict) -> ChatOutput:
        generator = torch.Generator().manual_seed(self.seed + q.draw) if self.sampling.do_sample else None
        chat = Conversation(self.target, drafter, self.tokenizer, turn_format=self.fmt_name, tree=tree,
                            sampling=self.sampling, engine=options.get("engine"), generator=generator)
        t0 = time.perf_counter()
        answers = [chat.say(text, self.n) for text in self.messages(q)]
        stats = SpeculativeStats(steps=[s for a in answers for s in a.stats.steps],
                                 prefill_s=sum(a.stats.prefill_s for a in answers))
        return ChatOutput([a.tokens for a in answers], time.perf_counter() - t0, stats)

    def _pad(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return pad if pad is not None else (self.stop[0] if self.stop else 0)


def per_kind(observed: dict[str, list[tuple[str, float, int]]], baseline: str, rounds: int) -> dict:
    """Per method and kind: the median over rounds of its tokens/s over the baseline's on that kind's questions in
    the same round, with the spread. `observed[method]`: (kind, seconds, tokens) per timed call, in call order
    (the recorder times every question once a round, in the same order for every method)."""
    out: dict[str, dict] = {}
    per_round = len(observed[baseline]) // rounds
    for method, calls in observed.items():
        out[method] = {}
        for kind in dict.fromkeys(k for k, _, _ in calls):
            ratios = []
            for r in range(rounds):
                def rate(name):
                    part = [c for c in observed[name][r * per_round:(r + 1) * per_round] if c[0] == kind]
                    return sum(c[2] for c in part) / max(sum(c[1] for c in part), 1e-9)
                ratios.append(rate(method) / max(rate(baseline), 1e-9))
            out[method][kind] = {"speedup": round(statistics.median(ratios), 3),
                                 "speedup_spread": [round(min(ratios), 3), round(max(ratios), 3)]}
    return out


def leaderboard(table: dict, kinds: dict, order: list[str]) -> str:
    """The markdown table Spec-Bench's leaderboard shows: speedup per kind and overall, mean accepted tokens."""
    head = "| method | " + " | ".join(order) + " | overall [spread] | mean accepted tokens | outputs |"
    lines = [head, "|" + " --- |" * (len(order) + 4)]
    for name, row in table["methods"].items():
        cells = [f"{kinds[name][k]['speedup']:.2f}x" if k in kinds[name] else "-" for k in order]
        lo, hi = row["speedup_spread"]
        mal = "-" if row.get("mean_accepted_length") is None else f"{row['mean_accepted_length']:.2f}"
        outputs = ", ".join(f"{n} {v}" for v, n in sorted(row.get("outputs", {}).items())) or "-"
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {row['speedup']:.2f}x [{lo:.2f}-{hi:.2f}] | {mal} | "
                     f"{outputs} |")
    return "\n".join(lines)


def timed(methods: dict, questions: list[Question], rounds: int, compare: bool, desc: str,
          first_round=None, redraw: bool = False) -> tuple[dict, dict]:
    """The recorder's table over the questions (methods interleaved question by question, `rounds` repeated
    rounds, warmed up on the first question), and the per-kind figures; `first_round(table)` sees the first
    round's table as soon as it is measured. `redraw` (sampled tables): round r draws its answers from seed r, so
    the spread over rounds covers the draw (with one seed, each round repeats the same answers: a method's figure
    would rest on one draw of each answer, and two methods differ by the draws their drafts led to)."""
    observed: dict[str, list] = defaultdict(list)

    def observe(name, q, out):
        observed[name].append((q.kind, out.seconds, out.tokens))

    def same(reference, out, q):
        return "identical" if reference.turns == out.turns else "mismatch"

    recorder = Recorder(methods, "plain", count=lambda q, out: out.tokens, stats_of=lambda out: out.stats,
                        compare=same if compare else None, observe=observe)
    runs = [[replace(q, draw=r) for q in questions] for r in range(rounds)] if redraw \
        else repeat(questions, rounds)
    table = recorder.run(runs, warmup=questions[:1], desc=desc, first_round=first_round,
                         round_inputs="redraw" if redraw else "repeat")
    return table, per_kind(dict(observed), "plain", rounds)


def plain_methods(runner: ChatRunner, draft_model=None, peers: bool = True) -> dict:
    """The baseline and `transformers`' own speculation (prompt lookup; assisted generation with a draft model)."""
    methods = {"plain": lambda q: runner.plain(q)}
    if peers:
        methods["hf_prompt_lookup"] = with_role("peer", lambda q: runner.plain(q, prompt_lookup_num_tokens=5))
        if draft_model is not None:
            methods["hf_assisted"] = with_role("peer", lambda q: runner.plain(q, assistant_model=draft_model))
    return methods


__all__ = ["ChatOutput", "ChatRunner", "KINDS", "MT_BENCH", "Question", "SHIPPED", "cut_message", "leaderboard",
           "per_kind", "plain_methods", "read_questions", "select", "timed"]
