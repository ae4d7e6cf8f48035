"""`multispec bench ssm`: STree on a state-space (or hybrid) zoo pair against its baselines.

Same prompts for every method (held-out stdlib files and natural-language prompts), methods interleaved
per prompt: plain decoding (the model's own `generate`), `transformers`' assisted generation (attempted in
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
from tqdm.auto import tqdm

from multispec import (DynamicTree, HybridDrafter, NGramDrafter, StaticTree, SuffixDecodingDrafter,
                       TokenRecyclingDrafter, speculative_generate, zoo)
from multispec.bench.machine import describe, machine_info, save_results
from multispec.bench.tally import Tally, table
from multispec.bench.text import classify, prompts
from multispec.drafters.recycling import cpu_tree

from .hybrid import BambaTarget
from .mamba1 import MambaTarget
from .mamba2 import Mamba2Target


def _target(model, replay: bool = False):
    kind = model.config.model_type
    if kind == "bamba":
        if replay:
            return None  # no replay baseline for hybrids: their KV cache needs the gather anyway
        return BambaTarget(model)
    return {"mamba2": Mamba2Target, "mamba": MambaTarget}[kind](model, replay=replay)


def _byte_corpus(chars: int) -> list[list[int]] | None:
    """The stdlib training split as byte documents (the byte pairs' vocabulary), for SuffixDecoding."""
    if not chars:
        return None
    from multispec.zoo.data import read_source, stdlib_files

    docs, total = [], 0
    for path in stdlib_files("train"):
        docs.append(list(read_source(path).encode("utf-8")))
        total += len(docs[-1])
        if total >= chars:
            break
    return docs


def _ssm_draft(pair_name: str):
    """The zoo's Mamba-2 draft model for the byte-level SSM pairs (None for other pairs)."""
    if pair_name not in ("stdlib-mamba2", "stdlib-bamba"):
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


def run(pair_name: str = "stdlib-mamba2", quick: bool = False, json_path: str | None = None,
        max_new_tokens: int | None = None, temperature: float = 1.0, threads: int | None = None,
        chain_k: int = 4, tree: DynamicTree | None = None, corpus_chars: int = 1_000_000) -> dict:
    if threads:
        torch.set_num_threads(threads)
    pair = zoo.load(pair_name)
    model, drafter, tok = pair.target, pair.drafter, pair.tokenizer
    tree = tree or DynamicTree(depth=5, topk=3, total=14)
    static = StaticTree.full([3, 2, 1, 1])
    n = max_new_tokens or (48 if quick else 128)
    ps = prompts(tok, quick)
    no_eos = dict(eos_token_id=[], pad_token_id=0)

    def spec(tree_spec, replay=False, draft=drafter, **kw):
        return lambda ids: speculative_generate(_target(model, replay), draft, ids, max_new_tokens=n,
                                                tree=tree_spec, **no_eos, **kw)

    greedy = {"plain": lambda ids: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                                  do_sample=False, eos_token_id=None, pad_token_id=0)}
    greedy["ar_adapter"] = spec(0, draft=NGramDrafter())  # a zero-length draft: one token per step
    draft_model = getattr(getattr(drafter, "lm", None), "model", None)
    assisted = _assisted_refusal(model, draft_model, ps[0][1]) if draft_model is not None else "no draft model"
    if assisted is None:  # a transformers version that supports it: measure it like the rest
        greedy["transformers_assisted"] = lambda ids: model.generate(
            ids, attention_mask=torch.ones_like(ids), assistant_model=draft_model, max_new_tokens=n,
            do_sample=False, eos_token_id=None, pad_token_id=0)
    if _target(model, replay=True) is not None:
        greedy[f"chain_replay_k{chain_k}"] = spec(chain_k, replay=True)
    greedy[f"chain_k{chain_k}"] = spec(chain_k)
    greedy["stree_static"] = spec(static)
    greedy["stree_dynamic"] = spec(tree)
    # a free drafter for contrast: prompt lookup costs no forward, so it shows the target-side overhead alone
    greedy["ngram_chain_k5"] = spec(5, draft=NGramDrafter())
    # a state-space draft model (the zoo's 2-layer byte Mamba-2, same vocabulary) instead of the Llama
    ssm_draft = _ssm_draft(pair_name)
    if ssm_draft is not None:
        greedy[f"ssm_draft_chain_k{chain_k}"] = spec(chain_k, draft=ssm_draft)
        greedy["ssm_draft_stree_dynamic"] = spec(tree, draft=ssm_draft)
    # the training-free tree drafters (one instance per row: each keeps what it learns across prompts)
    greedy["recycling_tree"] = spec(cpu_tree(), draft=TokenRecyclingDrafter())
    greedy["suffix_tree"] = spec(DynamicTree(depth=4, topk=4, total=16),
                                 draft=SuffixDecodingDrafter(corpus=_byte_corpus(corpus_chars)))
    # prompt lookup when the text repeats itself, the draft model's tree otherwise
    greedy[f"hybrid_chain_k{chain_k}"] = spec(chain_k, draft=HybridDrafter(drafter))
    greedy["hybrid_stree_dynamic"] = spec(tree, draft=HybridDrafter(drafter))
    g = torch.Generator().manual_seed(0)
    sampled = {"plain": lambda ids: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                                   do_sample=True, temperature=temperature, top_k=0,
                                                   eos_token_id=None, pad_token_id=0),
               "ar_adapter": spec(0, draft=NGramDrafter(), do_sample=True, temperature=temperature, generator=g),
               f"chain_k{chain_k}": spec(chain_k, do_sample=True, temperature=temperature, generator=g),
               "stree_dynamic": spec(tree, do_sample=True, temperature=temperature, generator=g),
               "hybrid_stree_dynamic": spec(tree, draft=HybridDrafter(drafter), do_sample=True,
                                            temperature=temperature, generator=g)}

    greedy["plain"](ps[0][1][:, :16])  # warm-up
    gacc = {name: Tally() for name in greedy}
    sacc = {name: Tally() for name in sampled}
    torch.manual_seed(0)
    for _, ids in tqdm(ps, desc=f"bench ssm ({pair_name})", unit="prompt"):
        reference = None
        for name, fn in greedy.items():
            seq = gacc[name].run(fn, ids)
            if reference is None:
                reference = seq
            else:
                gacc[name].verdicts.append(classify(model, reference, seq))
        for name, fn in sampled.items():
            sacc[name].run(fn, ids)
    baselines = {"speedup_vs_ar": "plain", "speedup_vs_adapter_ar": "ar_adapter"}
    results = {"machine": machine_info(), "pair": pair_name, "target_class": type(model).__name__, "max_new_tokens": n,
               "prompts": [p for p, _ in ps], "threads": torch.get_num_threads(), "chain_k": chain_k,
               "dynamic_tree": [tree.depth, tree.topk, tree.total], "static_tree": [3, 2, 1, 1],
               "temperature": temperature, "greedy": table(gacc, baselines), "sampling": table(sacc, baselines),
               "transformers_assisted": "measured" if assisted is None else f"unsupported ({assisted})"}
    verdicts = [v for t in gacc.values() for v in t.verdicts]
    results["near_ties"] = verdicts.count("near-tie")
    results["mismatches"] = verdicts.count("mismatch")
    results["outputs_identical"] = results["near_ties"] == 0 and results["mismatches"] == 0
    _print(results)
    return save_results(results, json_path)


def _print(results: dict) -> None:
    print(f"pair {results['pair']} ({results['target_class']}): {len(results['prompts'])} prompts x "
          f"{results['max_new_tokens']} new tokens, {results['threads']} threads")
    print(f"machine: {describe(results['machine'])}")
    for kind, title in (("greedy", "greedy"), ("sampling", f"sampling T={results['temperature']}")):
        print(f"{title:24s} {'tok/s':>8s} {'vs AR':>7s} {'vs ours':>7s} {'acc. len':>8s} "
              f"{'draft/verify/commit/other ms per step':>38s}  outputs")
        for name, r in results[kind].items():
            mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
            ours = f"{r['speedup_vs_adapter_ar']:6.2f}x" if "speedup_vs_adapter_ar" in r else f"{'-':>7s}"
            split = "/".join(f"{v:.2f}" for v in r["per_step"].values()) if "per_step" in r else "-"
            shown = r.get("outputs", "reference" if kind == "greedy" else "")
            print(f"{name:24s} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f}x {ours} {mal:>8s} {split:>38s}  {shown}")
    print("vs AR: against the model's own generate; vs ours: against ar_adapter (our loop, one token per step)")
    print(f"transformers assisted generation: {results['transformers_assisted']}")
    print(f"outputs_identical={results['outputs_identical']} near_ties={results['near_ties']} "
          f"mismatches={results['mismatches']}")
