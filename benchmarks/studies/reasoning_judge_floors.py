"""The judge against the probability floor, on the validation split: for each floor rho, judge decoding with the
trained head (at each threshold) and with a head that approves every token (the control), beside exact decoding
with the same drafter. Then, for the judge and for the control each, the setting with the longest accepted runs
whose accuracy stays within `--tolerance` of exact decoding's: the judge adds something of its own only if it
beats the control at matched accuracy. (At one floor the judge's approvals are a subset of the control's, so at
the same floor the control's runs are never shorter: the comparison that can tell is at matched accuracy.)

`--train-styled VARIANT` first trains another styled drafter and its judges into `--weights DIR` (the pair's
other models copied from the zoo; stages already there are kept): `zoo_pair.STYLED_VARIANTS`, writers whose
right text the base rates under the 0.2 floor; the linear head (the paper's) in `judge-styled/` and, on the
same labels, a context judge (`JudgeHead(context=True, width=32)`: it also reads the base's probabilities) in
`judge-styled-context/`. `--judge FOLDER` sweeps another head of the pair than `judge-styled/`.
`--on-policy FOLDER --out-judge NEW` first trains NEW, a context head, on the divergences judge decoding with the
head in FOLDER meets (threshold `--on-policy-threshold`, no floor; 400 labelling problems: one DAgger round), and
sweeps NEW. The on-policy judge in BENCHMARKS.md: `--train-styled casual`, then `--on-policy judge-styled-context
--on-policy-threshold 0.9 --out-judge judge-styled-context-dagger`.

    python benchmarks/studies/reasoning_judge_floors.py [--weights DIR] [--train-styled VARIANT] [--drafter styled]
        [--judge judge-styled-context] [--problems 100] [--floors 0,0.01,0.05,0.2] [--thresholds 0.5,0.9]
        [--json benchmarks/results/reasoning_judge_floors.json]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from multispec import zoo

from multispec.bench.machine import describe, machine_info, save_results
from multispec.reasoning import Settings, evaluate
from multispec.reasoning.bench import DRAFTERS, zoo_models, zoo_settings
from multispec.reasoning.zoo_pair import (NAME, STYLED_INIT, STYLED_JUDGE, STYLED_JUDGE_PROBLEMS, STYLED_VARIANTS,
                                          OnPolicy, load_pair, train_model, train_zoo_judge, validation_split)
from multispec.rules import JudgeHead

CONTEXT_JUDGE = "judge-styled-context"  # the context judge trained beside the linear one (same labels)


def train_styled(folder: Path, variant: str) -> dict:
    """The pair in `folder` with the `variant` styled drafter and its judge (resumable, stage by stage)."""
    folder.mkdir(parents=True, exist_ok=True)
    for part in zoo.path(NAME).iterdir():
        if part.name not in ("styled", STYLED_JUDGE, CONTEXT_JUDGE) and not (folder / part.name).exists():
            (shutil.copytree if part.is_dir() else shutil.copy)(part, folder / part.name)
    init = folder / STYLED_INIT[variant] if variant in STYLED_INIT else None
    drafter = train_model(STYLED_VARIANTS[variant], folder / "styled", f"styled ({variant})", init=init)
    return {"drafter": drafter,
            "judge": train_zoo_judge(folder, problems=STYLED_JUDGE_PROBLEMS, drafter="styled", out=STYLED_JUDGE,
                                     also={CONTEXT_JUDGE: (True, 32)})}


def best(rows: dict, floor_accuracy: float) -> str | None:
    """The row with the longest accepted runs among those at least `floor_accuracy` accurate."""
    kept = [k for k, r in rows.items() if r["accuracy"] >= floor_accuracy - 1e-9]
    return max(kept, key=lambda k: rows[k]["mean_accepted_length"]) if kept else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", default=None, help="a retrained pair's folder (default: the shipped one)")
    parser.add_argument("--train-styled", choices=sorted(STYLED_VARIANTS), default=None,
                        help="first train this styled drafter and its judge into --weights")
    parser.add_argument("--drafter", choices=DRAFTERS, default="styled")
    parser.add_argument("--judge", default=None,
                        help="a judge head's folder in the pair to sweep (default: the drafter's own judge)")
    parser.add_argument("--on-policy", default=None, help="a judge folder in the pair: first train --out-judge on "
                        "the divergences judge decoding with it meets")
    parser.add_argument("--on-policy-threshold", type=float, default=0.9)
    parser.add_argument("--out-judge", default=None, help="the on-policy head's folder in the pair")
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--k", type=int, default=Settings.k)
    parser.add_argument("--floors", default="0,0.01,0.05,0.2")
    parser.add_argument("--thresholds", default="0.5,0.9")
    parser.add_argument("--tolerance", type=float, default=0.01, help="accuracy below exact decoding's allowed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trained = None
    if args.train_styled:
        if args.weights is None:
            parser.error("--train-styled needs --weights DIR (where the drafter and its judge are trained)")
        trained = train_styled(Path(args.weights), args.train_styled)
    if args.on_policy:
        if args.weights is None or args.out_judge is None:
            parser.error("--on-policy needs --weights DIR and --out-judge NAME (where the new head is trained)")
        trained = (trained or {}) | {"on_policy": train_zoo_judge(
            args.weights, problems=2 * STYLED_JUDGE_PROBLEMS, drafter=args.drafter, out=args.out_judge, head=(True, 32),
            on_policy=OnPolicy(args.on_policy, args.on_policy_threshold, 0.0))}
        args.judge = args.out_judge
    models, _ = zoo_models(args.weights, args.drafter)
    if args.judge:
        models.judge = JudgeHead.load(load_pair(args.weights).folder / args.judge)
    problems = validation_split(args.problems)
    out = {"machine": machine_info(), "split": "validation", "problems": len(problems), "drafter": args.drafter,
           "k": args.k, "tolerance": args.tolerance, "styled_variant": args.train_styled, "training": trained,
           "judge_head": args.judge or ("judge-styled" if args.drafter == "styled" else "judge"),
           "judge": {}, "control": {}}
    print(f"judge floors, {args.drafter} drafter, k={args.k}, {len(problems)} validation problems "
          f"({describe(out['machine'])})")

    def run(method: str, **kw) -> dict:
        return evaluate(models, problems, [method], zoo_settings(Settings(k=args.k, **kw)), progress=False,
                        warmup=False, rounds=1, controls=False)[method]

    out["exact"] = run("exact")
    print(f"exact: accuracy {out['exact']['accuracy']}, accepted length {out['exact']['mean_accepted_length']}")
    for rho in map(float, args.floors.split(",")):
        r = run("judge_approve_all", judge_min_prob=rho)
        out["control"][f"floor {rho:g}"] = r
        print(f"control, floor {rho:g}: accuracy {r['accuracy']}, accepted length {r['mean_accepted_length']}")
        for t in map(float, args.thresholds.split(",")):
            r = run("judge", judge_threshold=t, judge_min_prob=rho)
            out["judge"][f"threshold {t:g}, floor {rho:g}"] = r
            print(f"judge {t:g}, floor {rho:g}: accuracy {r['accuracy']}, accepted length {r['mean_accepted_length']}, "
                  f"overrides {r['overrides']}")
    need = out["exact"]["accuracy"] - args.tolerance
    chosen = {name: best(out[name], need) for name in ("judge", "control")}
    out["chosen"] = chosen
    if all(chosen.values()):
        j, c = (out[name][chosen[name]]["mean_accepted_length"] for name in ("judge", "control"))
        out["judge_vs_control_at_matched_accuracy"] = round(j / c, 3)
        out["judge_vs_exact"] = round(j / out["exact"]["mean_accepted_length"], 3)
    print(f"within {args.tolerance} of exact's accuracy: judge {chosen['judge']}, control {chosen['control']}; "
          f"judge / control accepted length {out.get('judge_vs_control_at_matched_accuracy')}")
    save_results(out, args.json)


if __name__ == "__main__":
    main()
