"""Where the vectorised tree walk (`tree_verify_random_batched`, all rows in lockstep) overtakes the per-row
reference walk on the CPU: the crossover that `multispec.kernels.tree_verify.BATCHED_FROM` encodes.

    python benchmarks/verify_walk.py [--nodes 24] [--vocab 256] [--reps 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "kernels"))
from kernel_inputs import tree_case  # noqa: E402

from multispec.bench.machine import describe, machine_info  # noqa: E402
from multispec.kernels import tree_verify_random_batched, tree_verify_random_ref  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = {"machine": machine_info(), "nodes": args.nodes, "vocab": args.vocab, "rows": []}
    print(f"machine: {describe(results['machine'])}")
    print(f"{'rows':>5s} {'per-row ms':>11s} {'batched ms':>11s}")
    case = tree_case(b=72, n=args.nodes, v=args.vocab, seed=1, with_q=True)
    for b in (1, 2, 4, 8, 16, 32, 64):
        args_b = [None if x is None else x[8:8 + b] for x in case]  # rows 0-7 hold the awkward cases
        times = []
        for fn in (tree_verify_random_ref, tree_verify_random_batched):
            fn(*args_b[:7], args_b[7].bool())
            t0 = time.perf_counter()
            for _ in range(args.reps):
                fn(*args_b[:7], args_b[7].bool())
            times.append((time.perf_counter() - t0) / args.reps * 1e3)
        print(f"{b:5d} {times[0]:11.3f} {times[1]:11.3f}")
        results["rows"].append({"rows": b, "per_row_ms": round(times[0], 4), "batched_ms": round(times[1], 4)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
