"""Answering VQA questions with every method side by side: plain `generate`, `transformers`' prompt-lookup
assisted generation, and speculative decoding with each VLM drafter (chain and dynamic tree). Shared by
`multispec eval vqa` and `multispec bench vision`, timed through the benchmark recorder: methods interleaved
per question (so drift on a noisy machine hits all alike), each output compared token for token with plain
decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from multispec import DynamicTree, Prompt, StoppingConfig, speculative_generate
from multispec.plugin import (Recorder, Shards, as_target, generated_tokens, outputs_identical, partition, sequences,
                              with_role)

from .vqa_metrics import anls, relaxed_accuracy, vqa_accuracy

Method = Callable[[dict[str, torch.Tensor]], object]  # model inputs -> generate's tensor or SpeculativeOutput


@dataclass
class VQAItem:
    image: object  # a PIL image
    question: str
    answers: list[str]  # accepted answers (VQA accuracy / ANLS references)
    short: bool = True  # a short-answer question (scored); long ones (descriptions) are timed only


# The zoo drafters accept nearly every draft token, so long chains and deep, narrow trees pay best
# (BENCHMARKS.md, "Vision": the chain-length rows).
CHAIN_K = 8
TREE = DynamicTree(depth=8, topk=2, total=16)


def vqa_methods(model, drafters: dict[str, object], max_new_tokens: int, eos_token_id: int, pad_token_id: int,
                chain_k: int | Sequence[int] = CHAIN_K, tree: DynamicTree | None = None,
                prompt_lookup: bool = True) -> dict[str, Method]:
    """Greedy methods by name; "plain" first (the reference). One chain row per length in `chain_k`."""
    tree = tree or TREE
    ks = chain_lengths(chain_k)
    stop = dict(eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    stopping = StoppingConfig(**stop)
    methods: dict[str, Method] = {
        "plain": lambda inputs: model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **stop)}
    if prompt_lookup:
        methods["hf_prompt_lookup"] = with_role("peer", lambda inputs: model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, prompt_lookup_num_tokens=5, **stop))
    for name, drafter in drafters.items():
        for label, spec in [(f"chain_k{k}", k) for k in ks] + [("dynamic_tree", tree)]:
            methods[f"{name}_{label}"] = (lambda inputs, d=drafter, s=spec: speculative_generate(
                model, d, max_new_tokens=max_new_tokens, tree=s, stopping=stopping, **inputs))
    return methods


def chain_lengths(chain_k: int | Sequence[int]) -> tuple[int, ...]:
    """`chain_k` as a tuple of positive lengths, or a ValueError naming it."""
    ks = (chain_k,) if isinstance(chain_k, int) else tuple(chain_k)
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"chain_k: expected positive chain lengths, got {chain_k!r}")
    return ks


def accepted_length(model, drafter, prompts: Sequence[dict[str, torch.Tensor]], max_new_tokens: int, tree,
                    eos_token_id: int, pad_token_id: int) -> float:
    """Mean accepted length of `drafter` over `prompts` (model inputs, batch 1 each): tokens committed per
    target forward, the bonus token included. Greedy, so it needs no timing and no repeat."""
    committed = forwards = 0
    for inputs in prompts:
        res = speculative_generate(model, drafter, max_new_tokens=max_new_tokens, tree=tree, **inputs,
                                   stopping=StoppingConfig(eos_token_id=eos_token_id, pad_token_id=pad_token_id))
        committed += res.stats.committed
        forwards += sum(s.rows for s in res.stats.steps)
    return round(committed / max(1, forwards), 3)


@torch.no_grad()
def gate_choices(model, drafter, prompts: Sequence[dict[str, torch.Tensor]]) -> dict[str, int]:
    """How often a SpecVLM drafter's gate picks each compressor over `prompts` (model inputs, batch 1 each)."""
    target = as_target(model)
    branches = drafter.head.vision.branches
    picks = []
    for inputs in prompts:
        prompt = Prompt.build(**inputs)
        drafter.start(prompt, target.prefill(prompt, drafter.feature_request).features)
        picks.append(branches[int(drafter.last_choice[0].argmax())])
    return {b: picks.count(b) for b in branches if picks.count(b)}


def probe(method: Method, inputs: dict[str, torch.Tensor]) -> str | None:
    """None if `method` runs on these inputs, else why not (e.g. `transformers` refusing a VLM)."""
    try:
        method(inputs)
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as err:
        return f"{type(err).__name__}: {str(err)[:200]}"
    return None


def _answer(seq: torch.Tensor, prompt_len: int, eos: int, processor) -> tuple[list[int], str]:
    ids = seq[0, prompt_len:].tolist()
    ids = ids[:ids.index(eos) + 1] if eos in ids else ids
    return ids, processor.decode([i for i in ids if i != eos]).strip()


def run_vqa(items: Sequence[VQAItem], processor, methods: dict[str, Method], eos_token_id: int,
            desc: str = "vqa", rounds: int = 1, shards: Shards | None = None) -> dict:
    """Run every method on every item (batch 1) through the benchmark recorder: methods interleaved per
    question, the questions split into `rounds` rounds (a ratio per round, their spread reported), a warm-up
    on the first question. Returns the recorder's table (rows: tokens/s, speedup with its spread, mean
    accepted length, step split, `outputs` against plain decoding, and under `quality` the VQA accuracy /
    ANLS / relaxed accuracy on the short questions), whether every output equals plain decoding's, and the
    predictions. `shards`: this process's part of a data-parallel run (`multispec.shards`): it answers
    its share of the questions, and every process returns the figures of all of them."""
    prepared = [(i, processor(item.image, item.question)) for i, item in enumerate(items)]
    predictions: dict[str, list[str | None]] = {name: [None] * len(items) for name in methods}

    def observe(name, question, out) -> None:
        index, inputs = question
        predictions[name][index] = _answer(sequences(out), inputs["input_ids"].shape[1], eos_token_id, processor)[1]

    def compare(reference, out, question) -> str:
        length = question[1]["input_ids"].shape[1]
        same = _answer(sequences(reference), length, eos_token_id, processor)[0] == \
            _answer(sequences(out), length, eos_token_id, processor)[0]
        return "identical" if same else "mismatch"

    timed = {name: with_role(getattr(method, "role", "speculative"), lambda question, m=method: m(question[1]))
             for name, method in methods.items()}
    table = Recorder(timed, "plain", count=lambda question, out: generated_tokens(question[1], out),
                     compare=compare, observe=observe).run(partition(prepared, rounds), warmup=prepared[:1],
                                                           desc=desc, round_inputs="partition", shards=shards)
    if shards is not None and shards.world > 1:  # each question was answered by one process: take its answers
        for part in shards.gather(predictions):
            for name, preds in part.items():
                predictions[name] = [p if p is not None else q for p, q in zip(predictions[name], preds)]
    short = [i for i, item in enumerate(items) if item.short]
    for name, row in table["methods"].items():
        preds = predictions[name]
        if short:
            row["quality"] = {
                "vqa_accuracy": round(sum(vqa_accuracy(preds[i], items[i].answers) for i in short) / len(short), 4),
                "anls": round(sum(anls(preds[i], items[i].answers) for i in short) / len(short), 4),
                "relaxed_accuracy": round(
                    sum(relaxed_accuracy(preds[i], items[i].answers) for i in short) / len(short), 4)}
    return {"table": table, "outputs_identical": outputs_identical({"greedy": table}),
            "predictions": predictions}
