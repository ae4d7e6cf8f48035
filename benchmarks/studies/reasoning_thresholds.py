"""SpecReason's threshold (for the prompt scorer, the `specreason` row, and the likelihood scorer,
`specreason_likelihood`) and the judge's, chosen on the validation split (`validation_split`, never the test
split): accuracy, latency and acceptance of each setting beside the base model alone.

    python benchmarks/studies/reasoning_thresholds.py [--problems 60] [--json benchmarks/results/reasoning_thresholds.json]
"""

from __future__ import annotations

import argparse

import torch

from multispec.bench.machine import describe, machine_info, save_results
from multispec.reasoning import Settings, evaluate
from multispec.reasoning.bench import zoo_models, zoo_settings
from multispec.reasoning.evaluate import markdown
from multispec.reasoning.zoo_pair import VALIDATION_SEED, validation_split

SPECREASON = (0.5, 1.0, 2.0, 3.0, 4.5, 7.0)
JUDGE = (0.1, 0.3, 0.5, 0.7, 0.9)
JUDGE_K = (4, 16)  # chain lengths: exact accepts most of a 4-token chain already, which caps the judge's gain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--problems", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--weights", default=None, help="a retrained pair's folder (default: the shipped one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models, _ = zoo_models(args.weights)
    problems = validation_split(args.problems)
    out = {"machine": machine_info(), "problems": len(problems), "seed": VALIDATION_SEED, "judge": {}}
    base = evaluate(models, problems, ["base", "exact"], zoo_settings(Settings()), progress=False)
    out["base"] = base
    print(f"validation split, {len(problems)} problems ({describe(out['machine'])})")
    print(markdown(base))
    for t in SPECREASON:
        r = evaluate(models, problems, ["specreason", "specreason_likelihood"],
                     zoo_settings(Settings(threshold=t, likelihood_threshold=t)), progress=False, warmup=False)
        for row in r:
            out.setdefault(row, {})[str(t)] = r[row] | {"speedup_vs_base": round(base["base"]["latency_s"] /
                                                                                 r[row]["latency_s"], 3)}
            print(f"{row} threshold {t}: {out[row][str(t)]}")
    if models.judge is not None:
        for k in JUDGE_K:
            exact = base["exact"] if k == Settings.k else evaluate(models, problems, ["exact"], Settings(k=k),
                                                                  progress=False, warmup=False)["exact"]
            out["judge"][f"k{k}"] = {"exact": exact}
            print(f"exact, k={k}: {exact}")
            for t in JUDGE:
                r = evaluate(models, problems, ["judge"], zoo_settings(Settings(k=k, judge_threshold=t)),
                             progress=False, warmup=False, controls=False)["judge"]
                r["accepted_length_vs_exact"] = round(r["mean_accepted_length"] / exact["mean_accepted_length"], 3)
                out["judge"][f"k{k}"][str(t)] = r
                print(f"judge k={k} threshold {t}: {r}")
    save_results(out, args.json)


if __name__ == "__main__":
    main()
