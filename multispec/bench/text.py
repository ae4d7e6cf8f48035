"""Text speed benchmark on a zoo pair (`multispec bench text`).

Same prompts for every method: held-out CPython stdlib files (never trained on) and natural-language
prompts. Greedy: plain decoding, `transformers` prompt lookup, our n-gram drafter, our EAGLE drafter
as a chain and as a dynamic tree, and the hybrid (prompt lookup when it matches, EAGLE otherwise); each output is compared with plain greedy, and a differing token is
classified as a floating-point near-tie when the target's top-2 logit gap there is below 1e-4.
Sampling (temperature 0.8): speed and acceptance only (correctness is the core's chi-square tests).
"""

from __future__ import annotations


import torch
from tqdm.auto import tqdm

from .. import (Chain, DynamicTree, HybridDrafter, NGramDrafter, SuffixDecodingDrafter,
                 TokenRecyclingDrafter, speculative_generate)
from .. import zoo
from ..zoo.data import read_source, stdlib_files
from ..targets.lm_head import fast_head_applies, tall_lm_head
from ..drafters.recycling import cpu_tree
from .machine import describe, machine_info, save_results
from .tally import Tally, table

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


def _with_fast_head(model, fn):
    with tall_lm_head(model):
        return fn()


def _corpus(tokenizer, chars: int) -> list[list[int]]:
    """The stdlib training split (never the held-out prompts) as token documents, for SuffixDecoding."""
    from ..zoo.data import stdlib_files

    docs, total = [], 0
    for path in stdlib_files("train"):
        text = read_source(path)
        docs.append(tokenizer(text)["input_ids"])
        total += len(text)
        if total >= chars:
            break
    return [d if isinstance(d, list) else list(d) for d in docs]


def run(pair_name: str = "gemma3-270m-eagle", quick: bool = False, json_path: str | None = None,
        max_new_tokens: int | None = None, temperature: float = 0.8, threads: int | None = None,
        chain_k: int = 4, tree: DynamicTree | None = None, corpus_chars: int = 1_000_000) -> dict:
    if threads:
        torch.set_num_threads(threads)
    pair = zoo.load(pair_name)
    target, eagle, tok = pair.target, pair.drafter, pair.tokenizer
    # 16 verified nodes: on CPUs the LM-head GEMM costs about the same for 16 rows as for 8
    tree = tree or DynamicTree(depth=4, topk=4, total=15)
    n = max_new_tokens or 128  # --quick: fewer prompts, not fewer tokens (short runs measure the prefill)
    ps = prompts(tok, quick)
    no_eos = dict(eos_token_id=[], pad_token_id=0)
    hf_no_eos = dict(eos_token_id=None, pad_token_id=0)
    # The training-free drafters keep what they learn across the prompts (Token Recycling's hot start,
    # SuffixDecoding's earlier outputs), as they would across a user's requests. Each row has its own
    # instance: one that saw another row's output for the same prompt would draft it back verbatim.
    corpus = _corpus(tok, corpus_chars) if corpus_chars else None

    def suffix():
        return SuffixDecodingDrafter(corpus=corpus)

    def ours(drafter, spec, **kw):
        return lambda ids: speculative_generate(target, drafter() if callable(drafter) else drafter, ids,
                                                max_new_tokens=n, tree=spec, **no_eos, **kw)

    greedy = {
        "plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False, **hf_no_eos),
        "hf_prompt_lookup": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False,
                                                        prompt_lookup_num_tokens=5, **hf_no_eos),
    }
    if fast_head_applies(target):
        # control: the model's own decoding through the LM-head layout MULTISPEC_FAST_HEAD opted into (our
        # adapter uses it too), so the table shows how much of a speedup is that layout alone
        greedy["plain_fast_head"] = lambda ids: _with_fast_head(target, lambda: target.generate(
            ids, max_new_tokens=n, do_sample=False, **hf_no_eos))
    greedy |= {
        # the same lookup as transformers' row (5 tokens), then at the chain length of the other rows
        "ngram_chain": ours(NGramDrafter, 5),
        f"ngram_chain_k{chain_k}": ours(NGramDrafter, chain_k),
        f"eagle_chain_k{chain_k}": ours(eagle, chain_k),
        "eagle_chain_adaptive": ours(eagle, Chain(2 * chain_k, min_prob=0.3)),
        "eagle_dynamic_tree": ours(eagle, tree),
        f"hybrid_chain_k{chain_k}": ours(lambda: HybridDrafter(eagle), chain_k),
        "hybrid_dynamic_tree": ours(lambda: HybridDrafter(eagle), tree),
        "recycling_tree": ours(TokenRecyclingDrafter(), cpu_tree()),
        "suffix_chain": ours(suffix(), 16),
        "suffix_tree": ours(suffix(), DynamicTree(depth=4, topk=4, total=16)),
        f"hybrid_suffix_eagle_k{chain_k}": ours(HybridDrafter(eagle, lookup=suffix(), lookup_k=8), chain_k),
    }
    target.generate(ps[0][1][:, :8], max_new_tokens=4, do_sample=False, **hf_no_eos)  # warm-up
    results: dict[str, dict] = {"machine": machine_info(), "pair": pair_name, "max_new_tokens": n,
                                "temperature": temperature, "prompts": [p for p, _ in ps],
                                "threads": torch.get_num_threads(), "chain_k": chain_k,
                                "dynamic_tree": [tree.depth, tree.topk, tree.total], "corpus_chars": corpus_chars}
    tallies = {name: Tally() for name in greedy}
    # prompts outer, methods inner: a machine whose speed drifts during the run (shared CPUs do) then
    # slows every method alike instead of whichever happened to run during the slow minutes
    for _, ids in tqdm(ps, desc="greedy", unit="prompt"):
        reference = None
        for name, fn in greedy.items():
            seq = tallies[name].run(fn, ids)
            if reference is None:
                reference = seq
            else:
                tallies[name].verdicts.append(_classify(target, reference, seq, ids.shape[1]))
    results["greedy"] = table(tallies, {"speedup_vs_ar": "plain", "speedup_vs_hf_prompt_lookup": "hf_prompt_lookup"})
    verdicts = [v for t in tallies.values() for v in t.verdicts]

    g = torch.Generator().manual_seed(0)
    sample = dict(do_sample=True, temperature=temperature, generator=g)
    sampling = {
        "plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=True, temperature=temperature,
                                             top_k=0, **hf_no_eos),
        f"eagle_chain_k{chain_k}": ours(eagle, chain_k, **sample),
        "eagle_dynamic_tree": ours(eagle, tree, **sample),
        f"hybrid_chain_k{chain_k}": ours(lambda: HybridDrafter(eagle), chain_k, **sample),
        "suffix_tree": ours(suffix(), DynamicTree(depth=4, topk=4, total=16), **sample),
    }
    torch.manual_seed(0)
    stallies = {name: Tally() for name in sampling}
    for _, ids in tqdm(ps, desc="sampling", unit="prompt"):
        for name, fn in sampling.items():
            stallies[name].run(fn, ids)
    results["sampling"] = table(stallies, {"speedup_vs_ar": "plain"})
    results["near_ties"] = verdicts.count("near-tie")
    results["mismatches"] = verdicts.count("mismatch")
    results["outputs_identical"] = results["near_ties"] == 0 and results["mismatches"] == 0
    _print(results, temperature)
    return save_results(results, json_path)


def _print(results: dict, temperature: float) -> None:
    print(f"pair {results['pair']}: {len(results['prompts'])} prompts x {results['max_new_tokens']} new tokens, "
          f"{results['threads']} threads")
    print(f"machine: {describe(results['machine'])}")
    print(f"{'greedy':28s} {'tok/s':>8s} {'vs AR':>7s} {'vs HF PLD':>9s} {'acc. len':>8s} "
          f"{'draft/verify/commit/other ms per step':>38s}  outputs")
    for name, r in results["greedy"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        split = "/".join(f"{v:.2f}" for v in r["per_step"].values()) if "per_step" in r else "-"
        print(f"{name:28s} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f}x {r['speedup_vs_hf_prompt_lookup']:8.2f}x "
              f"{mal:>8s} {split:>38s}  {r.get('outputs', 'reference')}")
    print(f"{'sampling T=' + str(temperature):28s} {'tok/s':>8s} {'vs AR':>7s} {'acc. len':>8s}")
    for name, r in results["sampling"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        print(f"{name:28s} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f}x {mal:>8s}")
    print(f"outputs_identical={results['outputs_identical']} near_ties={results['near_ties']} "
          f"mismatches={results['mismatches']}")
