"""What the C heap costs a batched prefill (`multispec.heap`): plain batched `generate` and our engine without drafts,
one new token each (so the prefill is what is timed), on a zoo pair's ragged batch, in rounds, with the minor page
faults each call took; once in a process with glibc's own thresholds and once with freed memory kept (each in its own
process: the setting is process-wide).

    python benchmarks/probes/heap_prefill.py --pair gemma3-270m-eagle --batch 16 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.bench.batch_sweep import ragged_batch
from multispec.bench.machine import machine_info
from multispec.bench.text import SWEEP_PROMPT_TOKENS, prompts
from multispec.drafters import NGramDrafter
from multispec.heap import heap_state, keep_freed_memory


def measure(pair_name: str, batch: int, rounds: int) -> dict:
    keep_freed_memory()  # off in the control's process (MULTISPEC_KEEP_FREED_MEMORY=0)
    pair = zoo.load(pair_name)
    ids, mask = ragged_batch([p for _, p in prompts(pair.tokenizer, True, "heldout")], batch, 0, SWEEP_PROMPT_TOKENS)
    target = pair.target
    calls = {
        "plain": lambda: target.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False,
                                         eos_token_id=None, pad_token_id=0),
        "no_draft": lambda: speculative_generate(target, NGramDrafter(), ids, attention_mask=mask, max_new_tokens=1,
                                                 tree=0, stopping=StoppingConfig.never()),
    }
    for call in calls.values():
        call()
    seconds = {name: [] for name in calls}
    faults = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            call()
            seconds[name].append(round(time.perf_counter() - start, 3))
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"heap": heap_state(), "batch_shape": list(ids.shape), "threads": torch.get_num_threads(),
            "rows": {name: {"seconds": seconds[name], "median_s": statistics.median(seconds[name]),
                            "minor_faults": faults[name]} for name in calls}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="gemma3-270m-eagle")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--one", choices=["kept", "default"], help=argparse.SUPPRESS)  # a child process's part
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.pair, args.batch, args.rounds)))
        return
    runs = {}
    for which, env_value in (("default", "0"), ("kept", "1")):
        env = dict(os.environ, MULTISPEC_KEEP_FREED_MEMORY=env_value)
        out = subprocess.run([sys.executable, __file__, "--pair", args.pair, "--batch", str(args.batch), "--rounds",
                              str(args.rounds), "--one", which], env=env, capture_output=True, text=True, check=True)
        runs[which] = json.loads(out.stdout.strip().splitlines()[-1])
        rows = runs[which]["rows"]
        print(f"{which:8s} " + "  ".join(f"{name} {row['median_s']:.2f} s ({statistics.median(row['minor_faults'])} "
                                         f"faults)" for name, row in rows.items()), flush=True)
    results = {"benchmark": "heap-prefill", "machine": machine_info(),
               "settings": {"pair": args.pair, "batch": args.batch, "rounds": args.rounds, "max_new_tokens": 1},
               "runs": runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
