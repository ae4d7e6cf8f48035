"""The static-shape step against the eager one on the byte pair's EAGLE chain (`multispec.targets.static_step`).

    python benchmarks/probes/static_step.py --json benchmarks/results/static_step_cpu.json [--device cuda] [--threads 2]

Rows (the recorder: warm-up on the first prompt, which is where `torch.compile` compiles and CUDA graphs are
captured; methods interleaved per prompt; rounds): the model's own greedy `generate`, the EAGLE chain k=4 on
the eager lean engines, and the same chain through the static step, uncompiled and compiled (on the CPU
`torch.compile`'s inductor; on CUDA, both static rows replay captured CUDA graphs). Greedy outputs are
compared with `generate` token for token.
"""

from __future__ import annotations

import argparse
import sys

import torch

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.bench.machine import save_results
from multispec.bench.recorder import LEGEND, Recorder, format_table, outputs_identical, repeat, results, sequences
from multispec.bench.text import classify, prompts
from multispec.drafters.eagle import EagleDrafter
from multispec.targets.static_step import capacity_for, static_pair


def run(device: str = "cpu", rounds: int = 3, max_new_tokens: int = 128, chain_k: int = 4,
        node_budget: int = 8, json_path: str | None = None) -> dict:
    dev = torch.device(device)
    pair = zoo.load("stdlib-bytes")
    target = pair.target.to(dev)
    eagle = EagleDrafter(pair.drafter.head.to(dev), target)  # the engine keeps the device it was built on
    inputs = [ids.to(dev) for _, ids in prompts(pair.tokenizer, quick=True)]
    n = max_new_tokens
    capacity = capacity_for(max(ids.shape[1] for ids in inputs), n, node_budget)

    def synced(fn):
        def call(ids):
            out = fn(ids)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return out
        return call

    methods = {
        "plain": synced(lambda ids: target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                                    do_sample=False, eos_token_id=None, pad_token_id=0)),
        f"eagle_chain_k{chain_k}_eager": synced(lambda ids: speculative_generate(target, eagle, ids, max_new_tokens=n,
                                                                                 tree=chain_k,
                                                                                 stopping=StoppingConfig.never())),
    }
    for label, comp in (("static", False), ("static_compiled", True)):
        t_s, d_s = static_pair(target, eagle, capacity=capacity, node_budget=node_budget, compile=comp)
        methods[f"eagle_chain_k{chain_k}_{label}"] = synced(
            lambda ids, t_s=t_s, d_s=d_s: speculative_generate(t_s, d_s, ids, max_new_tokens=n, tree=chain_k,
                                                               stopping=StoppingConfig.never()))
    compare = lambda ref, out, ids: classify(target, sequences(ref), sequences(out))  # noqa: E731
    table = Recorder(methods, "plain", compare=compare, also_against=[f"eagle_chain_k{chain_k}_eager"]).run(
        repeat(inputs, rounds), desc=f"static step ({device})")
    settings = {"device": device, "rounds": rounds, "max_new_tokens": n, "chain_k": chain_k,
                "node_budget": node_budget, "capacity": capacity, "threads": torch.get_num_threads()}
    out = results("static_step", settings, {"greedy": table}, outputs_identical=outputs_identical({"greedy": table}))
    print(format_table(f"byte pair, EAGLE chain k={chain_k}, {device}", table))
    print(LEGEND)
    return save_results(out, json_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args.device, args.rounds, args.max_new_tokens, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
