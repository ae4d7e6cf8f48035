"""Training rows that teach the zoo's base model the prompts of the step-level methods, in the layouts the
methods send at run time:

- **scoring a step 0-9** (SpecReason's scorer, `PromptScorer.plain` with `SCORE_INSTRUCTION` / `SCORE_LEAD`): the
  problem, its first steps, a candidate step (the reference's, or a wrong one), the judging prompt, and the
  score: 9 for a right step, 0-2 for a wrong one;
- **the verdict over experts' solutions** (Speculative Verdict's `PromptVerdict` in its compact layout with
  `VERDICT_INSTRUCTION`): the question, the solutions of two experts (right ones, or ones with a wrong step), and
  the right solution written after them.

Wrong steps are made the way the zoo's small models go wrong (measured: a right operation on a number that is
not the one the problem needs, or a wrong result; `corrupt_step`), so the scores and verdicts are learnt on the
errors the methods meet.
"""

from __future__ import annotations

import random
import re

from .data import ANSWER_PREFIX, SEPARATOR, Problem, apply_op, phrase

SCORE_INSTRUCTION = "Rate the last step from 0 to 9."  # short: the scoring pass reads it after every step
SCORE_LEAD = "Score: "
VERDICT_INSTRUCTION = "Check their steps and write the right solution."
RIGHT_SCORE, WRONG_SCORES = "9", "012"

_NUM = re.compile(r"\d+")
_OPS = [re.compile(r"\d+ ([-+*x/]) \d+ = \d+"), re.compile(r"\d+ (plus|minus|times|divided by) \d+ is \d+"),
        re.compile(r"(?i)\b(add|subtract|multiply|divide) \d+ (?:to|from|by) \d+: \d+")]
_OP_OF = {"+": "+", "-": "-", "*": "*", "x": "*", "/": "/", "plus": "+", "minus": "-", "times": "*",
          "divided by": "/", "add": "+", "subtract": "-", "multiply": "*", "divide": "/"}


def parse_operation(step: str) -> tuple[str, bool, list[re.Match]] | None:
    """(op, swapped, the three number matches: operands in text order, then the result) of an operation or
    check step; `swapped` when the text names the second operand first ("Subtract b from a")."""
    for pattern in _OPS:
        m = pattern.search(step)
        if m:
            word = m.group(1).lower()
            nums = list(_NUM.finditer(step, m.start(), m.end()))
            return _OP_OF[word], word == "subtract", nums[-3:]
    return None


def _replace(step: str, edits: dict[re.Match, int]) -> str:
    out, at = [], 0
    for m in sorted(edits, key=lambda m: m.start()):
        out += [step[at: m.start()], str(edits[m])]
        at = m.end()
    return "".join(out) + step[at:]


def corrupt_step(step: str, rng: random.Random, numbers: list[int]) -> str | None:
    """A wrong version of `step` (None when it holds no number): an operation or check step gets, half the
    time, another operand (one of `numbers`, the problem's and earlier results, or a near one) with the
    arithmetic redone on it (the zoo's small models' commonest error), else a wrong result; an answer step a
    wrong number."""
    found = parse_operation(step)
    if found is None:
        nums = list(_NUM.finditer(step))
        if not nums:
            return None
        r = int(nums[-1].group())
        return _replace(step, {nums[-1]: _near(r, rng)})
    op, swapped, (x, y, res) = found
    a, b = (int(y.group()), int(x.group())) if swapped else (int(x.group()), int(y.group()))
    if rng.random() < 0.5:
        which = rng.randrange(2)  # 0: a, 1: b
        old = (a, b)[which]
        pool = [n for n in numbers if n != old] or [_near(old, rng)]
        new = rng.choice(pool) if rng.random() < 0.7 else _near(old, rng)
        a2, b2 = (new, b) if which == 0 else (a, new)
        if b2 and (op != "/" or a2 % b2 == 0):  # (`apply_op` computes a // b whatever the op)
            r2 = apply_op(a2, op, b2)
            if r2 >= 0 and (a2, b2) != (a, b):
                target = (y if swapped else x) if which == 0 else (x if swapped else y)
                return _replace(step, {target: new, res: r2})
    return _replace(step, {res: _near(int(res.group()), rng)})


def _near(n: int, rng: random.Random) -> int:
    """A number near `n`, not `n`, not negative."""
    while True:
        m = n + rng.choice([-1, 1]) * rng.randint(1, 10)
        if m >= 0 and m != n:
            return m


def numbers_in(text: str) -> list[int]:
    """The numbers a text holds, in order (what a wrong operand is drawn from)."""
    return [int(m) for m in _NUM.findall(text)]


def steps_of(problem: Problem) -> list[str]:
    """The solution's steps, each as a writer emits it: the separator after every step but the last, which ends
    with a newline (the EOS follows)."""
    steps = problem.solution.split(SEPARATOR)
    return [s + SEPARATOR for s in steps[:-1]] + [steps[-1] + "\n"]


def drill_scoring_row(rng: random.Random) -> tuple[str, int]:
    """(text, where the score digit is) of one scoring example in drill form, the comparison local: "Practice:",
    one "a op b = r" line (r wrong half the time, by a near number), then `SCORE_LEAD` and 9 (right) or 0-2. The
    first stage of a curriculum towards `scoring_row`: a base that cannot score a step may learn to score a line."""
    op = rng.choice("+-*+-")
    a = rng.randint(10, 60)
    b = rng.randint(2, 5) if op == "*" else rng.randint(1, min(a - 1, 40)) if op == "-" else rng.randint(1, 40)
    r, score = apply_op(a, op, b), RIGHT_SCORE
    if rng.random() < 0.5:
        r, score = _near(r, rng), rng.choice(WRONG_SCORES)
    text = f"Practice:\n{a} {op} {b} = {r}\n{SCORE_LEAD}"
    return text + score, len(text)


def scoring_row(problem: Problem, rng: random.Random, eos: str, wrong_rate: float = 0.5) -> tuple[str, int]:
    """(text, where the score digit is) of one scoring example: the prompt and the first steps, a candidate
    step (wrong with `wrong_rate`), then `SCORE_INSTRUCTION` / `SCORE_LEAD` as `PromptScorer.plain` writes
    them, and the score."""
    steps = steps_of(problem)
    i = rng.randrange(len(steps))
    before = problem.prompt() + "".join(steps[:i])
    step, score = steps[i], RIGHT_SCORE
    if rng.random() < wrong_rate:
        wrong = corrupt_step(step, rng, numbers_in(before))
        if wrong is not None:
            step, score = wrong, rng.choice(WRONG_SCORES)
    if i == len(steps) - 1:
        step += eos  # the last step ends with the EOS the writer stopped at
    text = before + step + f"\n\n{SCORE_INSTRUCTION}\n{SCORE_LEAD}"
    return text + score, len(text)


def rephrase(step: str, rng: random.Random) -> str:
    """An operation step written in another random phrasing (`phrase`; a lead-in is dropped), other steps as
    they are: experts phrase their steps their own way."""
    found = parse_operation(step)
    if found is None or step.lower().startswith(("let me", "wait", "check")):
        return step
    op, swapped, (x, y, _) = found
    a, b = (int(y.group()), int(x.group())) if swapped else (int(x.group()), int(y.group()))
    return phrase(a, op, b, rng) + "." + step[len(step.rstrip()):]


def expert_solution(problem: Problem, rng: random.Random, wrong_rate: float) -> str:
    """An expert's solution: the reference's steps, half of them rephrased, with one step made wrong (and, for
    the last operation, the answer following it) at `wrong_rate`."""
    steps = [rephrase(s, rng) if rng.random() < 0.5 else s for s in steps_of(problem)]
    if rng.random() >= wrong_rate or len(steps) < 2:
        return "".join(steps)
    i = rng.randrange(len(steps) - 1)
    before = problem.prompt() + "".join(steps[:i])
    wrong = corrupt_step(steps[i], rng, numbers_in(before))
    if wrong is None:
        return "".join(steps)
    steps = steps[:i] + [wrong] + steps[i + 1:]
    if i == len(steps) - 2 and parse_operation(wrong) is not None:  # the answer repeats the wrong result
        steps[-1] = f"{ANSWER_PREFIX} {numbers_in(wrong)[-1]}\n"
    return "".join(steps)


def verdict_prompt(question: str, solutions: list[str]) -> str:
    """The compact verdict layout (`PromptVerdict(compact=True)`): the question, each expert's solution, the
    instruction, then "Solution:" for the verdict model to write after."""
    parts = [f"Question: {question}\n"] + [f"Expert {i}:\n{s}" for i, s in enumerate(solutions, 1)]
    return "".join(parts) + f"{VERDICT_INSTRUCTION}\nSolution:\n"


def verdict_row(problem: Problem, rng: random.Random, eos: str, experts: int = 2, wrong_rate: float = 0.5
                ) -> tuple[str, int]:
    """(text, where the learnt part starts) of one verdict example: `experts` solutions (each wrong at
    `wrong_rate`), then the right solution and the EOS. (The zoo draws these problems without check steps:
    its greedy experts rarely write them, and the rows stay within the models' 512 positions more often.)"""
    prompt = verdict_prompt(problem.question, [expert_solution(problem, rng, wrong_rate) for _ in range(experts)])
    return prompt + problem.solution + "\n" + eos, len(prompt)


__all__ = ["SCORE_INSTRUCTION", "SCORE_LEAD", "VERDICT_INSTRUCTION", "corrupt_step", "expert_solution", "numbers_in",
           "rephrase", "drill_scoring_row", "scoring_row", "steps_of", "verdict_prompt", "verdict_row"]
