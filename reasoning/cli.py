"""The reasoning commands of the `multispec` CLI: `bench reasoning`, `eval reasoning`, `train judge`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from multispec.plugin import (BenchOptions, Judge, JudgeHead, current_shards, positive_int, register_command,
                              register_generate_mode, results, save_results, train_judge_head)

from . import generate_mode
from .bench import (DRAFTERS, SPLITS, ZOO_METHODS, check_zoo_methods, run, settings_record, zoo_models,
                    zoo_settings)
from .data import make_problems, read_problems
from .evaluate import METHODS, Models, Settings, evaluate_table, markdown
from .judge_data import label_divergences
from .zoo_pair import ByteTokenizer, load_pair, validation_split


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default=None, help="comma-separated subset of: " + ", ".join(METHODS) +
                   " (default: all, on the zoo pair all but specreason and verdict, which need a base that follows "
                   "their prompts; judge brings its controls judge_approve_all and judge_no_floor along, and "
                   "judge_floor_matched with --control-min-prob)")
    p.add_argument("--threshold", type=float, default=None, help="SpecReason's score threshold on the 0-9 scale "
                   "(default 7, the reference's; the specreason_likelihood row keeps its own, 3)")
    p.add_argument("--scorer", default="prompt", choices=["prompt", "likelihood"],
                   help="how the base scores a step in the specreason row: a 0-9 judging prompt (default, the "
                   "paper's) or its likelihood of the step")
    p.add_argument("--k", type=positive_int, default=4, help="drafts per token-level step")
    p.add_argument("--judge-threshold", type=float, default=0.5)
    p.add_argument("--judge-min-prob", type=float, default=None, metavar="RHO",
                   help="judge decoding approves only tokens the base itself gives probability >= RHO (default 0.2, "
                   "chosen on the zoo pair's validation split; 0: no floor)")
    p.add_argument("--control-min-prob", type=float, default=None, metavar="RHO",
                   help="also run judge_floor_matched: the approve-all control at its own floor RHO, chosen on the "
                   "validation split where its accuracy matches the judge's (benchmarks/studies/reasoning_judge_floors.py)")
    p.add_argument("--drafter", choices=DRAFTERS, default="small",
                   help="the zoo pair's drafter and judge for the token-level rows (exact, judge, assisted): the "
                   "small model (default) or the styled drafter, which phrases steps its own way")
    p.add_argument("--max-new-tokens", type=positive_int, default=320)
    p.add_argument("--rounds", type=positive_int, default=3, help="the problems split into N timed rounds, each "
                   "speedup from one round (default 3; fewer when there are fewer problems)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, metavar="PATH")


def _settings(args):
    threshold = Settings.threshold if args.threshold is None else args.threshold
    return Settings(threshold=threshold, scorer=args.scorer, k=args.k, judge_threshold=args.judge_threshold,
                    judge_min_prob=Settings.judge_min_prob if args.judge_min_prob is None else args.judge_min_prob,
                    control_min_prob=args.control_min_prob,
                    max_new_tokens=args.max_new_tokens)


def _methods(args, default=METHODS):
    if args.methods is None:
        return default
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown[0]!r}; expected some of {', '.join(METHODS)}")
    return chosen


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="30 held-out problems (instead of the whole split)")
    p.add_argument("--problems", type=positive_int, default=None)
    p.add_argument("--weights", default=None, help="a retrained pair's folder (default: the shipped one)")
    p.add_argument("--split", choices=SPLITS, default="validation",
                   help="validation (default): problems for choosing settings, outside the test split and the "
                   "judges' training problems; test: the held-out split, once, for a configuration already chosen")
    _add_common(p)


def _bench(args: argparse.Namespace) -> int:
    run(BenchOptions.from_args(args), args.problems, _methods(args, ZOO_METHODS), _settings(args), args.drafter)
    return 0


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, metavar="JSONL", help="problems with `question` and `answer` (a number or "
                   "GSM8K's '#### N' layout); default: the zoo pair's validation split")
    p.add_argument("--base", default=None, metavar="PATH", help="your base model (a transformers checkpoint folder); "
                   "default: the zoo's")
    p.add_argument("--small", default=None, metavar="PATH", help="your small model (same tokenizer)")
    p.add_argument("--judge", default=None, metavar="DIR", help="a judge head for the base (multispec train judge)")
    p.add_argument("--experts", default=None, help="comma-separated expert checkpoints for Speculative Verdict "
                   "(default: the small model only, so 'verdict' needs this)")
    p.add_argument("--limit", type=positive_int, default=None, help="the first N problems only")
    _add_common(p)


def _user_models(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.small is None:
        raise ValueError("--small: give the small model with --base")
    load = lambda p: AutoModelForCausalLM.from_pretrained(p).eval()  # noqa: E731
    base, small = load(args.base), load(args.small)
    experts = {"small": small}
    for i, path in enumerate((args.experts or "").split(",")):
        if path.strip():
            experts[Path(path.strip()).name or f"expert{i}"] = load(path.strip())
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    return Models(base, small, tokenizer, experts, JudgeHead.load(args.judge) if args.judge else None)


def _eval(args: argparse.Namespace) -> int:
    settings = _settings(args)
    methods = _methods(args)
    if args.base is not None:
        if args.drafter != "small":
            raise ValueError("--drafter: picks among the zoo pair's drafters; with --base, --small is the drafter")
        models = _user_models(args)
        problems = None
    else:
        models, _ = zoo_models(drafter=args.drafter)
        # the zoo pair without --data: its validation split (the test split is `bench reasoning --split test`'s)
        problems = validation_split()
        settings = zoo_settings(settings)
        methods = _methods(args, ZOO_METHODS)
        check_zoo_methods(methods)
        if args.judge:
            models.judge = JudgeHead.load(args.judge)
    if args.data is not None:
        problems = read_problems(args.data)
    if problems is None:
        raise ValueError("--data: give the problems to evaluate your own models on")
    problems = problems[: args.limit] if args.limit else problems
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    shards = current_shards()  # under accelerate launch / torchrun: this process's share of the problems
    if shards.device.type == "cuda":
        models.to(shards.device)
    table = evaluate_table(models, problems, methods, settings, rounds=args.rounds, shards=shards)
    if shards.main:
        print(markdown(table))
        record = {"problems": len(problems), "rounds": args.rounds, "processes": shards.world} | settings_record(settings)
        save_results(results("eval-reasoning", record, {"greedy": table}), args.json)
    return 0


def _add_train_judge(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default=None, metavar="PATH", help="the target (default: the zoo's base)")
    p.add_argument("--small", default=None, metavar="PATH", help="the drafter (default: the zoo's small model)")
    p.add_argument("--data", default=None, metavar="JSONL", help="problems with checkable answers (default: fresh "
                   "synthetic arithmetic problems)")
    p.add_argument("--problems", type=positive_int, default=400, help="how many problems to label divergences on")
    p.add_argument("--k", type=positive_int, default=4)
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--context", action="store_true", help="the judge also reads the state before each draft "
                   "token and the base's distribution there (judge_inputs), not only the state at the token")
    p.add_argument("--width", type=int, default=0, help="a hidden layer of this width (default 0: linear)")
    p.add_argument("--on-policy", default=None, metavar="JUDGE", help="label judge decoding's own runs with this "
                   "judge head (one DAgger round: the divergences the judge meets once its approvals leave the "
                   "base's path) instead of exact decoding's")
    p.add_argument("--on-policy-threshold", type=float, default=0.9, help="that judge's threshold")
    p.add_argument("--out", required=True, metavar="DIR", help="where the judge head is written")


def _train_judge(args: argparse.Namespace) -> int:
    if args.base is not None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if args.small is None:
            raise ValueError("--small: give the drafter with --base")
        base = AutoModelForCausalLM.from_pretrained(args.base).eval()
        small = AutoModelForCausalLM.from_pretrained(args.small).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.base)
    else:
        pair = load_pair()
        base, small, tokenizer = pair.target, pair.small, ByteTokenizer()
    problems = read_problems(args.data) if args.data else make_problems(2 * args.problems, seed=777)
    if args.base is None:  # the zoo pair: its held-out test problems are never training data
        held_out = {p.question for p in pair.test}
        kept = [p for p in problems if p.question not in held_out]
        if len(kept) < len(problems):
            print(f"train judge: {len(problems) - len(kept)} of the problems are in the pair's test split; left out")
        problems = kept
    if not problems:
        raise ValueError("--data: no problems left to label (all are in the pair's test split)")
    rule = Judge(JudgeHead.load(args.on_policy), args.on_policy_threshold) if args.on_policy else None
    data = label_divergences(base, small, problems[: args.problems], tokenizer, k=args.k,
                             max_new_tokens=args.max_new_tokens, context=args.context, rule=rule)
    head, report = train_judge_head(data["features"], data["labels"], context=args.context, width=args.width)
    head.save(args.out, target=base, **report, problems=len(problems[: args.problems]))
    print(json.dumps(report, indent=2))
    return 0


def register() -> None:
    register_generate_mode(generate_mode.MODE)
    register_command("bench", "reasoning", "SpecReason, Speculative Thinking, Speculative Verdict and judge decoding "
                     "on the arith-reasoning pair", _add_bench, _bench)
    register_command("eval", "reasoning", "accuracy / latency / steps per reasoning method on a JSONL of problems",
                     _add_eval, _eval)
    register_command("train", "judge", "label divergent draft tokens on checkable problems and train a judge head",
                     _add_train_judge, _train_judge)
