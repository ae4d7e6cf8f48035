"""Speculative Verdict (Liu et al. 2025): several cheap draft experts answer, a consensus score over their
cross-perplexities picks the k most agreed-upon, those experts write their reasoning, and a verdict model
reads them and answers.

Consensus (lower is better), over the other experts b:

    score(a) = Σ_{b≠a} | log PPL_b(y_a) - log PPL_b(y_b) |

where PPL_b(y) is expert b's perplexity of answer y after the question: an answer every other expert finds
about as likely as its own scores low. Ties among the best are broken at random (seeded).

Experts are `TextExpert`s (a causal LM and its tokenizer) or, for image questions, `VisionExpert`s (a
`multispec.vision` VLM). The verdict is `PromptVerdict` (the paper's: the verdict model reads every chosen
expert's reasoning and proposed answer and answers in \\boxed{}; `compact=True` is a plain layout after which the
verdict model writes the right solution) or `LikelihoodVerdict` (for a model that cannot
follow such a prompt: it takes the answer of the expert whose reasoning it finds most likely; a selection
among the experts' answers, not a verdict that reasons).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .data import extract_answer, format_prompt
from .scoring import encode_text
from .steps import Writer
from .task_data import verdict_prompt


@dataclass
class ExpertAnswer:
    text: str  # what the expert wrote (the answer span scored for perplexity)
    answer: float | str | None  # the final answer read from it


class TextExpert:
    """A causal LM as a draft expert. `prompt(question) -> str` is the text it continues (default: the zoo's
    "Question: ...\\nSolution:\\n"); its answer is what it writes, up to EOS or `max_new_tokens`; its
    reasoning is the same text (a model that writes step by step reasons while it answers)."""

    def __init__(self, model, tokenizer, prompt: Callable[[str], str] | None = None, max_new_tokens: int = 256,
                 drafter=None, tree=None, answer_of: Callable[[str], float | None] = extract_answer):
        self.model, self.tokenizer = model, tokenizer
        self.prompt = prompt or format_prompt
        self.max_new_tokens, self.drafter, self.tree, self.answer_of = max_new_tokens, drafter, tree, answer_of

    def _ids(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)

    def answer(self, question: str, image=None) -> ExpertAnswer:
        writer = Writer.open(self.model, self.drafter, self.tree,
                             eos_token_id=getattr(self.tokenizer, "eos_token_id", None))
        writer.start(self._ids(self.prompt(question)))
        text = self.tokenizer.decode(writer.write(self.max_new_tokens))
        return ExpertAnswer(text, self.answer_of(text))

    def reason(self, question: str, answer: ExpertAnswer, image=None) -> str:
        return answer.text

    @torch.no_grad()
    def log_ppl(self, question: str, span: str, image=None) -> float:
        """log PPL of `span` after the question: the mean negative log-likelihood of its tokens."""
        context, tokens = self._ids(self.prompt(question)), self._ids(span)
        if not tokens:
            return 0.0
        ids = torch.tensor([context + tokens], device=_device(self.model))
        logits = self.model(ids).logits[0, len(context) - 1: -1].float()
        logp = torch.log_softmax(logits, -1).gather(1, ids[0, len(context):, None])[:, 0]
        return float(-logp.mean())


class VisionExpert:
    """A vision-language model as a draft expert for image questions: a `transformers` VLM that
    `multispec.vision` drives (Llava, Qwen2-VL) and its processor (`processor(image, question) -> model
    inputs`, `decode(ids)`, `encode(text)` or a `tokenizer`: `multispec.vision`'s `VQAProcessor` for the
    zoo's VLM, `HFVQAProcessor` for a checkpoint's own). Its answer is its greedy reply."""

    def __init__(self, model, processor, max_new_tokens: int = 64,
                 answer_of: Callable[[str], float | str | None] = lambda text: text.strip()):
        self.model, self.processor, self.max_new_tokens, self.answer_of = model, processor, max_new_tokens, answer_of
        self.eos = getattr(processor, "eos_token_id", None) or getattr(getattr(processor, "tokenizer", None),
                                                                       "eos_token_id", None)

    def encode_text(self, text: str) -> list[int]:
        if hasattr(self.processor, "encode"):
            return list(self.processor.encode(text))
        return list(self.processor.tokenizer.encode(text, add_special_tokens=False))

    @torch.no_grad()
    def answer(self, question: str, image=None) -> ExpertAnswer:
        if image is None:
            raise ValueError("image: a vision expert answers questions about an image")
        inputs = _on_device(self.processor(image, question), _device(self.model))
        seq = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False,
                                  eos_token_id=self.eos, pad_token_id=getattr(self.processor, "pad_token_id", 0) or 0)
        text = self.processor.decode(seq[0, inputs["input_ids"].shape[1]:])
        return ExpertAnswer(text, self.answer_of(text))

    def reason(self, question: str, answer: ExpertAnswer, image=None) -> str:
        return answer.text

    @torch.no_grad()
    def log_ppl(self, question: str, span: str, image=None) -> float:
        if image is None:
            raise ValueError("image: a vision expert scores answers about an image")
        device = _device(self.model)
        inputs = _on_device(self.processor(image, question), device)
        tokens = self.encode_text(span)
        if not tokens:
            return 0.0
        n = inputs["input_ids"].shape[1]
        span_ids = torch.tensor([tokens], dtype=inputs["input_ids"].dtype, device=device)
        ids = torch.cat([inputs["input_ids"], span_ids], 1)
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        if "mm_token_type_ids" in extra:  # per-token inputs: the span is text
            extra["mm_token_type_ids"] = torch.cat([extra["mm_token_type_ids"], torch.zeros_like(span_ids)], 1)
        logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits[0, n - 1: -1].float()
        logp = torch.log_softmax(logits, -1).gather(1, span_ids[0, :, None])[:, 0]
        return float(-logp.mean())


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _on_device(inputs, device) -> dict:
    """A processor's model inputs with every tensor on the model's `device`."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@dataclass
class VerdictOutput:
    answer: float | str | None
    text: str  # what the verdict model said (or the chosen expert's reasoning)
    answers: dict[str, ExpertAnswer]
    consensus: dict[str, float]  # score(a) per expert (lower = more agreed upon)
    chosen: list[str]  # the top-k experts, best first
    cross_log_ppl: dict[str, dict[str, float]]  # [a][b] = log PPL_b(y_a)
    seconds: float
    timings: dict = field(default_factory=dict)


def consensus_scores(cross: dict[str, dict[str, float]]) -> dict[str, float]:
    """score(a) = Σ_{b≠a} |cross[a][b] - cross[b][b]| (cross[a][b] = log PPL_b(y_a))."""
    names = list(cross)
    return {a: sum(abs(cross[a][b] - cross[b][b]) for b in names if b != a) for a in names}


def top_k(scores: dict[str, float], k: int, seed: int = 42, eps: float = 1e-12) -> list[str]:
    """The k lowest scores, ties (within eps) broken at random with `seed`."""
    rng = random.Random(seed)
    keyed = sorted(scores, key=lambda a: (round(scores[a] / eps) if eps else scores[a], rng.random()))
    return keyed[:k]


class LikelihoodVerdict:
    """The verdict of a model that cannot follow a verdict prompt: it scores each chosen expert's reasoning
    by its own mean log-likelihood after the question and answers as the best-scored one did."""

    def __init__(self, expert: TextExpert):
        self.expert = expert

    def decide(self, question: str, reasoning: dict[str, str], answers: dict[str, ExpertAnswer], image=None):
        scores = {name: -self.expert.log_ppl(question, text, image) for name, text in reasoning.items()}
        best = max(scores, key=scores.get)
        return answers[best].answer, reasoning[best], {"verdict_loglik": scores}


class PromptVerdict:
    """An instruction-tuned verdict model: the question, each expert's reasoning and proposed answer, then the
    instruction to answer in \\boxed{} (the reference's layout); the answer is the last \\boxed{} it writes.
    `chat=True` wraps the text in the tokenizer's chat template. `compact=True`: a shorter plain layout (the one
    benchmarks/studies/reasoning_teach_prompts.py tried to teach the zoo's base; `task_data.verdict_prompt`: the question, "Expert i:" and each solution, an instruction,
    "Solution:"), after which it writes a solution ending "Answer: N"."""

    INSTRUCTION = ("Given the question and the reasoning from multiple models, please give the final answer "
                   "using a single word or phrase enclosed within \\boxed{}.")

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, chat: bool = False,
                 instruction: str = INSTRUCTION, drafter=None, tree=None, compact: bool = False):
        if compact and chat:
            raise ValueError("compact: the compact layout is plain text; give chat=False")
        self.model, self.tokenizer, self.max_new_tokens, self.chat = model, tokenizer, max_new_tokens, chat
        self.instruction, self.drafter, self.tree, self.compact = instruction, drafter, tree, compact

    def prompt(self, question: str, reasoning: dict[str, str], answers: dict[str, ExpertAnswer]) -> str:
        if self.compact:  # a plain layout: the verdict model writes the right solution, "Answer: N" last
            return verdict_prompt(question, list(reasoning.values()))
        parts = [f"Question:\n{question}\n"]
        for i, (name, text) in enumerate(reasoning.items(), 1):
            parts.append(f"--- Model {i} ({name}) ---\nReasoning:\n{text}\n"
                         f"Proposed Answer: {_fmt(answers[name].answer)}\n")
        parts.append(self.instruction)
        text = "\n".join(parts)
        if self.chat:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return text

    def decide(self, question: str, reasoning: dict[str, str], answers: dict[str, ExpertAnswer], image=None):
        writer = Writer.open(self.model, self.drafter, self.tree,
                             eos_token_id=getattr(self.tokenizer, "eos_token_id", None))
        writer.start(encode_text(self.tokenizer, self.prompt(question, reasoning, answers)))
        text = self.tokenizer.decode(writer.write(self.max_new_tokens))
        return extract_answer(text), text, {}


def _fmt(x: float | None) -> str:
    if x is None:
        return "none"
    return str(int(x)) if float(x).is_integer() else str(x)


class SpeculativeVerdict:
    """Draft experts (name -> expert, at least 2), a verdict (`LikelihoodVerdict` / `PromptVerdict`), top k."""

    def __init__(self, experts: dict, verdict, k: int = 3, seed: int = 42):
        if not isinstance(experts, dict) or len(experts) < 2:
            raise ValueError(f"experts: expected a dict of at least 2 named experts, got {type(experts).__name__} "
                             f"of {len(experts) if hasattr(experts, '__len__') else '?'}")
        if not isinstance(k, int) or not 1 <= k <= len(experts):
            raise ValueError(f"k: expected an int in [1, {len(experts)}] (the experts kept), got {k!r}")
        self.experts, self.verdict, self.k, self.seed = experts, verdict, k, seed

    def run(self, question: str, image=None) -> VerdictOutput:
        t0 = time.perf_counter()
        answers = {name: e.answer(question, image) for name, e in self.experts.items()}
        t1 = time.perf_counter()
        cross = {a: {b: e.log_ppl(question, answers[a].text, image) for b, e in self.experts.items()}
                 for a in self.experts}
        scores = consensus_scores(cross)
        chosen = top_k(scores, self.k, self.seed)
        t2 = time.perf_counter()
        reasoning = {name: self.experts[name].reason(question, answers[name], image) for name in chosen}
        answer, text, extra = self.verdict.decide(question, reasoning, {n: answers[n] for n in chosen}, image)
        t3 = time.perf_counter()
        timings = {"answers_s": t1 - t0, "consensus_s": t2 - t1, "verdict_s": t3 - t2} | extra
        return VerdictOutput(answer, text, answers, scores, chosen, cross, t3 - t0, timings)


__all__ = ["ExpertAnswer", "LikelihoodVerdict", "PromptVerdict", "SpeculativeVerdict", "TextExpert", "VerdictOutput",
           "VisionExpert", "consensus_scores", "top_k"]
