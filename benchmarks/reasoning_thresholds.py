"""SpecReason's threshold and the judge's, chosen on a validation split (never the test split): accuracy,
latency and acceptance of each setting beside the base model alone, on problems drawn with another seed.

    python benchmarks/reasoning_thresholds.py [--problems 60] [--json benchmarks/results/reasoning_thresholds.json]
"""

from __future__ import annotations

import argparse

import torch

from multispec.bench.machine import describe, machine_info, save_results
from multispec.reasoning import Settings, evaluate, make_problems
from multispec.reasoning.bench import zoo_models
from multispec.reasoning.evaluate import markdown

VALIDATION_SEED = 4242
SPECREASON = (1.0, 2.0, 3.0, 4.5, 6.0, 7.0)
JUDGE = (0.3, 0.5, 0.7, 0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--problems", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models, test = zoo_models()
    held_out = {p.question for p in test}
    problems = [p for p in make_problems(args.problems * 2, VALIDATION_SEED) if p.question not in held_out]
    problems = problems[: args.problems]
    out = {"machine": machine_info(), "problems": len(problems), "seed": VALIDATION_SEED, "specreason": {},
           "judge": {}}
    base = evaluate(models, problems, ["base", "exact"], Settings(), progress=False)
    out["base"] = base
    print(f"validation split, {len(problems)} problems ({describe(out['machine'])})")
    print(markdown(base))
    for t in SPECREASON:
        r = evaluate(models, problems, ["specreason"], Settings(threshold=t), progress=False, warmup=False)
        out["specreason"][str(t)] = r["specreason"] | {"speedup_vs_base": round(base["base"]["latency_s"] /
                                                                               r["specreason"]["latency_s"], 3)}
        print(f"SpecReason threshold {t}: {out['specreason'][str(t)]}")
    if models.judge is not None:
        for t in JUDGE:
            r = evaluate(models, problems, ["judge"], Settings(judge_threshold=t), progress=False, warmup=False)
            out["judge"][str(t)] = r["judge"]
            print(f"judge threshold {t}: {r['judge']}")
    save_results(out, args.json)


if __name__ == "__main__":
    main()
