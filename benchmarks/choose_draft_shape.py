"""Choose a zoo pair's draft shape (chain length, dynamic tree) on the validation split.

Every candidate, greedy and sampled (T = 0.8), against plain decoding and our engine with no drafts, in
interleaved rounds on validation prompts (stdlib files no recipe trained on, see `multispec.zoo.data`); the
chosen chain and tree maximise the mean of the greedy and sampled speedups over plain decoding. The test
split (the held-out files) is then run once with the choice: `multispec bench text`.

    python benchmarks/choose_draft_shape.py --pair stdlib-bytes-large --json benchmarks/results/shapes.json
    python benchmarks/choose_draft_shape.py --pair gemma3-270m-eagle --drafter ngram --chains 2,3,4,5 --trees none

Beside the timings it records each chain length's step profile (verification widths and tokens committed,
`multispec.draft_length.StepProfile`) and this machine's verification cost at those widths, and prints the
length those predict: `--write-profile` stores the profiles in the pair's `draft_shape.json`, so that
`bench text --chain-k auto` chooses the length for the machine it runs on.

`--drafter`: whose drafts the candidates verify (the pair's EAGLE head, or prompt lookup: on a target whose
verification cost jumps with the number of rows, the lookup rows are the fast ones and the chain length is
chosen for them); `--trees none` chooses the chain length only.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from multispec import DynamicTree, NGramDrafter, SamplingConfig, StoppingConfig, speculative_generate, zoo
from multispec.bench.machine import describe, save_results
from multispec.draft_length import StepProfile, VerifyCost, choose_chain_length, describe_choice
from multispec.bench.recorder import Recorder, format_table, repeat, results
from multispec.bench.text import prompts

CHAINS = "4,5,6,8"
TREES = "4/4/15,4/3/11,5/3/11,6/2/11"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="stdlib-bytes-large")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--full", action="store_true", help="all validation prompts (default: the quick set)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", choices=["eagle", "ngram"], default="eagle")
    ap.add_argument("--chains", default=CHAINS, help=f"chain lengths to try (default {CHAINS})")
    ap.add_argument("--trees", default=TREES, help=f"dynamic trees D/K/N to try, or none (default {TREES})")
    ap.add_argument("--json", default=None)
    ap.add_argument("--write-profile", action="store_true",
                    help="store the chain lengths' step profiles in the pair's draft_shape.json")
    args = ap.parse_args()
    chains = [int(k) for k in args.chains.split(",")]
    trees = [] if args.trees == "none" else [tuple(int(x) for x in t.split("/")) for t in args.trees.split(",")]
    torch.set_num_threads(args.threads)
    pair = zoo.load(args.pair)
    target, n = pair.target, args.max_new_tokens
    drafter = pair.drafter if args.drafter == "eagle" else NGramDrafter()
    inputs = [ids for _, ids in prompts(pair.tokenizer, quick=not args.full, split="validation")]
    tables = {}
    runs = defaultdict(list)  # (chain_k, mode) -> the stats of every run (warm-up included): the step profiles
    for mode, kw in (("greedy", {}), ("sampling", dict(do_sample=True, temperature=0.8))):
        g = torch.Generator().manual_seed(0)
        sample = dict(sampling=SamplingConfig(**kw), generator=g) if kw else {}

        def ours(drafter, spec, sample=sample, mode=mode):
            def run(ids):
                out = speculative_generate(target, drafter, ids, max_new_tokens=n, tree=spec,
                                           **sample, stopping=StoppingConfig.never())
                if isinstance(spec, int):
                    runs[spec, mode].append(out.stats)
                return out
            return run

        methods = {"plain": lambda ids, kw=kw: target.generate(ids, max_new_tokens=n, do_sample=bool(kw),
                                                               eos_token_id=None, pad_token_id=0,
                                                               **({"temperature": 0.8, "top_k": 0} if kw else {})),
                   "no_draft": ours(NGramDrafter(), 0)}
        methods |= {f"chain_k{k}": ours(drafter, k) for k in chains}
        methods |= {f"tree_{d}/{t}/{m}": ours(drafter, DynamicTree(d, t, m)) for d, t, m in trees}
        tables[mode] = Recorder(methods, "plain", also_against=["no_draft"]).run(
            repeat(inputs, args.rounds), warmup=inputs[:1], desc=mode)

    def score(name: str) -> float:
        return (tables["greedy"]["methods"][name]["speedup"] + tables["sampling"]["methods"][name]["speedup"]) / 2

    chain = max((f"chain_k{k}" for k in chains), key=score)
    tree = max((f"tree_{d}/{t}/{m}" for d, t, m in trees), key=score) if trees else None
    chosen = {"chain_k": int(chain[len("chain_k"):]), "tree": tree[len("tree_"):] if tree else None}
    settings = {"pair": args.pair, "drafter": args.drafter, "split": "validation", "prompts": len(inputs),
                "rounds": args.rounds,
                "max_new_tokens": n, "threads": torch.get_num_threads(),
                "rule": "max mean of greedy and sampled speedup"}
    cost = VerifyCost.measure(target, sorted({w for stats in runs.values() for s in stats for w in
                                              [1 + st.drafted for st in s.steps]}),
                              prefix_tokens=int(sum(ids.shape[1] for ids in inputs) / len(inputs)) + n // 2,
                              request=drafter.feature_request)
    profiles = [StepProfile.from_stats(k, mode, stats, cost) for (k, mode), stats in sorted(runs.items())]
    predicted = choose_chain_length(profiles, cost)
    out = results("draft-shape", settings, tables, chosen=chosen,
                  profiles=[p.to_json() for p in profiles],
                  verify_ms={str(m): round(v, 2) for m, v in cost.ms.items()},
                  predicted={"chain_k": predicted.chain_k,
                             "speedup_vs_no_draft": {str(k): v for k, v in predicted.predicted.items()}})
    print(f"machine: {describe(out['machine'])}")
    for mode, table in tables.items():
        print(format_table(mode, table))
    print(f"chosen on validation: chain k={chosen['chain_k']}, tree {chosen['tree'] or '(not chosen)'}")
    print("from the step profiles and this machine's verification cost:\n" + describe_choice(predicted))
    save_results(out, args.json)
    if args.write_profile:
        file = zoo.path(args.pair) / "draft_shape.json"
        shape = json.loads(file.read_text()) if file.exists() else {"chain_k": chosen["chain_k"], "tree": None}
        shape["profiles"] = [p.to_json() for p in profiles]
        shape["profiled_drafter"] = args.drafter
        shape["profiled_by"] = (f"python benchmarks/choose_draft_shape.py --pair {args.pair} --drafter {args.drafter} "
                                f"--chains {args.chains} (validation split, {len(inputs)} prompts x {n} tokens)")
        file.write_text(json.dumps(shape, indent=2) + "\n")
        print(f"step profiles written to {file}")


if __name__ == "__main__":
    main()
