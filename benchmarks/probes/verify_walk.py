"""Where the vectorised tree walk (`tree_verify_random_batched`, all rows in lockstep) overtakes the per-row
reference walk on the CPU: the crossover that `multispec.kernels.tree_verify.BATCHED_FROM` encodes.

    python benchmarks/probes/verify_walk.py [--nodes 24] [--vocab 256] [--reps 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from multispec.bench.machine import describe, machine_info
from multispec.kernels import tree_verify_random_batched, tree_verify_random_ref
from multispec.tree import DraftTree


def walk_inputs(rows: int, nodes: int, vocab: int, seed: int = 1) -> tuple:
    """Arguments of the tree-verification walks for `rows` random trees of `nodes` draft nodes (all valid),
    sampled drafts (with q), about half the children equal to the target's argmax after their parent so
    that paths get accepted, and 30% greedy rows: (tokens, first_child, next_sibling, p, q, uniforms,
    exp_noise, is_greedy)."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((rows, nodes), -1, dtype=torch.long)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(-1, i, (rows,), generator=g)
    tree = DraftTree(torch.randint(0, vocab, (rows, nodes), generator=g), parents,
                     torch.ones(rows, nodes, dtype=torch.bool))
    t = nodes + 1
    p = torch.softmax(torch.randn(rows, t, vocab, generator=g) * 2.5, -1)
    parent_argmax = p.argmax(-1).gather(1, tree.full_parents()[:, 1:].clamp(min=0))
    tree.tokens = torch.where(torch.rand(rows, nodes, generator=g) < 0.5, parent_argmax, tree.tokens)
    first_child, next_sibling = tree.linked()
    tokens = torch.cat([torch.zeros(rows, 1, dtype=torch.long), tree.tokens], 1)
    q = torch.softmax(torch.randn(rows, t, vocab, generator=g) * 2.5, -1)
    uniforms = torch.rand(rows, t, generator=g)
    noise = torch.empty(rows, vocab).exponential_(generator=g)
    greedy = torch.rand(rows, generator=g) < 0.3
    return tokens, first_child, next_sibling, p, q, uniforms, noise, greedy


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
    case = walk_inputs(64, args.nodes, args.vocab)
    for b in (1, 2, 4, 8, 16, 32, 64):
        args_b = [x[:b] for x in case]
        times = []
        for fn in (tree_verify_random_ref, tree_verify_random_batched):
            fn(*args_b)
            t0 = time.perf_counter()
            for _ in range(args.reps):
                fn(*args_b)
            times.append((time.perf_counter() - t0) / args.reps * 1e3)
        print(f"{b:5d} {times[0]:11.3f} {times[1]:11.3f}")
        results["rows"].append({"rows": b, "per_row_ms": round(times[0], 4), "batched_ms": round(times[1], 4)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
