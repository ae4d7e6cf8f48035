"""`multispec generate --pair arith-reasoning --method specreason --prompt QUESTION`: one reasoning method of the
zoo pair solves a question; `--compare` runs the base model alone on it beside."""

from __future__ import annotations

import argparse
import time

from multispec.plugin import (GenerateMode, check_sampling, comparison_line, comparison_record, prompt_texts,
                              timed_rounds, write_json)

from .bench import ZOO_METHODS, zoo_models, zoo_settings
from .data import extract_answer
from .evaluate import Settings, solve
from .zoo_pair import NAME

# what a user runs; the judge's controls and the transformers baselines are for the benches
USER_METHODS = tuple(m for m in ZOO_METHODS if m not in ("judge_approve_all", "judge_no_floor", "generate",
                                                         "assisted"))


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--method", default=None, choices=USER_METHODS,
                       help="the reasoning method (default specreason_likelihood); base and small: one model alone")


def _shown(answer) -> str:
    if answer is None:
        return "none"
    return str(int(answer)) if float(answer).is_integer() else f"{answer:g}"


def _timed(method: str, models, settings: Settings, question: str) -> dict:
    t0 = time.perf_counter()
    result = solve(method, models, settings, question)
    seconds = time.perf_counter() - t0
    answer = result.get("answer", extract_answer(result["text"]))
    record = {"method": method, "text": result["text"], "answer": answer, "tokens": result["tokens"],
              "seconds": round(seconds, 4)}
    if "stats" in result:
        record["mean_accepted_length"] = round(result["stats"].mean_accepted_length, 3)
    if "counts" in result:
        record["counts"] = {k: v for k, v in result["counts"].items() if isinstance(v, (int, float, str))}
    return record


def run(args: argparse.Namespace) -> int:
    questions = prompt_texts(args)
    check_sampling(args)
    if args.sample:
        raise ValueError("--sample: the reasoning methods decode greedily here")
    if args.tree is not None:
        raise ValueError("--tree: the reasoning methods take their draft length from the pair's settings")
    method = args.method or "specreason_likelihood"
    models, _ = zoo_models()
    settings = zoo_settings(Settings(max_new_tokens=args.max_new_tokens or Settings.max_new_tokens))
    records = []
    for i, question in enumerate(questions):
        if len(questions) > 1:
            print(f"--- question {i + 1} of {len(questions)}")
        record = _timed(method, models, settings, question)
        print(question.strip())
        print(record["text"].replace("\x03", "").strip())
        line = (f"[{method}: answer {_shown(record['answer'])}; {record['tokens']} tokens in {record['seconds']:.2f} s"
                + (f"; mean accepted length {record['mean_accepted_length']:.2f}" if "mean_accepted_length" in record
                   else "") + "]")
        if args.compare and method != "base":
            timed = timed_rounds(lambda: _timed(method, models, settings, question),
                                 lambda: _timed("base", models, settings, question), args.rounds)
            base = timed["plain_output"]
            record["base"] = base
            record.update(comparison_record(timed))
            record["speedup_vs_base"] = record["speedup"]
            line += ("\n" + comparison_line(method, timed, "problems", "base alone")
                     + f"\n[base model alone: answer {_shown(base['answer'])}; answers "
                     f"{'agree' if base['answer'] == record['answer'] else 'differ'}]")
        print(line)
        records.append(record)
    write_json(args, {"source": NAME, "method": method, "records": records})
    return 0


MODE = GenerateMode("reasoning", (NAME,), {"method": "--method"}, _add_arguments, run)
