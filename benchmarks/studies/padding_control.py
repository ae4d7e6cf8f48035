"""The control for verify-width padding: the same chain, padded as this machine's measured cost says and
not padded, beside plain decoding, our engine with no drafts and `transformers`' prompt lookup, in
interleaved rounds on the validation split (greedy and sampled). `--drafter recycling` runs the pair's
Token Recycling tree instead of an n-gram chain (padded by the cost of widths up to `--chain-k` + 3, or as
`--pad-widths` gives, e.g. another run's calibration).

    python benchmarks/studies/padding_control.py --pair gemma3-270m-eagle --chain-k 7 --json PATH
    python benchmarks/studies/padding_control.py --pair stdlib-bytes-large --chain-k 10 --drafter recycling --json PATH
"""

from __future__ import annotations

import argparse

import torch

from multispec import EngineConfig, NGramDrafter, SamplingConfig, StoppingConfig, speculative_generate, zoo
from multispec.bench.machine import describe, save_results
from multispec.bench.recorder import Fresh, Recorder, format_table, repeat, results
from multispec.bench.text import prompts
from multispec.draft_length import VerifyCost
from multispec.drafters.recycling import TokenRecyclingDrafter, cpu_tree, tree_to_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="gemma3-270m-eagle")
    ap.add_argument("--chain-k", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", choices=["ngram", "recycling"], default="ngram",
                    help="an n-gram chain of --chain-k, or the pair's Token Recycling tree (default: ngram)")
    ap.add_argument("--pad-widths", default=None, metavar="M:W,...",
                    help="pad these widths (nodes, root included) instead of the padding this run's costs give")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = zoo.load(args.pair)
    target, n, k = pair.target, args.max_new_tokens, args.chain_k
    inputs = [ids for _, ids in prompts(pair.tokenizer, quick=True, split="validation")]
    recycled = pair.recycling_tree or cpu_tree()
    prefix = sum(ids.shape[1] for ids in inputs) // len(inputs) + n // 2
    cost = VerifyCost.measure(target, range(1, k + 4), prefix_tokens=prefix)
    pads = cost.padding()
    if args.pad_widths:  # e.g. another run's calibration, to test the padding it chose
        pads = {int(m): int(w) for m, w in (item.split(":") for item in args.pad_widths.split(","))}
    print("verification forward, ms by nodes: " + ", ".join(f"{m}: {v:.1f}" for m, v in cost.ms.items()))
    padding = ", ".join(f"{m}->{w}" for m, w in pads.items()) or "none"
    print(("padding (given): " if args.pad_widths else "padding: ") + padding)
    tables = {}
    for mode, kw in (("greedy", {}), ("sampling", dict(do_sample=True, temperature=0.8))):
        sample = dict(sampling=SamplingConfig(**kw), generator=torch.Generator().manual_seed(0)) if kw else {}
        hf = {"temperature": 0.8, "top_k": 0} if kw else {}

        def ours(spec, pad, sample=sample, make=NGramDrafter):
            return lambda ids: speculative_generate(target, make(), ids, max_new_tokens=n, tree=spec, **sample,
                                                    stopping=StoppingConfig.never(),
                                                    engine=EngineConfig(pad_widths=pad or None))

        if args.drafter == "ngram":
            rows = {f"ngram_chain_k{k}": ours(k, None), f"ngram_chain_k{k}_padded": ours(k, pads)}
        else:  # one drafter per round, learning across its prompts as in the text bench (`Fresh`)
            def recycling(pad, sample=sample):
                def one_round():
                    drafter = TokenRecyclingDrafter()  # learns across the round's prompts
                    return ours(recycled, pad, sample, make=lambda: drafter)
                return Fresh(one_round)
            rows = {"recycling_tree": recycling(None), "recycling_tree_padded": recycling(pads)}

        methods = {"plain": lambda ids, kw=kw, hf=hf: target.generate(ids, max_new_tokens=n, do_sample=bool(kw),
                                                                      eos_token_id=None, pad_token_id=0, **hf),
                   "no_draft": ours(0, None),
                   "hf_prompt_lookup": lambda ids, kw=kw, hf=hf: target.generate(
                       ids, max_new_tokens=n, do_sample=bool(kw), prompt_lookup_num_tokens=5, eos_token_id=None,
                       pad_token_id=0, **hf)} | rows
        tables[mode] = Recorder(methods, "plain", also_against=["no_draft", "hf_prompt_lookup"]).run(
            repeat(inputs, args.rounds), warmup=inputs[:1], desc=mode)
    settings = {"pair": args.pair, "chain_k": k, "drafter": args.drafter, "split": "validation",
                "prompts": len(inputs), "rounds": args.rounds, "max_new_tokens": n, "threads": torch.get_num_threads(),
                "verify_ms": {str(m): round(v, 2) for m, v in cost.ms.items()},
                "pad_widths": {str(m): w for m, w in pads.items()}, "pad_widths_given": bool(args.pad_widths)}
    if args.drafter == "recycling":
        settings["recycling_tree"] = tree_to_text(recycled)
    out = results("padding-control", settings, tables)
    print(f"machine: {describe(out['machine'])}")
    for mode, table in tables.items():
        print(format_table(mode, table))
    save_results(out, args.json)


if __name__ == "__main__":
    main()
