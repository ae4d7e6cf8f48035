"""Text speed benchmark on a zoo pair (`multispec bench text`).

Same prompts for every method: held-out CPython stdlib files (never trained on) and natural-language
prompts. Greedy: plain decoding, `transformers` prompt lookup, our n-gram drafter, our EAGLE drafter
as a chain and as a dynamic tree, and the hybrid (prompt lookup when it matches, EAGLE otherwise); each output is compared with plain greedy, and a differing token is
classified as a floating-point near-tie when the target's top-2 logit gap there is below 1e-4.
Sampling (temperature 0.8): speed and acceptance only (correctness is the core's chi-square tests).
"""

from __future__ import annotations

import json
import time

import torch
from tqdm.auto import tqdm

from .. import DynamicTree, HybridDrafter, NGramDrafter, speculative_generate
from .. import zoo
from ..zoo.data import read_source, stdlib_files
from .machine import describe, machine_info

NATURAL = [
    "The history of the printing press begins in the fifteenth century, when",
    "To make a good cup of tea, first",
    "Photosynthesis is the process by which plants",
    "Dear committee members, I am writing to",
]
NEAR_TIE = 1e-4


def prompts(tokenizer, quick: bool) -> list[tuple[str, torch.Tensor]]:
    files = stdlib_files("heldout")[: 2 if quick else 6]
    out = []
    for f in files:
        text = read_source(f)
        out.append((f"stdlib:{f.name}", text[:1200]))
    out += [(f"natural:{i}", t) for i, t in enumerate(NATURAL[: 1 if quick else 4])]
    return [(name, tokenizer(text, return_tensors="pt")["input_ids"]) for name, text in out]


@torch.no_grad()
def _classify(target, reference: torch.Tensor, other: torch.Tensor, prompt_len: int) -> str:
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


def _time(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(pair_name: str = "gemma3-270m-eagle", quick: bool = False, json_path: str | None = None,
        max_new_tokens: int | None = None, temperature: float = 0.8, threads: int | None = None,
        chain_k: int = 4, tree: DynamicTree | None = None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    pair = zoo.load(pair_name)
    target, eagle, tok = pair.target, pair.drafter, pair.tokenizer
    # 16 verified nodes: on CPUs the LM-head GEMM costs about the same for 16 rows as for 8
    tree = tree or DynamicTree(depth=4, topk=4, total=15)
    n = max_new_tokens or (48 if quick else 128)
    ps = prompts(tok, quick)
    no_eos = dict(eos_token_id=[], pad_token_id=0)
    hf_no_eos = dict(eos_token_id=None, pad_token_id=0)

    greedy = {
        "plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False, **hf_no_eos),
        "hf_prompt_lookup": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False,
                                                        prompt_lookup_num_tokens=5, **hf_no_eos),
        # the same lookup as transformers' row (5 tokens), then at the chain length of the other rows
        "ngram_chain": lambda ids: speculative_generate(target, NGramDrafter(), ids, max_new_tokens=n, tree=5,
                                                        **no_eos),
        f"ngram_chain_k{chain_k}": lambda ids: speculative_generate(target, NGramDrafter(), ids, max_new_tokens=n,
                                                                    tree=chain_k, **no_eos),
        f"eagle_chain_k{chain_k}": lambda ids: speculative_generate(target, eagle, ids, max_new_tokens=n,
                                                                    tree=chain_k, **no_eos),
        "eagle_dynamic_tree": lambda ids: speculative_generate(target, eagle, ids, max_new_tokens=n, tree=tree,
                                                               **no_eos),
        f"hybrid_chain_k{chain_k}": lambda ids: speculative_generate(target, HybridDrafter(eagle), ids,
                                                                     max_new_tokens=n, tree=chain_k, **no_eos),
        "hybrid_dynamic_tree": lambda ids: speculative_generate(target, HybridDrafter(eagle), ids, max_new_tokens=n,
                                                                tree=tree, **no_eos),
    }
    target.generate(ps[0][1][:, :8], max_new_tokens=4, do_sample=False, **hf_no_eos)  # warm-up
    results: dict[str, dict] = {"machine": machine_info(), "pair": pair_name, "max_new_tokens": n,
                                "temperature": temperature, "prompts": [p for p, _ in ps],
                                "threads": torch.get_num_threads(), "greedy": {}, "sampling": {}}
    counts = {"identical": 0, "near-tie": 0, "mismatch": 0}
    acc = {name: {"secs": 0.0, "toks": 0, "committed": 0, "forwards": 0, "verdicts": []} for name in greedy}
    # prompts outer, methods inner: a machine whose speed drifts during the run (shared CPUs do) then
    # slows every method alike instead of whichever happened to run during the slow minutes
    for i, (_, ids) in enumerate(tqdm(ps, desc="greedy", unit="prompt")):
        reference = None
        for name, fn in greedy.items():
            out, dt = _time(lambda: fn(ids))
            seq = out.sequences if hasattr(out, "stats") else out
            a = acc[name]
            if name == "plain":
                reference = seq
            else:
                a["verdicts"].append(_classify(target, reference, seq, ids.shape[1]))
            a["secs"] += dt
            a["toks"] += seq.shape[1] - ids.shape[1]
            if hasattr(out, "stats"):
                a["committed"] += out.stats.committed
                a["forwards"] += sum(st.rows for st in out.stats.steps)
    for name, a in acc.items():
        for v in a["verdicts"]:
            counts[v] += 1
        results["greedy"][name] = {
            "tokens_per_s": round(a["toks"] / a["secs"], 3), "seconds": round(a["secs"], 2), "tokens": a["toks"],
            "mean_accepted_length": round(a["committed"] / a["forwards"], 3) if a["forwards"] else None,
            "outputs": {v: a["verdicts"].count(v) for v in set(a["verdicts"])}}
    base = results["greedy"]["plain"]["tokens_per_s"]
    for r in results["greedy"].values():
        r["speedup_vs_ar"] = round(r["tokens_per_s"] / base, 3)
    lookup = results["greedy"]["hf_prompt_lookup"]["tokens_per_s"]
    for r in results["greedy"].values():
        r["speedup_vs_hf_prompt_lookup"] = round(r["tokens_per_s"] / lookup, 3)

    g = torch.Generator().manual_seed(0)
    sampling = {
        "plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=True, temperature=temperature,
                                             top_k=0, **hf_no_eos),
        f"eagle_chain_k{chain_k}": lambda ids: speculative_generate(
            target, eagle, ids, max_new_tokens=n, tree=chain_k, do_sample=True, temperature=temperature,
            generator=g, **no_eos),
        "eagle_dynamic_tree": lambda ids: speculative_generate(
            target, eagle, ids, max_new_tokens=n, tree=tree, do_sample=True, temperature=temperature, generator=g,
            **no_eos),
        f"hybrid_chain_k{chain_k}": lambda ids: speculative_generate(
            target, HybridDrafter(eagle), ids, max_new_tokens=n, tree=chain_k, do_sample=True,
            temperature=temperature, generator=g, **no_eos),
    }
    torch.manual_seed(0)
    sacc = {name: {"secs": 0.0, "toks": 0, "committed": 0, "forwards": 0} for name in sampling}
    for _, ids in tqdm(ps, desc="sampling", unit="prompt"):
        for name, fn in sampling.items():
            out, dt = _time(lambda: fn(ids))
            seq = out.sequences if hasattr(out, "stats") else out
            a = sacc[name]
            a["secs"] += dt
            a["toks"] += seq.shape[1] - ids.shape[1]
            if hasattr(out, "stats"):
                a["committed"] += out.stats.committed
                a["forwards"] += sum(st.rows for st in out.stats.steps)
    for name, a in sacc.items():
        results["sampling"][name] = {
            "tokens_per_s": round(a["toks"] / a["secs"], 3), "seconds": round(a["secs"], 2),
            "mean_accepted_length": round(a["committed"] / a["forwards"], 3) if a["forwards"] else None}
    sbase = results["sampling"]["plain"]["tokens_per_s"]
    for r in results["sampling"].values():
        r["speedup_vs_ar"] = round(r["tokens_per_s"] / sbase, 3)
    results["outputs_identical"] = counts["mismatch"] == 0 and counts["near-tie"] == 0
    results["near_ties"] = counts["near-tie"]
    results["mismatches"] = counts["mismatch"]
    _print(results, temperature)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
    return results


def _print(results: dict, temperature: float) -> None:
    print(f"pair {results['pair']}: {len(results['prompts'])} prompts x {results['max_new_tokens']} new tokens, "
          f"{results['threads']} threads")
    print(f"machine: {describe(results['machine'])}")
    print(f"{'greedy':28s} {'tok/s':>8s} {'vs AR':>7s} {'vs HF PLD':>9s} {'acc. len':>8s}  outputs")
    for name, r in results["greedy"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        print(f"{name:28s} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f}x {r['speedup_vs_hf_prompt_lookup']:8.2f}x "
              f"{mal:>8s}  {r['outputs'] or 'reference'}")
    print(f"{'sampling T=' + str(temperature):28s} {'tok/s':>8s} {'vs AR':>7s} {'acc. len':>8s}")
    for name, r in results["sampling"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        print(f"{name:28s} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f}x {mal:>8s}")
    print(f"outputs_identical={results['outputs_identical']} near_ties={results['near_ties']} "
          f"mismatches={results['mismatches']}")
