"""What bounds speculation on this machine: the target's cost to verify M tree nodes at once (relative to
one token), the LM-head GEMM alone, and the drafter's cost per step, on a zoo pair.

    python benchmarks/probes/verify_cost.py [--pair gemma3-270m-eagle] [--prompt-tokens 400] [--reps 3] [--json PATH]

Speculation pays when mean_accepted_length * t(1) > t(M) + t(draft); this prints t(M) / t(1).
"""

import argparse
import json
import time

import torch

from multispec import Chain, DraftTree, HFCausalLM, SamplingConfig, zoo
from multispec.bench.machine import describe, machine_info
from multispec.prompt import Prompt
from multispec.targets import as_target
from multispec.targets.lm_head import tall_linear
from multispec.zoo.data import read_source, stdlib_files


def best(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="gemma3-270m-eagle")
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = zoo.load(args.pair)
    text = read_source(stdlib_files("heldout")[0])
    ids = pair.tokenizer(text, return_tensors="pt")["input_ids"][:, : args.prompt_tokens]
    target = as_target(pair.target)  # the adapter the loop uses (the lean forward where it applies)
    drafter = pair.drafter
    prompt = Prompt.build(ids)
    roots = target.prefill(prompt, drafter.feature_request).roots

    def verify(m):
        draft = DraftTree.chain(torch.randint(0, 1000, (1, m - 1)))
        tokens = torch.cat([roots[:, None], draft.tokens], 1)
        target.score(tokens, draft.full_parents(), draft.full_valid(), drafter.feature_request)
        target.discard()

    head = pair.target.get_output_embeddings().weight
    sizes = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32]
    results = {"machine": machine_info(), "pair": args.pair, "adapter": type(target).__name__,
               "prefix_tokens": ids.shape[1], "reps": args.reps,
               "verify": [], "draft_chain_ms": {}}
    print(f"pair {args.pair}, prefix {ids.shape[1]} tokens, {torch.get_num_threads()} threads, best of {args.reps}")
    print(f"machine: {describe(results['machine'])}")
    print("verify: one target forward over M tree nodes (our target adapter); LM head alone as")
    print("F.linear(x, W) (what transformers runs) and as W @ x.T (multispec.targets.lm_head)")
    print(f"{'nodes M':>8s} {'verify ms':>10s} {'x t(1)':>7s} {'head linear ms':>15s} {'head tall ms':>13s}")
    t1 = None
    for m in sizes:
        ms = best(lambda: verify(m), args.reps)
        t1 = t1 or ms
        h = torch.randn(m, head.shape[1], dtype=head.dtype)
        hm = best(lambda: torch.nn.functional.linear(h, head), args.reps)
        ht = best(lambda: tall_linear(h, head), args.reps)
        print(f"{m:8d} {ms:10.1f} {ms / t1:7.2f} {hm:15.1f} {ht:13.1f}")
        results["verify"].append({"nodes": m, "verify_ms": round(ms, 2), "x_t1": round(ms / t1, 3),
                                  "head_linear_ms": round(hm, 2), "head_tall_ms": round(ht, 2)})
    feats = HFCausalLM(pair.target).prefill(prompt, drafter.feature_request).features
    for k in (1, 2, 4):
        drafter.start(prompt, feats)
        ms = best(lambda: drafter.propose(ids[:, -1], Chain(k), SamplingConfig()), 1)
        print(f"draft chain k={k}: {ms:.1f} ms per step")
        results["draft_chain_ms"][k] = round(ms, 2)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
