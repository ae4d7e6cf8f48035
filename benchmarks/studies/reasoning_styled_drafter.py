"""Judge decoding where it should help: a drafter with another writing habit.

The zoo's small model writes like the base (same data, same phrasing mix), so exact decoding already accepts
~97% of its tokens and no rule can lengthen the accepted runs much. This script trains a drafter on the same
problems written in another habit (`STYLED`: never "a + b = r"; 2 layers of 64, 3,000 steps; `--drafter
styled-wide`: `STYLED_WIDE`, 2 layers of 128, the drafter of the earlier runs), labels its
divergences from the base and trains its judge head, then sweeps the judge's threshold on the validation
split beside exact decoding with the same drafter. `--on-policy T` adds one DAgger round: the divergences
judge decoding itself meets (that first judge at threshold T) are labelled and the judge evaluated is trained
on them. Stages already in `--out` are not redone; a base model already in `--out/base` (e.g. a retrained one)
is the one labelled, judged and evaluated, otherwise the zoo's is copied there. `--drafter small` runs the same
sweep with the zoo's own small model as drafter instead.

    python benchmarks/studies/reasoning_styled_drafter.py --out /tmp/styled [--problems 100] [--context] [--width W]
        [--on-policy T] [--k 4,16] [--drafter styled|styled-wide|small] [--min-probs 0,0.3] [--split validation|test] [--json benchmarks/results/reasoning_styled_drafter.json]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from multispec import zoo
from multispec.bench.machine import describe, machine_info, save_results
from multispec.reasoning import Models, Settings, evaluate, make_problems
from multispec.reasoning.bench import zoo_models
from multispec.reasoning.zoo_pair import (NAME, STYLED, STYLED_WIDE, OnPolicy, load_model, train_model,
                                          train_zoo_judge)
from multispec.rules import JudgeHead

VALIDATION_SEED = 4242
JUDGE = (0.5, 0.9, 0.97, 0.99)
K = (4, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="folder for the styled drafter and its judge head")
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--split", choices=("validation", "test"), default="validation",
                        help="validation: problems outside the test split (for choosing settings); test: the pair's "
                        "held-out split (for reporting them)")
    parser.add_argument("--label-problems", type=int, default=150, help="problems whose divergences are labelled")
    parser.add_argument("--context", action="store_true", help="a context judge (state before the token and the "
                        "base's distribution there too)")
    parser.add_argument("--width", type=int, default=0, help="the judge's hidden layer (0: linear)")
    parser.add_argument("--on-policy", type=float, default=None, metavar="T",
                        help="then one DAgger round: label judge decoding's own runs with that judge at threshold T "
                        "and train the judge evaluated here on them")
    parser.add_argument("--drafter", choices=("styled", "styled-wide", "small"), default="styled",
                        help="styled: the drafter with another habit (trained here; styled-wide: the small model's "
                        "size); small: the zoo's small model")
    parser.add_argument("--k", default=",".join(map(str, K)), help="chain lengths evaluated")
    parser.add_argument("--thresholds", default=",".join(map(str, JUDGE)))
    parser.add_argument("--min-probs", default="0", help="the judge's floors on the base's own probability of a "
                        "token (Judge.min_target_prob), each swept with every threshold")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if not (out / "base").exists():  # the judge is trained on the shipped base's hidden states
        shutil.copytree(zoo.path(NAME) / "base", out / "base")
    if args.drafter == "small":
        if not (out / "small").exists():
            shutil.copytree(zoo.path(NAME) / "small", out / "small")
        drafter, judge = "small", "judge"
    else:
        recipe = STYLED if args.drafter == "styled" else STYLED_WIDE
        train_model(recipe, out / args.drafter / "small", args.drafter)
        drafter, judge = f"{args.drafter}/small", f"{args.drafter}/judge"
    judge += "_context" if args.context else ""
    judge += f"_w{args.width}" if args.width else ""
    report = train_zoo_judge(out, problems=args.label_problems, drafter=drafter, out=judge,
                             head=(args.context, args.width))
    if args.on_policy is not None:
        first, judge = judge, f"{judge}_onpolicy{args.on_policy:g}"
        report = {"first_round": report} | train_zoo_judge(
            out, problems=args.label_problems, drafter=drafter, out=judge, head=(args.context, args.width),
            seed=778, on_policy=OnPolicy(first, args.on_policy))

    models, test = zoo_models()
    models.base = load_model(out / "base")  # the base the judge was trained on
    models.token_drafter = load_model(out / drafter)
    models.judge = JudgeHead.load(out / judge)
    if args.split == "test":  # the pair's held-out split: for settings already chosen on the validation split
        problems = test[: args.problems]
    else:
        held_out = {p.question for p in test}
        problems = [p for p in make_problems(args.problems * 2, VALIDATION_SEED) if p.question not in held_out]
        problems = problems[: args.problems]
    result = {"machine": machine_info(), "split": args.split, "problems": len(problems),
              "seed": VALIDATION_SEED if args.split == "validation" else None, "judge": judge,
              "drafter": args.drafter, "judge_training": report, "drafter_alone": None, "runs": {}}
    print(f"{args.drafter} drafter, {args.split} split, {len(problems)} problems ({describe(result['machine'])})")
    alone = evaluate(models, problems, ["base"], Settings(), progress=False)["base"]
    drafter_alone = Models(models.token_drafter, models.small, models.tokenizer)
    result["drafter_alone"] = evaluate(drafter_alone, problems, ["base"], Settings(), progress=False)["base"]
    print(f"base alone: accuracy {alone['accuracy']}; drafter alone: {result['drafter_alone']['accuracy']}")
    for k in map(int, args.k.split(",")):
        exact = evaluate(models, problems, ["base", "exact"], Settings(k=k), progress=False)
        row = {"base": exact["base"], "exact": exact["exact"]}
        print(f"k={k} exact: accuracy {exact['exact']['accuracy']}, accepted length "
              f"{exact['exact']['mean_accepted_length']}, {exact['exact']['speedup_vs_base']}x")
        for rho in map(float, args.min_probs.split(",")):
            for t in map(float, args.thresholds.split(",")):
                r = evaluate(models, problems, ["judge"], Settings(k=k, judge_threshold=t, judge_min_prob=rho),
                             progress=False, warmup=False)["judge"]
                r["accepted_length_vs_exact"] = round(r["mean_accepted_length"] / exact["exact"]["mean_accepted_length"],
                                                      3)
                row[str(t) if rho == 0 else f"{t} floor {rho}"] = r
                print(f"k={k} judge {t}, floor {rho}: accuracy {r['accuracy']}, accepted length "
                      f"{r['mean_accepted_length']} ({r['accepted_length_vs_exact']}x exact), overrides {r['overrides']}")
        result["runs"][f"k{k}"] = row
    save_results(result, args.json)


if __name__ == "__main__":
    main()
