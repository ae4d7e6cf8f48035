"""Synthetic arithmetic with step-by-step solutions: the reasoning zoo's training and test data, and the
readers for a user's own problems.

A problem is a multi-step expression ("Compute (23 + 45) * 3 - 17.") or a word problem with several
operations; its solution is one step per operation, steps separated by a blank line ("\\n\\n", the step
delimiter the step-level methods use), and a last step "Answer: N". Each step is written in one of
several equivalent phrasings ("5 * 12 = 60", "5 x 12 = 60", "5 times 12 is 60", ...), and some
solutions check a result ("Let me check: 60 / 5 = 12. Yes."), so models trained on them differ in
phrasing where they agree on arithmetic (what judge verification should accept) and write reflective
words (what Speculative Thinking triggers on).

Files are JSONL with `question` and `answer`; the answer is a number or GSM8K's layout (a worked
solution ending in "#### N"), as `read_problems` accepts.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = "\n\n"
ANSWER_PREFIX = "Answer:"

NAMES = ["Mia", "Leo", "Ava", "Sam", "Noah", "Emma", "Liam", "Zoe", "Omar", "Ines", "Ravi", "Yuki", "Lena", "Tom"]
ITEMS = ["apples", "stickers", "marbles", "cards", "books", "coins", "pencils", "stamps", "shells", "beads"]


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    solution: str = ""  # the worked solution (steps joined by SEPARATOR), when known

    def prompt(self) -> str:
        """The text a model continues: the question, then the solution's first step."""
        return format_prompt(self.question)


def format_prompt(question: str) -> str:
    return f"Question: {question}\nSolution:\n"


# ---- phrasings ----------------------------------------------------------------------------------------

_SYMBOL = {"+": ["+"], "-": ["-"], "*": ["*", "x"], "/": ["/"]}
_WORD = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}
_VERB = {"+": ("Add", "to"), "-": ("Subtract", "from"), "*": ("Multiply", "by"), "/": ("Divide", "by")}


def apply_op(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]


STYLES = ("mixed", "words", "spaced", "lower", "casual")


def phrase(a: int, op: str, b: int, rng: random.Random, style: str = "mixed") -> str:
    """One equivalent way of writing `a op b = r`. `style`: "mixed" (symbols 45%, "a plus b is r" 25%, "Add a
    to b: r" 30%) or "words" (never symbols: a writer with another habit, same random draws); "spaced", "lower"
    and "casual" phrase as "words" (their habits, two spaces, lowercase openings, and lowercase openings with no
    period after a result, are `make_problem`'s)."""
    r = apply_op(a, op, b)
    kind = rng.random()
    if style in ("words", "spaced", "lower", "casual"):
        kind = 0.45 + 0.55 * kind
    elif style != "mixed":
        raise ValueError(f"style: expected one of {', '.join(STYLES)}, got {style!r}")
    if kind < 0.45:
        return f"{a} {rng.choice(_SYMBOL[op])} {b} = {r}"
    if kind < 0.7:
        return f"{a} {_WORD[op]} {b} is {r}"
    verb, prep = _VERB[op]
    if op == "-":  # "Subtract b from a"
        return f"{verb} {b} {prep} {a}: {r}"
    return f"{verb} {a} {prep} {b}: {r}"


def _check(a: int, op: str, b: int, r: int, rng: random.Random) -> str | None:
    """A step re-deriving an operand from the result (None when the inverse is not exact)."""
    inverse = {"+": (r, "-", b, a), "-": (r, "+", b, a), "*": (r, "/", b, a) if b else None,
               "/": (r, "*", b, a)}[op]
    if inverse is None or (op == "/" and a % b):
        return None
    x, iop, y, back = inverse
    lead = rng.choice(["Let me check", "Wait, let me verify", "Check"])
    close = rng.choice(["Yes.", "Correct.", "That is right."])
    return f"{lead}: {x} {rng.choice(_SYMBOL[iop])} {y} = {back}. {close}"


# ---- problems -------------------------------------------------------------------------------------------

def _expression(rng: random.Random) -> tuple[str, list[tuple[int, str, int]]]:
    """A 2-4 operation expression whose usual reading (parentheses where precedence needs them) is the
    left-to-right order of its steps. Operands stay small (products of at most 20 x 5), so the arithmetic
    is learnable by the zoo's models on a CPU budget."""
    n_ops = rng.choice([2, 2, 3, 3, 4])
    value = rng.randint(10, 60)
    text, ops, low = str(value), [], False  # low: the text so far ends in an unparenthesised + or -
    for _ in range(n_ops):
        op = rng.choice(["+", "-", "*", "+", "-"])
        if op == "*" and value > 20:
            op = "-"
        if op == "*":
            b = rng.randint(2, 5)
        elif op == "-":
            b = rng.randint(1, min(value - 1, 40)) if value > 1 else 0
            if not b:
                op, b = "+", rng.randint(1, 40)
        else:
            b = rng.randint(1, 40)
        if op == "*" and low:
            text = f"({text})"
        text = f"{text} {op} {b}"
        low = op in "+-"
        ops.append((value, op, b))
        value = apply_op(value, op, b)
    return f"Compute {text}.", ops


def _word(rng: random.Random) -> tuple[str, list[tuple[int, str, int]], list[str]]:
    """A word problem; returns (question, operations, a lead-in for each step)."""
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b, c = rng.randint(10, 60), rng.randint(2, 5), rng.randint(2, 9)
        d = rng.randint(1, a + b * c - 1)
        q = (f"{name} has {a} {item}. {name} buys {b} packs of {c} {item}. Then {name} gives {d} {item} to "
             f"{other}. How many {item} does {name} have now?")
        return q, [(b, "*", c), (a, "+", b * c), (a + b * c, "-", d)], ["The packs hold ", f"{name} then has ",
                                                                      f"After giving {d} away, "]
    if kind == 1:
        price, n = rng.randint(2, 9), rng.randint(2, 9)
        paid = rng.choice([x for x in (50, 100) if x >= price * n])
        q = (f"A shop sells {item} for {price} dollars each. {name} buys {n} {item} and pays with {paid} dollars. "
             f"How much change does {name} get?")
        return q, [(n, "*", price), (paid, "-", n * price)], ["The cost is ", "The change is "]
    if kind == 2:
        a, b = rng.randint(10, 60), rng.randint(10, 60)
        total = a + b + rng.randint(5, 60)
        q = (f"{name} reads {a} pages on Monday and {b} pages on Tuesday. The book has {total} pages. "
             f"How many pages are left?")
        return q, [(a, "+", b), (total, "-", a + b)], ["So far ", "The pages left are "]
    if kind == 3:
        groups, per = rng.randint(2, 6), rng.randint(3, 12)
        extra = rng.randint(1, 9)
        students = groups * per
        q = (f"{students} students are split into {groups} equal groups. Then {extra} more students join each "
             f"group. How many students are in each group now?")
        return q, [(students, "/", groups), (per, "+", extra)], ["Each group first has ", "Each group now has "]
    rows, per = rng.randint(2, 9), rng.randint(2, 9)
    cut = rng.randint(1, rows * per - 1)
    new = rng.randint(1, 30)
    q = (f"A farmer plants {rows} rows of {per} trees. {cut} trees are cut down. Then {new} new trees are "
         f"planted. How many trees are there now?")
    return q, [(rows, "*", per), (rows * per, "-", cut), (rows * per - cut, "+", new)], \
        ["The rows hold ", "After the cut, ", "With the new trees, "]


REFLECT_CUE = "Wait, "  # a reflective cue at the start of a step (a negative word of Speculative Thinking's)


def make_problem(rng: random.Random, check_rate: float = 0.25, style: str = "mixed",
                 reflect: tuple[float, ...] = ()) -> Problem:
    """One random problem with a worked solution in random phrasings (of `style`, see `phrase`).

    `reflect`: per operation (0-based; the last rate holds for every later one), the rate at which its step
    opens with `REFLECT_CUE`: the traces of a writer that hesitates where it tends to err (the zoo's reflective
    small model, `zoo_pair.REFLECTIVE`). Empty: no cues, and the random stream is that of earlier releases."""
    if any(not 0.0 <= r <= 1.0 for r in reflect):
        raise ValueError(f"reflect: expected rates in [0, 1], got {reflect!r}")
    if rng.random() < 0.4:
        question, ops = _expression(rng)
        leads = [""] * len(ops)
    else:
        question, ops, leads = _word(rng)
    steps = []
    for i, ((a, op, b), lead) in enumerate(zip(ops, leads)):
        text = phrase(a, op, b, rng, style)
        if lead and rng.random() < 0.5:
            text = lead + text[0].lower() + text[1:]
        if reflect and rng.random() < reflect[min(i, len(reflect) - 1)]:
            text = REFLECT_CUE + text[0].lower() + text[1:]
        steps.append(text + ".")
        if rng.random() < check_rate:
            check = _check(a, op, b, apply_op(a, op, b), rng)
            if check is not None:
                steps.append(check)
    a, op, b = ops[-1]
    answer = apply_op(a, op, b)
    steps.append(f"{ANSWER_PREFIX} {answer}")
    if style == "spaced":  # a writer that puts two spaces between words: right text the base never writes
        steps = [s.replace(" ", "  ") for s in steps]
    if style in ("lower", "casual"):  # a writer that opens its steps in lowercase ("add 5 to 12: 17."), the
        # answer line aside: the base gives such an opening < 0.002 yet its arithmetic after it holds (it has read
        # "add" after a word problem's lead-ins), so a floor cannot tell it from a wrong digit
        steps = [s if s.startswith(ANSWER_PREFIX) else s[0].lower() + s[1:] for s in steps]
    if style == "casual":  # and no period after a step's result ("add 5 to 12: 17"; < 1e-4 for the base, which
        # still reaches the answer after it: BENCHMARKS.md, Habits under every floor)
        steps = [s[:-1] if re.search(r"\d\.$", s) else s for s in steps]
    return Problem(question, answer, SEPARATOR.join(steps))


def make_drill(rng: random.Random, facts: int = 14, style: str = "symbols") -> str:
    """Arithmetic practice: `facts` lines over the operand ranges the problems use (the zoo mixes them into
    training so that small models learn the arithmetic their solutions need on a CPU budget). `style`:
    "symbols" (every line "a op b = r") or a `phrase` style ("mixed": the solutions' phrasings, so a model
    practises the arithmetic in every way a step may be written, not only the symbolic one)."""
    if style != "symbols" and style not in STYLES:
        raise ValueError(f"style: expected 'symbols' or one of {', '.join(STYLES)}, got {style!r}")
    lines = []
    for _ in range(facts):
        op = rng.choice(["+", "-", "*", "/"])
        if op == "+":
            a, b = rng.randint(1, 120), rng.randint(1, 60)
        elif op == "-":
            a = rng.randint(2, 180)
            b = rng.randint(1, a - 1)
        elif op == "*":
            a, b = rng.randint(2, 20), rng.randint(2, 9)
        else:
            b = rng.randint(2, 9)
            a = b * rng.randint(2, 12)
        lines.append(f"{a} {op} {b} = {apply_op(a, op, b)}" if style == "symbols" else phrase(a, op, b, rng, style))
    return "\n".join(lines)


def make_problems(n: int, seed: int, check_rate: float = 0.25) -> list[Problem]:
    rng = random.Random(seed)
    return [make_problem(rng, check_rate) for _ in range(n)]


def training_text(problem: Problem, eos: str) -> str:
    return problem.prompt() + problem.solution + "\n" + eos


# ---- answers ------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[0].replace(",", ""))
    except ValueError:
        return None


def extract_answer(text: str) -> float | None:
    """The final answer of a generated solution: after the last "Answer:" (or GSM8K's "####", or a
    \\boxed{}); None when there is none."""
    for marker in (ANSWER_PREFIX, "####"):
        if marker in text:
            return _number(text.rsplit(marker, 1)[1])
    boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
    if boxed:
        return _number(boxed[-1])
    return None


def is_correct(text: str, answer: float) -> bool:
    got = extract_answer(text)
    return got is not None and abs(got - float(answer)) < 1e-6


# ---- files ----------------------------------------------------------------------------------------------

def write_problems(problems: list[Problem], path: str | Path) -> None:
    """JSONL in GSM8K's layout: the worked solution, then "#### N"."""
    with open(path, "w") as f:
        for p in problems:
            f.write(json.dumps({"question": p.question, "answer": f"{p.solution}\n#### {p.answer}"}) + "\n")


def read_problems(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file with `question` and `answer` (a number, or text ending in "#### N" as in
    GSM8K). A malformed line raises naming the file and line."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {i} is not JSON ({e.msg})") from None
            if not isinstance(record, dict) or "question" not in record or "answer" not in record:
                raise ValueError(f"{path}: line {i} needs 'question' and 'answer'")
            raw = record["answer"]
            solution = ""
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                value = raw
            elif isinstance(raw, str):
                solution, _, tail = raw.rpartition("####") if "####" in raw else ("", "", raw)
                value = _number(tail)
            else:
                value = None
            if value is None:
                raise ValueError(f"{path}: line {i}: 'answer' holds no number ({raw!r})")
            out.append(Problem(str(record["question"]), int(value) if float(value).is_integer() else value,
                               solution.strip()))
    if not out:
        raise ValueError(f"{path}: no problems")
    return out
