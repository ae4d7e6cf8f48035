"""Where a batch's time goes when its rows draw different numbers of drafts: each step's rows, tokens and seconds
for our engine without drafts, a fixed EAGLE chain and `tree="auto"` on a zoo pair's ragged batch, every row run
to the same budget, in interleaved rounds (one `AdaptiveChain` kept over them, as a benchmark row keeps it). The
steps at the full batch and the tail after its first row finished are summed apart: a chain that wins a step can
lose the batch, which waits for its unluckiest row.

    python benchmarks/probes/batch_stragglers.py --pair gemma3-270m-eagle --batch 8 --chain-k 1 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.adaptive import AdaptiveChain
from multispec.bench.batch_sweep import ragged_batch
from multispec.bench.machine import machine_info
from multispec.bench.text import SWEEP_PROMPT_TOKENS, prompts
from multispec.drafters import NGramDrafter
from multispec.heap import keep_freed_memory


def split(out, batch: int, wall: float) -> dict:
    """One generation's steps at the full batch and after (the tail), with its wall time and prefill."""
    steps = out.stats.steps
    parts = {"full": [s for s in steps if s.rows == batch], "tail": [s for s in steps if s.rows < batch]}
    record = {"wall_s": round(wall, 3), "prefill_s": round(out.stats.prefill_s, 3), "steps": len(steps)}
    for name, part in parts.items():
        seconds = sum(s.draft_s + s.verify_s + s.commit_s for s in part)
        record[name] = {"steps": len(part), "tokens": sum(s.committed for s in part), "seconds": round(seconds, 3),
                        "ms_per_step": round(1e3 * seconds / len(part), 1) if part else None}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="gemma3-270m-eagle")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--chain-k", type=int, default=1, help="the fixed chain's length")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    keep_freed_memory()  # as the CLI and every benchmark run
    pair = zoo.load(args.pair)
    ids, mask = ragged_batch([p for _, p in prompts(pair.tokenizer, True, "heldout")], args.batch, 0,
                             SWEEP_PROMPT_TOKENS)
    auto = AdaptiveChain(max_k=8)
    rows = {"no_draft": (NGramDrafter(), 0), f"eagle_chain_k{args.chain_k}": (pair.drafter, args.chain_k),
            "eagle_chain_auto": (pair.drafter, auto)}
    runs = {name: [] for name in rows}
    for round_ in range(args.rounds + 1):  # round 0 warms up (and `auto` explores): not kept
        for name, (drafter, tree) in rows.items():
            start = time.perf_counter()
            out = speculative_generate(pair.target, drafter, ids, attention_mask=mask, tree=tree,
                                       max_new_tokens=args.max_new_tokens, stopping=StoppingConfig.never())
            record = split(out, args.batch, time.perf_counter() - start)
            if round_:
                runs[name].append(record)
                print(f"round {round_} {name:20s} {record['wall_s']:6.2f} s  full: {record['full']['steps']} steps "
                      f"{record['full']['ms_per_step']} ms {record['full']['tokens']} tokens  tail: "
                      f"{record['tail']['steps']} steps {record['tail']['ms_per_step']} ms "
                      f"{record['tail']['tokens']} tokens", flush=True)
    summary = {name: {"median_wall_s": statistics.median(r["wall_s"] for r in recs),
                      "median_decode_s": statistics.median(r["full"]["seconds"] + r["tail"]["seconds"] for r in recs)}
               for name, recs in runs.items()}
    print(json.dumps(summary))
    results = {"benchmark": "batch-stragglers", "machine": machine_info(),
               "settings": {"pair": args.pair, "batch": args.batch, "chain_k": args.chain_k,
                            "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                            "batch_shape": list(ids.shape)},
               "runs": runs, "summary": summary, "auto_chosen": dict(sorted(
                   {k: auto.chosen.count(k) for k in set(auto.chosen)}.items()))}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
