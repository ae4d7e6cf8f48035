"""Choose a zoo pair's Token Recycling tree on the validation split.

Token Recycling drafts a static tree out of the target's recent top-k candidates; on a CPU every verified node
costs, so the tree that pays depends on the pair and the machine (the paper's 80 nodes are sized for a GPU).
Every candidate runs greedy, as `bench text`'s `recycling_tree` row does (one drafter per round, learning across
its prompts), against plain decoding and our engine with no drafts, in interleaved rounds on the validation
prompts; the fastest is chosen. `--write` stores it in the pair's `draft_shape.json`, where `bench text` reads it.

    python benchmarks/choose_recycling_tree.py --pair stdlib-bytes-large --json benchmarks/results/recycling_tree.json

Candidates are written as rank paths (`multispec.drafters.recycling.tree_from_text`): "0,1,0.0" is the root's
top two candidates and the first one's top candidate; "cpu" is the 12-node `cpu_tree()`.
"""

from __future__ import annotations

import argparse
import json

import torch

from multispec import NGramDrafter, StoppingConfig, speculative_generate, zoo
from multispec.bench.machine import describe, save_results
from multispec.bench.recorder import Fresh, Recorder, format_table, repeat, results
from multispec.bench.text import prompts
from multispec.drafters.recycling import TokenRecyclingDrafter, tree_from_text

CANDIDATES = ["0", "0,0.0", "0,1", "0,1,0.0", "0,1,0.0,0.0.0", "0,1,2,0.0,1.0,0.0.0", "cpu"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="stdlib-bytes-large")
    ap.add_argument("--trees", nargs="+", default=CANDIDATES, help=f"candidate trees (default: {' '.join(CANDIDATES)})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--full", action="store_true", help="all validation prompts (default: the quick set)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--write", action="store_true", help="store the chosen tree in the pair's draft_shape.json")
    args = ap.parse_args()
    trees = {text: tree_from_text(text) for text in args.trees}  # a malformed candidate fails before any timing
    torch.set_num_threads(args.threads)
    pair = zoo.load(args.pair)
    target, n = pair.target, args.max_new_tokens
    inputs = [ids for _, ids in prompts(pair.tokenizer, quick=not args.full, split="validation")]

    def recycling(tree):
        def one_round():
            drafter = TokenRecyclingDrafter()
            return lambda ids: speculative_generate(target, drafter, ids, max_new_tokens=n, tree=tree,
                                                    stopping=StoppingConfig.never())
        return Fresh(one_round)

    methods = {"plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None,
                                                    pad_token_id=0),
               "no_draft": lambda ids: speculative_generate(target, NGramDrafter(), ids, max_new_tokens=n, tree=0,
                                                            stopping=StoppingConfig.never())}
    methods |= {f"recycling_{text}": recycling(tree) for text, tree in trees.items()}
    table = Recorder(methods, "plain", also_against=["no_draft"]).run(
        repeat(inputs, args.rounds), warmup=inputs[:1], desc="greedy")
    chosen = max(trees, key=lambda text: table["methods"][f"recycling_{text}"]["speedup"])
    settings = {"pair": args.pair, "split": "validation", "prompts": len(inputs), "rounds": args.rounds,
                "max_new_tokens": n, "threads": torch.get_num_threads(), "rule": "max greedy speedup"}
    out = results("recycling-tree", settings, {"greedy": table}, chosen=chosen)
    print(f"machine: {describe(out['machine'])}")
    print(format_table("greedy", table))
    print(f"chosen on validation: {chosen} ({trees[chosen].max_nodes} nodes)")
    save_results(out, args.json)
    if args.write:
        file = zoo.path(args.pair) / "draft_shape.json"
        if not file.exists():
            raise SystemExit(f"--write: {file} does not exist (choose the chain length first: "
                             "benchmarks/choose_draft_shape.py)")
        shape = json.loads(file.read_text())
        shape["recycling_tree"] = chosen
        shape["recycling_tree_chosen_by"] = (f"python benchmarks/choose_recycling_tree.py --pair {args.pair} "
                                             f"--trees {' '.join(args.trees)} (validation split, {len(inputs)} "
                                             f"prompts x {n} tokens)"
                                             + (f"; results: {args.json}" if args.json else ""))
        file.write_text(json.dumps(shape, indent=2) + "\n")
        print(f"written to {file}")


if __name__ == "__main__":
    main()
