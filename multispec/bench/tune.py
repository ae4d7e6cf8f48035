"""`multispec zoo tune NAME`: choose a zoo pair's draft shapes on the validation split and store them in its
`draft_shape.json`, where `zoo.load` (and so `bench text`, `generate` and the demos) reads them.

- `--what shape`: the drafter's chain length and dynamic tree. Every candidate runs greedy and sampled
  (T = 0.8) against plain decoding and our engine with no drafts, in interleaved rounds on validation prompts
  (stdlib files no recipe trained on, `multispec.zoo.data`); the chosen chain and tree maximise the mean of the
  greedy and sampled speedups over plain decoding. Beside the timings it records each chain length's step
  profile (verification widths and tokens committed, `multispec.draft_length.StepProfile`) and this machine's
  verification cost at those widths, and prints the length they predict; `--write` stores the choice and the
  profiles, so `bench text --chain-k auto` chooses the length for the machine it runs on. `--drafter ngram`:
  the candidates verify prompt lookup's drafts (on a target whose verification cost jumps with the number of
  rows, the lookup rows are the fast ones and the length is chosen for them); `--trees none`: chains only.
- `--what recycling`: Token Recycling's static tree. On a CPU every verified node costs, so the tree that pays
  depends on the pair and the machine (the paper's 80 nodes are sized for a GPU). Every candidate runs greedy,
  as `bench text`'s `recycling_tree` row does (one drafter per round, learning across its prompts); the fastest
  is chosen. Candidates are rank paths (`multispec.drafters.recycling.tree_from_text`): "0,1,0.0" is the
  root's top two candidates and the first one's top candidate; "cpu" is the 12-node `cpu_tree()`.
- `--what chat-lookup`: prompt lookup for chat (`multispec eval chat`'s row `ngram_chain_k{K}_min{M}`): the
  chain length K and the shortest n-gram M it matches, timed greedy on the chat set's validation questions
  (`--per-category`, default 2 a kind) against plain decoding, every turn compared; the fastest is chosen. Chat
  differs from the stdlib prompts the shape was chosen on: a small model repeats itself within an answer, so a
  match of two tokens or more tends to run on for tens of tokens, while a match of one token rarely does (on a
  wide vocabulary a rejected chain costs a verification of every drafted node). `--sampled`: the same at
  `--temperature` (eval chat's sampled table), stored apart. A sampled target leaves a loop sooner and a one-hot
  draft is kept with the target's probability of it, so few of a long chain's drafts are kept and its
  verification of every drafted node is paid for little: the candidates are shorter, and "auto" (an
  `AdaptiveChain` that sizes each step's chain from the acceptance and verification cost it measures). The
  greedy choice runs beside them. The exact rule keeps every candidate lossless; sampled outputs differ by draw,
  so none is compared.

The test split (the held-out files) is then run once with the choice: `multispec bench text`.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import zoo
from .chat import SHIPPED, ChatRunner, read_questions, select, timed
from .machine import describe, save_results
from .recorder import Recorder, format_table, repeat, results
from .rows import Row, method_table
from .text import prompts
from ..adaptive import AdaptiveChain
from ..config import StoppingConfig
from ..draft_length import StepProfile, VerifyCost, choose_chain_length, describe_choice
from ..drafters import NGramDrafter, TokenRecyclingDrafter
from ..drafters.recycling import tree_from_text
from ..generate import speculative_generate
from ..sampling import SamplingConfig
from ..tree import DynamicTree

CHAINS = (4, 5, 6, 8)
TREES = ("4/4/15", "4/3/11", "5/3/11", "6/2/11")
RECYCLING_TREES = ("0", "0,0.0", "0,1", "0,1,0.0", "0,1,0.0,0.0.0", "0,1,2,0.0,1.0,0.0.0", "cpu")
CHAT_CHAINS = (11, 15, 23, 31)
CHAT_MIN_NGRAMS = (1, 2)
CHAT_SAMPLED_CHAINS = ("auto", 3, 6, 12)
CHAT_SAMPLED_MIN_NGRAMS = (2,)
CHAT_AUTO_MAX_K = 16  # "auto"'s longest chain
TEMPERATURE = 0.8


@dataclass(frozen=True)
class TuneRun:
    """What every tuning shares: the pair, the validation prompts and the timing budget."""

    pair_name: str
    rounds: int = 3
    max_new_tokens: int = 128
    full: bool = False  # every validation prompt (default: the quick set)
    json_path: str | None = None
    write: bool = False  # store the choice in the pair's draft_shape.json

    def inputs(self, pair) -> list[torch.Tensor]:
        return [ids for _, ids in prompts(pair.tokenizer, quick=not self.full, split="validation")]

    def described(self, what: str, count: int, unit: str = "prompts") -> str:
        return (f"multispec zoo tune {self.pair_name} --what {what} (validation split, {count} {unit} x "
                f"{self.max_new_tokens} tokens)" + (f"; results: {self.json_path}" if self.json_path else ""))


def _plain(target, n: int, sampled: bool):
    extra = {"temperature": TEMPERATURE, "top_k": 0} if sampled else {}
    return lambda ids: target.generate(ids, max_new_tokens=n, do_sample=sampled, eos_token_id=None, pad_token_id=0,
                                       **extra)


def tune_shape(run: TuneRun, chains=CHAINS, trees=TREES, drafter: str = "eagle") -> dict:
    """Choose the chain length and the dynamic tree (see the module docstring); returns the results."""
    tree_shapes = [tuple(int(x) for x in t.split("/")) for t in trees]
    pair = zoo.load(run.pair_name)
    target, n = pair.target, run.max_new_tokens
    drafts = pair.drafter if drafter == "eagle" else NGramDrafter()
    inputs = run.inputs(pair)
    rows = [Row("no_draft", NGramDrafter(), 0), *(Row(f"chain_k{k}", drafts, k) for k in chains),
            *(Row(f"tree_{d}/{t}/{m}", drafts, DynamicTree(d, t, m)) for d, t, m in tree_shapes)]
    runs = defaultdict(list)  # (chain_k, mode) -> the stats of every run (warm-up included): the step profiles
    tables = {}
    for mode in ("greedy", "sampling"):
        sampling = SamplingConfig(do_sample=mode == "sampling", temperature=TEMPERATURE if mode == "sampling" else 1)
        generator = torch.Generator().manual_seed(0)

        def one(ids, drafts, spec, options, mode=mode, sampling=sampling, generator=generator):
            out = speculative_generate(target, drafts, ids, max_new_tokens=n, tree=spec, sampling=sampling,
                                       stopping=StoppingConfig.never(), generator=generator)
            if isinstance(spec, int):
                runs[spec, mode].append(out.stats)
            return out

        methods = {"plain": _plain(target, n, mode == "sampling")} | method_table(rows, one)
        tables[mode] = Recorder(methods, "plain", also_against=["no_draft"]).run(
            repeat(inputs, run.rounds), warmup=inputs[:1], desc=mode)
    return _shape_results(run, pair, tables, runs, chains, tree_shapes, drafts, drafter, inputs)


def _shape_results(run: TuneRun, pair, tables: dict, runs: dict, chains, tree_shapes, drafts, drafter: str,
                   inputs: list) -> dict:
    def score(name: str) -> float:
        return (tables["greedy"]["methods"][name]["speedup"] + tables["sampling"]["methods"][name]["speedup"]) / 2

    chain = max((f"chain_k{k}" for k in chains), key=score)
    tree = max((f"tree_{d}/{t}/{m}" for d, t, m in tree_shapes), key=score) if tree_shapes else None
    chosen = {"chain_k": int(chain[len("chain_k"):]), "tree": tree[len("tree_"):] if tree else None}
    n = run.max_new_tokens
    widths = sorted({1 + st.drafted for stats in runs.values() for s in stats for st in s.steps})
    cost = VerifyCost.measure(pair.target, widths, prefix_tokens=sum(ids.shape[1] for ids in inputs) // len(inputs)
                              + n // 2, request=drafts.feature_request)
    profiles = [StepProfile.from_stats(k, mode, stats, cost) for (k, mode), stats in sorted(runs.items())]
    predicted = choose_chain_length(profiles, cost)
    settings = {"pair": run.pair_name, "drafter": drafter, "split": "validation", "prompts": len(inputs),
                "rounds": run.rounds, "max_new_tokens": n, "threads": torch.get_num_threads(),
                "rule": "max mean of greedy and sampled speedup"}
    out = results("draft-shape", settings, tables, chosen=chosen, profiles=[p.to_json() for p in profiles],
                  verify_ms={str(m): round(v, 2) for m, v in cost.ms.items()},
                  predicted={"chain_k": predicted.chain_k,
                             "speedup_vs_no_draft": {str(k): v for k, v in predicted.predicted.items()}})
    print(f"machine: {describe(out['machine'])}")
    for mode, table in tables.items():
        print(format_table(mode, table))
    print(f"chosen on validation: chain k={chosen['chain_k']}, tree {chosen['tree'] or '(not chosen)'}")
    print("from the step profiles and this machine's verification cost:\n" + describe_choice(predicted))
    save_results(out, run.json_path)
    if run.write:
        def update(shape: dict) -> None:
            shape["chain_k"], shape["tree"] = chosen["chain_k"], chosen["tree"] or shape.get("tree")
            shape["chosen_by"] = run.described("shape", len(inputs))
            shape["profiles"], shape["profiled_drafter"] = [p.to_json() for p in profiles], drafter
            shape["profiled_by"] = shape["chosen_by"]
            if run.json_path:
                shape["results"] = run.json_path
        _write_shape(run.pair_name, update)
    return out


def tune_recycling(run: TuneRun, trees=RECYCLING_TREES) -> dict:
    """Choose Token Recycling's tree (see the module docstring); returns the results."""
    shapes = {text: tree_from_text(text) for text in trees}  # a malformed candidate fails before any timing
    pair = zoo.load(run.pair_name)
    target, n = pair.target, run.max_new_tokens
    inputs = run.inputs(pair)
    rows = [Row("no_draft", NGramDrafter(), 0),
            *(Row(f"recycling_{text}", TokenRecyclingDrafter, shape, fresh=True) for text, shape in shapes.items())]

    def one(ids, drafts, spec, options):
        return speculative_generate(target, drafts, ids, max_new_tokens=n, tree=spec, stopping=StoppingConfig.never())

    methods = {"plain": _plain(target, n, False)} | method_table(rows, one)
    table = Recorder(methods, "plain", also_against=["no_draft"]).run(
        repeat(inputs, run.rounds), warmup=inputs[:1], desc="greedy")
    chosen = max(shapes, key=lambda text: table["methods"][f"recycling_{text}"]["speedup"])
    settings = {"pair": run.pair_name, "split": "validation", "prompts": len(inputs), "rounds": run.rounds,
                "max_new_tokens": n, "threads": torch.get_num_threads(), "rule": "max greedy speedup"}
    out = results("recycling-tree", settings, {"greedy": table}, chosen=chosen)
    _report(out, run, "greedy", table, f"{chosen} ({shapes[chosen].max_nodes} nodes)")
    if run.write:
        def update(shape: dict) -> None:
            shape["recycling_tree"] = chosen
            shape["recycling_tree_chosen_by"] = run.described("recycling", len(inputs))
        _write_shape(run.pair_name, update)
    return out


def chat_lookup_row(chain_k: int | str, min_ngram: int) -> Row:
    """`eval chat`'s prompt-lookup row of chains of `chain_k` tokens ("auto": an `AdaptiveChain` of at most
    `CHAT_AUTO_MAX_K`) from n-grams of at least `min_ngram` tokens; in the sampled table too (its drafts are one-hot:
    the exact rule keeps it lossless)."""
    tree = AdaptiveChain(max_k=CHAT_AUTO_MAX_K) if chain_k == "auto" else int(chain_k)
    name = f"ngram_chain_{'auto' if chain_k == 'auto' else f'k{chain_k}'}_min{min_ngram}"
    return Row(name, functools.partial(NGramDrafter, min_ngram=min_ngram), tree, sampled=True)


def tune_chat_lookup(run: TuneRun, chains=CHAT_CHAINS, min_ngrams=CHAT_MIN_NGRAMS, per_category: int = 2,
                     temperature: float | None = None) -> dict:
    """Choose prompt lookup's chain length and shortest n-gram for chat, greedy, or sampled at `temperature`
    (see the module docstring)."""
    if max(min_ngrams) > NGramDrafter().max_ngram:
        raise ValueError(f"--min-ngrams: at most {NGramDrafter().max_ngram} (the longest n-gram looked up)")
    sampled = temperature is not None
    if sampled and not temperature > 0:
        raise ValueError(f"--temperature: must be > 0, got {temperature}")
    pair = zoo.load(run.pair_name)
    questions = select(read_questions(SHIPPED), "validation", None if run.full else per_category)
    sampling = SamplingConfig(do_sample=True, temperature=temperature) if sampled else SamplingConfig()
    runner = ChatRunner(pair.target, pair.tokenizer, run.max_new_tokens, None, 1024, sampling)
    shapes = [(k, m) for m in min_ngrams for k in chains]
    if sampled and pair.chat_lookup is not None and pair.chat_lookup not in shapes:
        shapes.append(pair.chat_lookup)  # the greedy choice, under sampling: what the shorter chains must beat
    rows = {row.name: (row, shape) for shape in shapes for row in [chat_lookup_row(*shape)]}
    methods = {"plain": runner.plain} | method_table([row for row, _ in rows.values()], lambda q, drafter, tree,
                                                     options: runner.speculative(q, drafter, tree, options))
    mode = f"sampled (T = {temperature})" if sampled else "greedy"
    table, kinds = timed(methods, questions, run.rounds, compare=not sampled, desc=f"chat lookup, {mode}",
                         redraw=sampled)
    # greedy: only a candidate identical to plain decoding on every turn; sampled: lossless by the exact rule
    eligible = [n for n in rows if sampled or set(table["methods"][n]["outputs"]) == {"identical"}]
    if not eligible:
        raise RuntimeError("no candidate matched plain decoding on every turn: nothing to choose")
    best = max(eligible, key=lambda n: table["methods"][n]["speedup"])
    chain_k, min_ngram = rows[best][1]
    chosen = {"chain_k": chain_k, "min_ngram": min_ngram} | ({"temperature": temperature} if sampled else {})
    settings = {"pair": run.pair_name, "data": SHIPPED.name, "split": "validation", "questions": len(questions),
                "rounds": run.rounds, "max_new_tokens": run.max_new_tokens, "threads": torch.get_num_threads(),
                "temperature": temperature,
                "rule": "max sampled speedup over plain decoding (lossless by the exact rule)" if sampled else
                        "max greedy speedup over plain decoding, every turn identical"}
    what = "chat-lookup" + ("-sampled" if sampled else "")
    key = "sampling" if sampled else "greedy"
    out = results(what, settings, {key: table}, per_kind={key: kinds}, chosen=chosen)
    _report(out, run, f"chat lookup, {mode}", table, best)
    if run.write:
        def update(shape: dict) -> None:
            field = "chat_lookup_sampled" if sampled else "chat_lookup"
            how = run.described("chat-lookup" + (f" --sampled --temperature {temperature}" if sampled else ""),
                                len(questions), "questions")
            shape[field] = chosen | {"chosen_by": how}
            if run.json_path:
                shape[field]["results"] = run.json_path
        _write_shape(run.pair_name, update)
    return out


def _report(out: dict, run: TuneRun, title: str, table: dict, chosen: str) -> None:
    """Print a one-table tuning's machine, table and choice; save its results where `--json` says."""
    print(f"machine: {describe(out['machine'])}")
    print(format_table(title, table))
    print(f"chosen on validation: {chosen}")
    save_results(out, run.json_path)


def shape_file(pair_name: str) -> Path:
    """The pair's `draft_shape.json`, beside its weights."""
    return zoo.path(pair_name) / "draft_shape.json"


def _write_shape(pair_name: str, update) -> None:
    """Apply `update` to the pair's `draft_shape.json` (created if missing) and write it back."""
    file = shape_file(pair_name)
    shape = json.loads(file.read_text()) if file.exists() else {"chain_k": None, "tree": None}
    update(shape)
    file.write_text(json.dumps(shape, indent=2) + "\n")
    print(f"written to {file}")


__all__ = ["CHAINS", "CHAT_AUTO_MAX_K", "CHAT_CHAINS", "CHAT_MIN_NGRAMS", "CHAT_SAMPLED_CHAINS",
           "CHAT_SAMPLED_MIN_NGRAMS", "RECYCLING_TREES", "TREES", "TuneRun", "chat_lookup_row",
           "shape_file", "tune_chat_lookup", "tune_recycling", "tune_shape"]
