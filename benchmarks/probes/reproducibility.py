"""Do separate processes print the same tokens for the same seed? Runs the same seeded speculative sampling
(and greedy) generation on a zoo pair in several fresh Python processes and compares their outputs.

    python benchmarks/probes/reproducibility.py [--pair gemma3-270m-eagle] [--processes 2] [--json PATH]

Before the LM-head layout stopped being chosen by timing (multispec.targets.lm_head), a near-tie between
two tokens could go either way from one process to the next on large-vocabulary targets.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from multispec.bench.machine import describe, machine_info

CHILD = """
import json, sys, torch
from multispec import DynamicTree, speculative_generate, zoo
from multispec.zoo.data import read_source, stdlib_files
pair_name, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
pair = zoo.load(pair_name)
texts = [read_source(f)[:600] for f in stdlib_files("heldout")[:2]] + ["The history of the printing press begins"]
out = {}
for i, text in enumerate(texts):
    ids = pair.tokenizer(text, return_tensors="pt")["input_ids"]
    for mode in ("greedy", "sampled"):
        kw = dict(do_sample=True, temperature=0.8, generator=torch.Generator().manual_seed(1234 + i)) \\
            if mode == "sampled" else {}
        res = speculative_generate(pair.target, pair.drafter, ids, max_new_tokens=n,
                                   tree=DynamicTree(depth=4, topk=4, total=15), eos_token_id=[], pad_token_id=0, **kw)
        out[f"prompt{i}-{mode}"] = res.sequences[0, ids.shape[1]:].tolist()
print("RESULT " + json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="gemma3-270m-eagle")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()

    outputs = []
    for p in range(args.processes):
        run = subprocess.run([sys.executable, "-c", CHILD, args.pair, str(args.max_new_tokens), str(args.threads)],
                             capture_output=True, text=True, env=dict(os.environ), check=True)
        line = next(ln for ln in run.stdout.splitlines() if ln.startswith("RESULT "))
        outputs.append(json.loads(line[len("RESULT "):]))
        print(f"process {p + 1}/{args.processes} done")
    same = {key: all(o[key] == outputs[0][key] for o in outputs) for key in outputs[0]}
    results = {"machine": machine_info(), "pair": args.pair, "processes": args.processes,
               "max_new_tokens": args.max_new_tokens, "identical": same, "all_identical": all(same.values()),
               "outputs": outputs[0]}
    print(f"machine: {describe(results['machine'])}")
    for key, ok in same.items():
        print(f"{key:20s} {'identical' if ok else 'DIFFERENT'} across {args.processes} processes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    raise SystemExit(0 if results["all_identical"] else 1)


if __name__ == "__main__":
    main()
