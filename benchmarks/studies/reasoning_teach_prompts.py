"""Teaching the zoo's base the step-level methods' prompts (tried, not shipped): stages continuing the shipped base
(`zoo_pair.TEACH_TASKS`, then `TEACH_SCORES`) whose rows include SpecReason's 0-9 scoring prompt and Speculative
Verdict's verdict over two experts' solutions (`reasoning/task_data.py`). After each stage, on the validation split:
the base alone, whether its score tells a right step from the same step made wrong (the probability of "9" and the
greedy score, both kinds of step), SpecReason with that scorer, and the verdict with the zoo's experts beside each
expert alone.

    python benchmarks/studies/reasoning_teach_prompts.py --out DIR [--problems 40] [--stages teach-tasks,teach-scores]
        [--scores-only] [--json benchmarks/results/reasoning_teach_prompts.json]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
from pathlib import Path

import torch

from multispec import zoo
from multispec.bench.machine import describe, machine_info, save_results
from multispec.reasoning import PromptScorer, Settings, Writer, evaluate
from multispec.reasoning.bench import zoo_models, zoo_settings
from multispec.reasoning.task_data import (RIGHT_SCORE, SCORE_INSTRUCTION, SCORE_LEAD, corrupt_step,
                                           drill_scoring_row, numbers_in, steps_of)
from multispec.reasoning.zoo_pair import (NAME, TEACH_DRILL_SCORES, TEACH_DRILL_SCORES_LONG, TEACH_SCORES,
                                          TEACH_SCORES_ONLY, TEACH_TASKS, load_model, train_model, validation_split)

STAGES = {"teach-tasks": (TEACH_TASKS, "base, scoring steps and verdicts"),
          "teach-scores": (TEACH_SCORES, "base, scoring steps in batches of their own"),
          "scores-only": (TEACH_SCORES_ONLY, "base, scoring rows alone (a probe)"),
          "drill-scores": (TEACH_DRILL_SCORES, "base, scoring drill lines alone (a probe)"),
          "drill-scores-long": (TEACH_DRILL_SCORES_LONG, "base, scoring drill lines alone, 8,000 steps (a probe)")}


def scores(base, tokenizer, problems, seed: int = 7) -> dict:
    """The probability of "9" and the greedy 0-9 score of one step per problem, as written and made wrong."""
    scorer = PromptScorer.plain(tokenizer, instruction=SCORE_INSTRUCTION, lead=SCORE_LEAD)
    nine = tokenizer.encode("9")[0]
    rng, out = random.Random(seed), {"right": [], "wrong": []}
    for problem in problems:
        steps = steps_of(problem)
        i = rng.randrange(len(steps))
        before = problem.prompt() + "".join(steps[:i])
        for kind, step in (("right", steps[i]), ("wrong", corrupt_step(steps[i], rng, numbers_in(before)))):
            writer = Writer.open(base, eos_token_id=tokenizer.eos_token_id)
            writer.start(tokenizer.encode(before))
            writer.append(tokenizer.encode(step) + ([tokenizer.eos_token_id] if i == len(steps) - 1 else []))
            logits = writer.score(scorer.suffix()).next_logits[0].float()
            out[kind].append((float(torch.softmax(logits, -1)[nine]), scorer.from_logits(logits)))
    return {kind: {"p9_mean": round(statistics.mean(p for p, _ in v), 4),
                   "greedy_score_at_least_7": sum(s >= 7 for _, s in v), "n": len(v)} for kind, v in out.items()}


@torch.no_grad()
def drill_scores(base, tokenizer, n: int = 80, seed: int = 99) -> dict:
    """The probability of "9" after drill-form scoring rows (`drill_scoring_row`; another seed than training's),
    right lines and wrong ones."""
    rng, nine, out = random.Random(seed), tokenizer.encode("9")[0], {"right": [], "wrong": []}
    for _ in range(n):
        text, at = drill_scoring_row(rng)
        logits = base(torch.tensor([tokenizer.encode(text[:at])])).logits[0, -1].float()
        out["right" if text[at] == RIGHT_SCORE else "wrong"].append(float(torch.softmax(logits, -1)[nine]))
    return {kind: {"p9_mean": round(statistics.mean(v), 4), "n": len(v)} for kind, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="folder for the stages (a stage already there is not retrained)")
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--stages", default="teach-tasks,teach-scores", help="stages in order, each continuing the "
                        "one before (the first the shipped base), of: " + ", ".join(STAGES) + "; scores-only is a "
                        "probe: its score's dependence on the step alone (--scores-only)")
    parser.add_argument("--scores-only", action="store_true", help="after each stage, only the scores of right and "
                        "wrong steps (no method runs)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    previous = out / "shipped-base"
    if not previous.exists():
        shutil.copytree(zoo.path(NAME) / "base", previous)
    models, _ = zoo_models()
    problems = validation_split(args.problems)
    result = {"machine": machine_info(), "split": "validation", "problems": len(problems), "stages": {}}
    print(f"teaching the base the methods' prompts, {len(problems)} validation problems "
          f"({describe(result['machine'])})")
    for folder in args.stages.split(","):
        if folder not in STAGES:
            parser.error(f"--stages: unknown stage {folder!r}; expected some of {', '.join(STAGES)}")
        recipe, desc = STAGES[folder]
        report = train_model(recipe, out / folder, desc, init=previous)
        previous = out / folder
        models.base = load_model(out / folder)
        if args.scores_only:
            result["stages"][folder] = {"recipe": report["recipe"],
                                        "scores": scores(models.base, models.tokenizer, problems),
                                        "drill_scores": drill_scores(models.base, models.tokenizer)}
            print(folder, result["stages"][folder])
            continue
        settings = zoo_settings(Settings(score_prompt=(SCORE_INSTRUCTION, SCORE_LEAD), verdict_compact=True))
        rows = evaluate(models, problems, ["base", "small", "specreason", "verdict"], settings, progress=False,
                        rounds=1)
        stage = {"recipe": report["recipe"], "scores": scores(models.base, models.tokenizer, problems)}
        stage |= {m: {k: rows[m].get(k) for k in ("accuracy", "speedup", "steps_accepted", "steps_rejected",
                                                  "expert_accuracy", "best_expert_accuracy") if k in rows[m]}
                  for m in rows}
        result["stages"][folder] = stage
        print(folder, stage)
    save_results(result, args.json)


if __name__ == "__main__":
    main()
