"""Text speed benchmark on a zoo pair (`multispec bench text`).

Same prompts for every method: held-out CPython stdlib files (never trained on) and natural-language
prompts. Greedy: plain decoding, `transformers` prompt lookup (and assisted generation with the pair's small
draft model, where it has one), our n-gram drafter, the draft model as a chain, our EAGLE drafter
as a chain and as a dynamic tree, the hybrid (prompt lookup when it matches, EAGLE otherwise), Token
Recycling and SuffixDecoding; each output is compared with plain greedy, and a differing token is classified
as a floating-point near-tie when the target's top-2 logit gap there is below 1e-4. Sampling (temperature
0.8): speed and acceptance only (correctness is the core's chi-square tests). Timed through the recorder
(`multispec.bench.recorder`): warm-up on the same prompts, methods interleaved in repeated rounds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import (Chain, DynamicTree, EngineConfig, HybridDrafter, ModelDrafter, NGramDrafter, SamplingConfig,
                StoppingConfig, SuffixDecodingDrafter, TokenRecyclingDrafter, speculative_generate, zoo)
from ..adaptive import AdaptiveChain
from ..draft_length import calibrate, describe_choice
from ..drafters.recycling import cpu_tree, tree_to_text
from ..targets.lean import lean_unsupported
from ..targets.lm_head import fast_head_applies, tall_lm_head
from ..zoo.data import read_source, shuffled, stdlib_files
from .batch_sweep import crossover, plot_sweep, sweep, throughput_table
from .machine import busy, describe, save_results
from .options import BenchOptions
from .recorder import LEGEND, Recorder, format_table, outputs_identical, repeat, results, sequences, with_role
from .rows import Row, keep_rows, leading, method_table

NATURAL = [
    "The history of the printing press begins in the fifteenth century, when",
    "To make a good cup of tea, first",
    "Photosynthesis is the process by which plants",
    "Dear committee members, I am writing to",
]
NATURAL_VALIDATION = [  # where settings are chosen; NATURAL is the test split's
    "The river had flooded twice that spring, and the villagers",
    "A good recipe for bread needs only four ingredients:",
]
NEAR_TIE = 1e-4


PROMPT_CHARS = 1200


def prompt_files(split: str, count: int) -> list:
    """`count` stdlib files of `split` to prompt with: the held-out (test) files in order, or validation files
    long enough for a full prompt, in a fixed pseudo-random order."""
    if split == "heldout":
        return stdlib_files("heldout")[:count]
    files = [f for f in shuffled(stdlib_files(split), seed=2) if len(read_source(f)) >= 2 * PROMPT_CHARS]
    return files[:count]


def prompts(tokenizer, quick: bool, split: str = "heldout") -> list[tuple[str, torch.Tensor]]:
    """Code prompts (the first 1200 characters of stdlib files of `split`) and natural-language ones."""
    if split not in ("heldout", "validation"):
        raise ValueError(f"split: expected 'heldout' (test) or 'validation', got {split!r}")
    out = [(f"stdlib:{f.name}", read_source(f)[:PROMPT_CHARS]) for f in prompt_files(split, 2 if quick else 6)]
    natural = NATURAL if split == "heldout" else NATURAL_VALIDATION
    tag = "natural" if split == "heldout" else "natural-validation"
    out += [(f"{tag}:{i}", t) for i, t in enumerate(natural[: 1 if quick else 4])]
    return [(name, tokenizer(text, return_tensors="pt")["input_ids"]) for name, text in out]


@torch.no_grad()
def classify(target, reference: torch.Tensor, other: torch.Tensor) -> str:
    """'identical', 'near-tie' (first difference at a target top-2 gap < 1e-4) or 'mismatch'."""
    if torch.equal(reference, other):
        return "identical"
    n = min(reference.shape[1], other.shape[1])
    diff = (reference[0, :n] != other[0, :n]).nonzero()
    if len(diff) == 0:
        return "mismatch"  # one is a prefix of the other: lengths differ
    pos = int(diff[0])
    logits = target(reference[:, :pos]).logits[0, -1].float()
    top2 = torch.topk(logits, 2).values
    return "near-tie" if float(top2[0] - top2[1]) < NEAR_TIE else "mismatch"


def _with_fast_head(model, fn):
    with tall_lm_head(model):
        return fn()


def _corpus(tokenizer, chars: int) -> list[list[int]]:
    """The stdlib training split (never the held-out prompts) as token documents, for SuffixDecoding."""
    docs, total = [], 0
    for path in stdlib_files("train"):
        text = read_source(path)
        docs.append(tokenizer(text)["input_ids"])
        total += len(text)
        if total >= chars:
            break
    return [d if isinstance(d, list) else list(d) for d in docs]


@dataclass
class Setup:
    """What the rows of one run share: the pair's models, the token budget and the draft shapes."""

    pair: Any
    n: int
    chain_k: int
    tree: DynamicTree
    recycling_tree: Any
    corpus: list[list[int]] | None
    choice: Any = None  # the calibrated chain choice (`multispec.draft_length`), or None

    @property
    def pads(self) -> dict[int, int] | None:
        return self.choice.pad_widths if self.choice and self.choice.pad_widths else None

    @property
    def profiled(self) -> str:
        return self.pair.profiled_drafter or "eagle"


def rows(setup: Setup, compile: bool) -> list[Row]:
    """Every speculative row, once. With a calibrated length, the row whose steps the calibration profiled (the
    pair's profiled drafter, EAGLE or n-gram, chained at that length) pads its steps as the measured cost found
    cheaper, and so do the suffix chains of that length (their steps verify the same widths, 1 to k+1 nodes).
    Other rows are not padded: their widths were never profiled, and a width's single cost reading is noisy
    (padding Token Recycling's 2-node steps to 5 cost it 1.19x -> 1.04x on validation,
    benchmarks/results/padding_control_recycling_stdlib-bytes-large.json)."""
    k, tree, eagle, draft = setup.chain_k, setup.tree, setup.pair.drafter, setup.pair.draft_model
    padded = {"engine": EngineConfig(pad_widths=setup.pads)} if setup.pads else {}
    pad_if = lambda yes: padded if yes else {}  # noqa: E731
    corpus = setup.corpus

    def suffix():
        return SuffixDecodingDrafter(corpus=corpus)

    suffix_tree = DynamicTree(depth=4, topk=4, total=16)
    compiled = {"engine": EngineConfig(step="compiled")}
    return [
        # control: our engine with no drafts (an empty chain each step), so the table shows how much of a
        # speedup is the engine (the lean forward, one host read a step) rather than speculation
        Row("no_draft", NGramDrafter, 0, sampled=True, role="control"),
        # the same lookup as transformers' row (5 tokens), then at the chain length of the other rows
        Row("ngram_chain", NGramDrafter, 5),
        Row(f"ngram_chain_k{k}", NGramDrafter, k, options=pad_if(setup.profiled == "ngram")),
        *([Row(f"draft_chain_k{k}", ModelDrafter(draft), k, sampled=True)] if draft is not None else []),
        Row(f"eagle_chain_k{k}", eagle, k, sampled=True, options=pad_if(setup.profiled == "eagle")),
        Row("eagle_chain_adaptive", eagle, Chain(2 * k, min_prob=0.3)),
        # each step's length chosen where it runs for tokens per second (`tree="auto"`); one policy for the row,
        # so what it measured carries from call to call as it would in a server
        Row("eagle_chain_auto", eagle, AdaptiveChain(max_k=min(16, 2 * k)), sampled=True),
        Row("eagle_dynamic_tree", eagle, tree, sampled=True),
        Row(f"hybrid_chain_k{k}", lambda: HybridDrafter(eagle), k, sampled=True),
        Row("hybrid_dynamic_tree", lambda: HybridDrafter(eagle), tree),
        Row("recycling_tree", TokenRecyclingDrafter, setup.recycling_tree, fresh=True),
        Row("suffix_chain", suffix, 16, fresh=True),
        # the calibrated length: a chain of the profiled row's widths (1 to k+1 nodes), so the same padding fits
        Row(f"suffix_chain_k{k}", suffix, k, fresh=True, options=padded),
        Row("suffix_tree", suffix, suffix_tree, fresh=True, sampled=True),
        Row(f"hybrid_suffix_eagle_k{k}", lambda: HybridDrafter(eagle, lookup=suffix(), lookup_k=8), k, fresh=True),
        # prompt lookup first (the row's own latest match), the corpus's most frequent continuation where it finds
        # nothing: the suffix chain alone prefers corpus continuations where the row's own text was right
        Row(f"hybrid_ngram_suffix_k{k}", lambda: HybridDrafter(suffix(), lookup_k=k), k, fresh=True,
            options=padded),
        *([Row(f"eagle_chain_k{k}_compiled", eagle, k, sampled=True, options=compiled),
           Row("eagle_dynamic_tree_compiled", eagle, tree, options=compiled)] if compile else []),
    ]


# every row name `rows` and `baselines` make, `{k}` the chain length (known only once the pair is calibrated): a
# `--methods` name that fits none is refused before any model loads (tests/bench/test_bench_text.py holds the two
# lists together)
ROW_FORMS = ("plain", "hf_prompt_lookup", "hf_assisted", "plain_fast_head", "no_draft", "ngram_chain",
             "ngram_chain_k{k}", "draft_chain_k{k}", "eagle_chain_k{k}", "eagle_chain_adaptive", "eagle_chain_auto",
             "eagle_dynamic_tree",
             "hybrid_chain_k{k}", "hybrid_dynamic_tree", "recycling_tree", "suffix_chain", "suffix_chain_k{k}",
             "suffix_tree", "hybrid_suffix_eagle_k{k}", "hybrid_ngram_suffix_k{k}", "eagle_chain_k{k}_compiled",
             "eagle_dynamic_tree_compiled")


def check_row_names(only: Sequence[str] | None) -> None:
    """ValueError naming a `--methods` row no table can have (before anything loads)."""
    if not only:
        return
    forms = [re.compile(re.escape(form).replace(re.escape("{k}"), r"\d+") + "$") for form in ROW_FORMS]
    unknown = [name for name in only if not any(f.match(name) for f in forms)]
    if unknown:
        raise ValueError(f"--methods: no row {', '.join(unknown)}; rows: {', '.join(f.replace('{k}', 'K') for f in ROW_FORMS)} "
                         f"(K: the chain length)")


def baselines(target, draft, n: int, temperature: float | None = None) -> dict[str, Any]:
    """`transformers`' own decoding: plain, and in the greedy table (`temperature` None) its prompt lookup, its
    assisted generation with the pair's draft model, and the LM-head layout `MULTISPEC_FAST_HEAD` opts into."""
    hf_no_eos = dict(eos_token_id=None, pad_token_id=0)
    if temperature is not None:
        return {"plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=True, temperature=temperature,
                                                     top_k=0, **hf_no_eos)}
    greedy = {"plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False, **hf_no_eos),
              "hf_prompt_lookup": with_role("peer", lambda ids: target.generate(
                  ids, max_new_tokens=n, do_sample=False, prompt_lookup_num_tokens=5, **hf_no_eos))}
    if draft is not None:
        greedy["hf_assisted"] = with_role("peer", lambda ids: target.generate(
            ids, max_new_tokens=n, do_sample=False, assistant_model=draft, **hf_no_eos))
    if fast_head_applies(target):
        # control: the model's own decoding through the LM-head layout MULTISPEC_FAST_HEAD opted into (our
        # adapter uses it too), so the table shows how much of a speedup is that layout alone
        greedy["plain_fast_head"] = with_role("control", lambda ids: _with_fast_head(target, lambda: target.generate(
            ids, max_new_tokens=n, do_sample=False, **hf_no_eos)))
    return greedy


def setup_rows(pair, pair_name: str, ps: list, max_new_tokens: int | None, chain_k, tree, corpus_chars: int) -> Setup:
    """What the rows share (`Setup`): the token budget, the chain length (calibrated here from the pair's step
    profiles when it has them and `chain_k` is None or "auto"), the trees, SuffixDecoding's corpus."""
    n = max_new_tokens or 128  # --quick: fewer prompts, not fewer tokens (short runs measure the prefill)
    choice = None
    if chain_k == "auto" or (chain_k is None and pair.step_profiles):
        if not pair.step_profiles:
            raise ValueError(f"--chain-k auto: {pair_name} has no step profiles (`multispec zoo tune "
                             f"{pair_name} --write` records them)")
        prefix = sum(ids.shape[1] for _, ids in ps) // len(ps) + n // 2  # a mid-generation context
        choice = calibrate(pair.target, pair.step_profiles, prefix_tokens=prefix,
                           request=pair.drafter.feature_request)
        print(describe_choice(choice))
        chain_k = choice.chain_k
    # 16 verified nodes: on CPUs Gemma's LM-head GEMM costs about the same for 16 rows as for 8
    tree = tree or pair.tree or DynamicTree(depth=4, topk=4, total=15)
    recycling_tree = pair.recycling_tree or cpu_tree()  # the pair's, chosen on validation, else the CPU default
    corpus = _corpus(pair.tokenizer, corpus_chars) if corpus_chars else None
    return Setup(pair, n, chain_k or pair.chain_k or 4, tree, recycling_tree, corpus, choice)


def run(pair_name: str = "stdlib-bytes-large", options: BenchOptions = BenchOptions(), corpus_chars: int = 1_000_000,
        compile: bool = False, only: tuple[str, ...] | None = None) -> dict:
    """`options.chain_k` / `.tree`: the draft shape of the chain and tree rows (default: for a pair with step
    profiles "auto", the chain length predicted best on this machine from them and the verification cost measured
    here, with the padding that cost favours (`multispec.draft_length`); else the pair's, chosen on the
    validation split, else 4 and 4/4/15). `compile`: also the EAGLE rows on the compiled static step
    (`EngineConfig(step="compiled")`), for pairs whose target the lean engine runs. `options.split`: the prompts'
    split, 'heldout' (test: the reported figures, the default) or 'validation'. `only`: the rows to run (plain
    decoding and the peers always run; `quick` without it: `QUICK_ROWS`); a name no table has raises before anything
    is timed. `rounds`: default 3, 2 with `quick`; `temperature`: default 0.8."""
    check_row_names(only)
    warn_if_busy()
    quick, split, temperature = options.quick, options.split or "heldout", options.temperature or 0.8
    rounds = options.rounds_or(3, quick_default=2)
    options.apply_threads()
    pair = zoo.load(pair_name)
    if compile and lean_unsupported(pair.target) is not None:
        raise ValueError(f"--compile: the compiled step runs Llama-family targets; {pair_name}'s target "
                         f"cannot ({lean_unsupported(pair.target)})")
    ps = prompts(pair.tokenizer, quick, split)
    setup = setup_rows(pair, pair_name, ps, options.max_new_tokens, options.chain_k, options.tree, corpus_chars)
    target, n = setup.pair.target, setup.n
    all_rows = rows(setup, compile)

    def generate(sampling: SamplingConfig, generator=None):
        return lambda ids, drafter, spec, options: speculative_generate(
            target, drafter, ids, max_new_tokens=n, tree=spec, sampling=sampling, stopping=StoppingConfig.never(),
            generator=generator, **options)

    greedy = baselines(target, setup.pair.draft_model, n) | method_table(all_rows, generate(SamplingConfig()))
    greedy = leading(greedy, ("plain", "no_draft"))
    if quick and only is None:  # the first command: the rows the tables are read for, a few minutes in all
        only = tuple(n for n in (r.replace("{k}", str(setup.chain_k)) for r in QUICK_ROWS) if n in greedy)
        only += tuple(n for n in greedy if n.endswith("_compiled"))  # asked for by --compile: kept
    greedy = keep_rows(greedy, only, ["plain", *peers_of(greedy)], "greedy")
    sampling = baselines(target, None, n, temperature) | method_table(
        all_rows, generate(SamplingConfig(do_sample=True, temperature=temperature), torch.Generator().manual_seed(0)),
        sampled=True)
    sampling = keep_rows(sampling, only, ["plain", "no_draft"], "sampling")
    inputs = [ids for _, ids in ps]
    # warm up on the longest prompt: the compiled step's buffers are sized there, so no timed call rebuilds
    # them; with compiled rows on every prompt (each padded width compiles once, when a step first needs it)
    warmup = sorted(inputs, key=lambda ids: -ids.shape[1]) if compile else [max(inputs, key=lambda ids: ids.shape[1])]
    compare = lambda ref, out, ids: classify(target, sequences(ref), sequences(out))  # noqa: E731
    print(f"pair {pair_name}: {len(ps)} prompts x {n} new tokens, {rounds} rounds, {torch.get_num_threads()} threads; "
          f"each table prints when it is measured", flush=True)
    def first_look(table):
        print(format_table(f"greedy, first of {rounds} rounds (the full table follows)", table), flush=True)

    tables = {"greedy": Recorder(greedy, "plain", compare=compare, also_against=peers_of(greedy))
              .run(repeat(inputs, rounds), warmup=warmup, desc="greedy", first_round=first_look)}
    print(format_table("greedy", tables["greedy"]), flush=True)
    torch.manual_seed(0)
    tables["sampling"] = Recorder(sampling, "plain", also_against=["no_draft"]).run(
        repeat(inputs, rounds), warmup=warmup, desc="sampling")
    print(format_table(f"sampling T={temperature}", tables["sampling"]), flush=True)
    settings = _settings(setup, all_rows, pair_name, quick, temperature, ps, corpus_chars, rounds, compile, split, only)
    out = results("text", settings, tables, outputs_identical=outputs_identical(tables))
    _print(out)
    return save_results(out, options.json_path)


# `--quick`'s rows (with the peers): the engine without drafts, each drafter family once, the EAGLE tree
# a sweep's prompts keep their first 256 tokens: with the held-out files' 1200, the prefill was 82% of the time
# timed at B = 32 (benchmarks/results/batch_sweep_stdlib-bytes-large_auto.json), so the sweep measured prefill
SWEEP_PROMPT_TOKENS = 256
QUICK_ROWS = ("no_draft", "ngram_chain_k{k}", "draft_chain_k{k}", "eagle_chain_k{k}", "eagle_chain_auto",
              "eagle_dynamic_tree", "hybrid_chain_k{k}", "recycling_tree", "suffix_tree")
SWEEP_ROWS = ("no_draft", "ngram_chain_k{k}", "eagle_chain_k{k}", "eagle_chain_auto", "eagle_dynamic_tree",
              "hybrid_chain_k{k}")


def run_batch_sweep(pair_name: str = "stdlib-bytes-large", options: BenchOptions = BenchOptions(),
                    batches: Sequence[int] = (1, 2, 4, 8), only: tuple[str, ...] | None = None,
                    plot: str | None = None) -> dict:
    """`bench text --batch`: the batch sweep (`multispec.bench.batch_sweep`) on a zoo pair, greedy; every output
    compared with plain batched `generate` row by row. `only`: the rows (default `SWEEP_ROWS`; plain decoding always
    runs). Tables print as each batch size is measured. `rounds`: default 3, 2 with `quick`; `max_new_tokens`: 64
    with `quick`."""
    check_row_names(only)
    warn_if_busy()
    quick, rounds = options.quick, options.rounds_or(3, quick_default=2)
    options.apply_threads()
    pair = zoo.load(pair_name)
    ps = prompts(pair.tokenizer, quick, options.split or "heldout")
    setup = setup_rows(pair, pair_name, ps, options.max_new_tokens or (64 if quick else None), options.chain_k,
                       options.tree, 0)
    target, n = setup.pair.target, setup.n
    wanted = only or tuple(r.replace("{k}", str(setup.chain_k)) for r in SWEEP_ROWS)
    every = rows(setup, compile=False)
    missing = [name for name in (only or ()) if name not in {r.name for r in every}]
    if missing:  # e.g. eagle_chain_k8 where the length was calibrated to another k
        how = "calibrated on this machine" if setup.choice else "given, or the pair's"
        names = ", ".join(r.name for r in every)
        raise ValueError(f"--methods: no row {', '.join(missing)} here: the chain rows have k = {setup.chain_k} "
                         f"({how}); pass --chain-k to choose it. Rows: {names}")
    all_rows = [r for r in every if r.name in wanted]

    def run(inputs, drafter, spec, options):
        ids, mask = inputs
        return speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=n, tree=spec,
                                    stopping=StoppingConfig.never(), **options)

    def methods_at(b):
        plain = {"plain": lambda inp: target.generate(inp[0], attention_mask=inp[1], max_new_tokens=n,
                                                      do_sample=False, eos_token_id=None, pad_token_id=0)}
        return plain | method_table(all_rows, run)

    compare = lambda ref, out, inp: "identical" if torch.equal(sequences(ref), sequences(out)) else "mismatch"  # noqa

    def shown(b, table):
        print(format_table(f"batch {b} (tokens/s summed over the rows)", table), flush=True)

    tables = sweep(methods_at, [ids for _, ids in ps], batches, rounds, compare, desc="greedy", shown=shown,
                   prompt_tokens=SWEEP_PROMPT_TOKENS)
    settings = {"pair": pair_name, "quick": quick, "batches": list(batches), "max_new_tokens": n,
                "chain_k": setup.chain_k, "rounds": rounds, "threads": torch.get_num_threads(),
                "prompts": [p for p, _ in ps], "prompt_tokens": SWEEP_PROMPT_TOKENS,
                "batch_layout": f"prompts cycled, their first {SWEEP_PROMPT_TOKENS} tokens cut to 60-100%, left-padded",
                "split": "heldout"}
    out = results("text-batch", settings, tables, crossover=crossover(tables), throughput=throughput_table(tables))
    print("\n" + out["throughput"])
    print("crossover (the smallest batch at which a row no longer beats plain batched decoding): "
          + ", ".join(f"{k}: {'none swept' if v is None else f'B={v}'}" for k, v in out["crossover"].items()))
    if plot:
        plot_sweep(tables, plot)
    return save_results(out, options.json_path)


def _settings(setup: Setup, all_rows: list[Row], pair_name: str, quick: bool, temperature: float, ps: list,
              corpus_chars: int, rounds: int, compile: bool, split: str, only) -> dict:
    tree, choice = setup.tree, setup.choice
    settings = {"pair": pair_name, "quick": quick, "max_new_tokens": setup.n, "temperature": temperature,
                "prompts": [p for p, _ in ps], "threads": torch.get_num_threads(), "chain_k": setup.chain_k,
                "dynamic_tree": [tree.depth, tree.topk, tree.total],
                "recycling_tree": tree_to_text(setup.recycling_tree), "corpus_chars": corpus_chars, "rounds": rounds,
                "compile": compile, "split": split, "methods": list(only) if only else "all",
                "chain_k_by": "calibrated here" if choice else "given or the pair's stored choice"}
    if choice is not None:
        padded_rows = [r.name for r in all_rows if "engine" in r.options and r.options["engine"].pad_widths
                       and (only is None or r.name in only)]  # of the rows that ran
        settings["chain_k_calibration"] = {"verify_ms": {str(m): round(v, 2) for m, v in choice.cost.ms.items()},
                                           "pad_widths": {str(m): w for m, w in choice.pad_widths.items()},
                                           "padded_rows": padded_rows,
                                           "predicted_speedup_vs_no_draft": {str(k): v for k, v in
                                                                             choice.predicted.items()}}
    return settings


def peers_of(greedy: dict) -> list[str]:
    """The greedy table's other baselines, where it has them: our engine without drafts, transformers'."""
    return [p for p in ("no_draft", "hf_prompt_lookup", "hf_assisted") if p in greedy]


def warn_if_busy() -> None:
    """A warning at the start of a timed run on a busy machine (its ratios mean little)."""
    note = busy()
    if note:
        print(f"warning: {note}", flush=True)


def _print(res: dict) -> None:
    """What follows the tables (printed as they were measured): the machine, and how to read them."""
    print(f"machine: {describe(res['machine'])}")
    print(f"outputs_identical={res['outputs_identical']} (greedy rows against plain decoding; a near-tie is a "
          f"first difference where the target's top-2 logit gap is below {NEAR_TIE})")
    print(LEGEND)
