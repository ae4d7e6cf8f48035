"""`multispec bench ssm`: STree on a state-space (or hybrid) zoo pair against its baselines.

Same prompts for every method (held-out stdlib files and natural-language prompts), timed through the
benchmark recorder (warm-up on the same prompts, methods interleaved per prompt in repeated rounds, ratios per
round with their spread): plain decoding (the model's own `generate`), `transformers`' assisted generation (attempted in
the run: it refuses stateful models, and the refusal is reported), plain decoding through our adapter
(`ar_adapter`: one token per step, no drafter; the same prefill and per-token code the speculative rows
use, so `speedup_vs_adapter_ar` isolates what speculation adds), chain speculation with state replay (the
"vanilla SD for SSMs" baseline: the commit re-runs the accepted tokens), chain speculation with the
closed-form state commit, STree with a static and a dynamic tree (all drafted by the pair's draft model),
the chain and STree drafted by a state-space draft model instead (the zoo's 2-layer byte Mamba-2, for the
byte-level pairs), the training-free trees (Token Recycling, SuffixDecoding with the stdlib training split as corpus), a
prompt-lookup chain (a drafter that costs no forward), and the hybrid (prompt lookup when the text
repeats itself, the draft model otherwise) as a chain and with STree. Greedy rows are checked against
plain decoding (a differing token at a target top-2 gap < 1e-4 counts as a near-tie); temperature-1
rows report speed and acceptance (distribution correctness is the core's tests).
"""

from __future__ import annotations

import torch
from transformers import Zamba2ForCausalLM

from multispec import (DynamicTree, HybridDrafter, ModelDrafter, NGramDrafter, SamplingConfig, StaticTree,
                       StoppingConfig, SuffixDecodingDrafter, TokenRecyclingDrafter, speculative_generate, zoo)
from multispec.plugin import (BenchOptions, ByteTokenizer, LEGEND, Recorder, Row, ZooPair, bench_prompts, classify,
                              cpu_tree, describe, format_table, leading, make_perturbed_copy, method_table,
                              outputs_identical, read_source, repeat, results, save_results, sequences, stdlib_files)

from .hybrid import BambaTarget, Zamba2Target
from .mamba1 import MambaTarget
from .mamba2 import Mamba2Target
from .testing import randomised
from .zoo_pair import zamba2_config


def _target(model, replay: bool = False):
    kind = model.config.model_type
    if kind in ("bamba", "zamba2"):
        if replay:
            return None  # no replay baseline for hybrids: their KV cache needs the gather anyway
        return {"bamba": BambaTarget, "zamba2": Zamba2Target}[kind](model)
    return {"mamba2": Mamba2Target, "mamba": MambaTarget}[kind](model, replay=replay)


# Hybrids the zoo has no room to ship trained (its 100 MB are spent): their pair is the zoo-sized target with
# random weights (fixed seed; decays drawn wider and the head scaled, as the test models) drafted by a copy of
# itself with 5% weight noise. The draft costs what the target costs, so no row can beat plain decoding here:
# the pair compares STree with the chain and with plain decoding at equal draft quality, not speed.
RANDOM_PAIRS = {"random-zamba2": "a zoo-sized Zamba2 (zamba2_config) with random weights, drafted by a copy of "
                                 "itself with 5% weight noise (same cost: acceptance and overhead, not speed)"}


def _random_pair(name: str) -> ZooPair:
    torch.manual_seed(0)
    model = Zamba2ForCausalLM(zamba2_config())
    mixers = [layer.mamba if hasattr(layer, "mamba") else layer.mamba_decoder.mamba for layer in model.model.layers]
    target = randomised(model, 8.0, mixers)
    return ZooPair(target, ModelDrafter(make_perturbed_copy(target, noise=0.05, seed=1)), ByteTokenizer(), name)


def _byte_corpus(chars: int) -> list[list[int]] | None:
    """The stdlib training split as byte documents (the byte pairs' vocabulary), for SuffixDecoding."""
    if not chars:
        return None
    docs, total = [], 0
    for path in stdlib_files("train"):
        docs.append(list(read_source(path).encode("utf-8")))
        total += len(docs[-1])
        if total >= chars:
            break
    return docs


def _ssm_draft(pair_name: str):
    """The zoo's Mamba-2 draft model for the byte-level SSM pairs (None for other pairs)."""
    if pair_name not in ("stdlib-mamba2", "stdlib-bamba", "stdlib-zamba2"):
        return None
    return zoo.load("stdlib-mamba2-ssm-draft").drafter


def _assisted_refusal(model, draft_model, ids) -> str | None:
    """Try `transformers`' assisted generation on the pair; None if it runs, else its refusal."""
    try:
        model.generate(ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]), assistant_model=draft_model,
                       max_new_tokens=2, do_sample=False, pad_token_id=0)
    except (ValueError, TypeError, NotImplementedError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def rows(pair_name: str, model, drafter, chain_k: int, tree: DynamicTree, corpus) -> list[Row]:
    """Every speculative row, once (`sampled`: in the sampling table too)."""
    ssm_draft = _ssm_draft(pair_name)
    return [
        Row("ar_adapter", NGramDrafter, 0, sampled=True, role="control"),  # a zero-length draft: a token a step
        *([Row(f"chain_replay_k{chain_k}", drafter, chain_k, options={"replay": True})]
          if _target(model, replay=True) is not None else []),
        Row(f"chain_k{chain_k}", drafter, chain_k, sampled=True),
        Row("stree_static", drafter, StaticTree.full([3, 2, 1, 1])),
        Row("stree_dynamic", drafter, tree, sampled=True),
        # a free drafter for contrast: prompt lookup costs no forward, so it shows the target-side overhead alone
        Row("ngram_chain_k5", NGramDrafter, 5),
        # a state-space draft model (the zoo's 2-layer byte Mamba-2, same vocabulary) instead of the Llama
        *([Row(f"ssm_draft_chain_k{chain_k}", ssm_draft, chain_k), Row("ssm_draft_stree_dynamic", ssm_draft, tree)]
          if ssm_draft is not None else []),
        # the training-free tree drafters (one instance per row and round)
        Row("recycling_tree", TokenRecyclingDrafter, cpu_tree(), fresh=True),
        Row("suffix_tree", lambda: SuffixDecodingDrafter(corpus=corpus), DynamicTree(depth=4, topk=4, total=16),
            fresh=True),
        # prompt lookup when the text repeats itself, the draft model's tree otherwise
        Row(f"hybrid_chain_k{chain_k}", lambda: HybridDrafter(drafter), chain_k, fresh=True),
        Row("hybrid_stree_dynamic", lambda: HybridDrafter(drafter), tree, fresh=True, sampled=True),
    ]


def baselines(model, draft_model, ids, n: int, temperature: float | None = None) -> tuple[dict, str | None]:
    """The model's own `generate` (greedy, or sampling at `temperature`), and in the greedy table
    `transformers`' assisted generation where it runs on the pair; with the refusal it gave (None: it ran)."""
    decode = dict(do_sample=False) if temperature is None else dict(do_sample=True, temperature=temperature, top_k=0)

    def plain(ids, **extra):
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, eos_token_id=None,
                              pad_token_id=0, **decode, **extra)

    if temperature is not None:
        return {"plain": plain}, None
    assisted = _assisted_refusal(model, draft_model, ids) if draft_model is not None else "no draft model"
    methods = {"plain": plain}
    if assisted is None:  # a transformers version that supports it: measure it like the rest
        methods["transformers_assisted"] = lambda ids: plain(ids, assistant_model=draft_model)
    return methods, assisted


def run(pair_name: str = "stdlib-mamba2", options: BenchOptions = BenchOptions(),
        corpus_chars: int = 1_000_000) -> dict:
    """`options.weights`: a trained folder of the pair (`multispec zoo train NAME --out DIR`) instead of the shipped
    one. Defaults: 128 new tokens (48 with `quick`), temperature 1.0, chain length 4, a 5/3/14 dynamic tree,
    3 rounds."""
    options.apply_threads()
    quick, weights, temperature = options.quick, options.weights, options.temperature or 1.0
    chain_k, rounds = options.chain_k or 4, options.rounds_or(3)
    pair = _random_pair(pair_name) if pair_name in RANDOM_PAIRS else zoo.load(pair_name, weights=weights)
    model, drafter, tok = pair.target, pair.drafter, pair.tokenizer
    tree = options.tree or DynamicTree(depth=5, topk=3, total=14)
    n = options.max_new_tokens or (48 if quick else 128)
    ps = bench_prompts(tok, quick)
    all_rows = rows(pair_name, model, drafter, chain_k, tree, _byte_corpus(corpus_chars))

    def generate(sampling: SamplingConfig, generator=None):
        def one(ids, draft, spec, options):
            return speculative_generate(_target(model, options.get("replay", False)), draft, ids, max_new_tokens=n,
                                        tree=spec, sampling=sampling, stopping=StoppingConfig.never(),
                                        generator=generator)
        return one

    draft_model = getattr(getattr(drafter, "lm", None), "model", None)  # a model drafter's model, if any
    greedy, assisted = baselines(model, draft_model, ps[0][1], n)
    greedy = leading(greedy | method_table(all_rows, generate(SamplingConfig())), ("plain", "ar_adapter"))
    sampled = baselines(model, None, None, n, temperature)[0] | method_table(
        all_rows, generate(SamplingConfig(do_sample=True, temperature=temperature), torch.Generator().manual_seed(0)),
        sampled=True)
    inputs = [ids for _, ids in ps]
    compare = lambda ref, out, ids: classify(model, sequences(ref), sequences(out))  # noqa: E731
    tables = {"greedy": Recorder(greedy, "plain", compare=compare, also_against=["ar_adapter"])
              .run(repeat(inputs, rounds), desc=f"bench ssm ({pair_name}) greedy")}
    torch.manual_seed(0)
    tables["sampling"] = Recorder(sampled, "plain", also_against=["ar_adapter"]).run(
        repeat(inputs, rounds), desc=f"bench ssm ({pair_name}) sampling")
    settings = {"pair": pair_name, "target_class": type(model).__name__, "quick": quick, "max_new_tokens": n,
                "prompts": [p for p, _ in ps], "threads": torch.get_num_threads(), "chain_k": chain_k,
                "dynamic_tree": [tree.depth, tree.topk, tree.total], "static_tree": [3, 2, 1, 1],
                "temperature": temperature, "corpus_chars": corpus_chars, "rounds": rounds,
                "weights": "random (seed 0)" if pair_name in RANDOM_PAIRS else weights or "shipped",
                "pair_note": RANDOM_PAIRS.get(pair_name)}
    out = results("ssm", settings, tables, outputs_identical=outputs_identical(tables),
                  transformers_assisted="measured" if assisted is None else f"unsupported ({assisted})")
    _print(out)
    return save_results(out, options.json_path)


def _print(res: dict) -> None:
    s = res["settings"]
    print(f"pair {s['pair']} ({s['target_class']}): {len(s['prompts'])} prompts x {s['max_new_tokens']} new tokens, "
          f"{s['threads']} threads")
    print(f"machine: {describe(res['machine'])}")
    print(format_table("greedy", res["tables"]["greedy"]))
    print(format_table(f"sampling T={s['temperature']}", res["tables"]["sampling"]))
    print("vs plain: against the model's own generate; vs ar_adapter: against our loop, one token per step")
    print(f"transformers assisted generation: {res['transformers_assisted']}")
    print(f"outputs_identical={res['outputs_identical']} (greedy rows against plain decoding)")
    print(LEGEND)
