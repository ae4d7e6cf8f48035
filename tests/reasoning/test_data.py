"""The synthetic arithmetic: answers are what the steps compute, phrasings vary, checks re-derive an operand;
files in GSM8K's layout and plain numbers read back, and a malformed line is named."""

import json
import re

import pytest

from multispec.reasoning import extract_answer, is_correct, make_problems, read_problems, write_problems


def _evaluate(step: str) -> bool:
    """Whether a step's arithmetic (any phrasing) is right."""
    m = re.search(r"(\d+) (?:\*|x|times) (\d+) (?:=|is) (\d+)", step) or \
        re.search(r"Multiply (\d+) by (\d+): (\d+)", step, re.I)
    if m:
        a, b, r = map(int, m.groups())
        return a * b == r
    return True


def test_problems_solve_to_their_answers():
    problems = make_problems(500, seed=1)
    phrasings = set()
    for p in problems:
        steps = p.solution.split("\n\n")
        assert steps[-1] == f"Answer: {p.answer}"
        assert all(_evaluate(s) for s in steps)
        if p.question.startswith("Compute"):
            assert eval(p.question[len("Compute "):-1]) == p.answer
        phrasings |= {s.split()[1] for s in steps if "*" in s or " x " in s or "times" in s}
        assert p.answer >= 0
    assert {"*", "x", "times"} <= phrasings  # equivalent phrasings occur
    assert any("check" in p.solution.lower() or "verify" in p.solution.lower() for p in problems)
    assert make_problems(5, seed=1) == problems[:5]  # seeded


def test_files_round_trip_and_bad_lines_are_named(tmp_path):
    problems = make_problems(4, seed=2)
    path = tmp_path / "p.jsonl"
    write_problems(problems, path)
    back = read_problems(path)
    assert [(p.question, p.answer) for p in back] == [(p.question, p.answer) for p in problems]
    assert "#### " in path.read_text().splitlines()[0]
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"question": "1+1?", "answer": 2}) + "\n" + json.dumps({"question": "x", "answer": "7"}))
    assert [p.answer for p in read_problems(plain)] == [2, 7]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": 1}) + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2"):
        read_problems(bad)
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="line 1.*answer"):
        read_problems(bad)


def test_answers_are_read_after_the_last_marker():
    assert extract_answer("3 + 4 = 7.\n\nAnswer: 7") == 7
    assert extract_answer("so #### 1,234") == 1234
    assert extract_answer("no answer here") is None
    assert is_correct("Answer: 12\n", 12) and not is_correct("Answer: 13", 12)


def test_the_words_style_never_writes_symbols_and_keeps_the_same_problems():
    import random

    from multispec.reasoning.data import make_problem, phrase

    mixed = [make_problem(random.Random(i), 0.25) for i in range(200)]
    words = [make_problem(random.Random(i), 0.25, "words") for i in range(200)]
    assert [(p.question, p.answer) for p in mixed] == [(p.question, p.answer) for p in words]
    for p in words:
        for step in p.solution.split("\n\n"):
            if not any(w in step for w in ("check", "Check", "verify")):  # check steps keep their symbols
                assert not re.search(r"\d [-+*x/] \d", step), step
    assert sum(s != w for s, w in zip(mixed, words)) > 100  # the habits differ
    with pytest.raises(ValueError, match="style"):
        phrase(1, "+", 2, random.Random(0), "emoji")


def test_the_spaced_style_is_the_words_style_with_two_spaces_between_words():
    import random

    from multispec.reasoning.data import make_problem

    for i in range(100):
        words, spaced = (make_problem(random.Random(i), 0.25, style) for style in ("words", "spaced"))
        assert (spaced.question, spaced.answer) == (words.question, words.answer)
        assert spaced.solution == "\n\n".join(s.replace(" ", "  ") for s in words.solution.split("\n\n"))
        assert "  " in spaced.solution and is_correct(spaced.solution, spaced.answer)


def test_the_lower_and_casual_styles_are_the_words_style_with_habits_the_base_never_writes():
    """`lower`: steps open in lowercase, the answer line kept (it is what `extract_answer` reads); `casual`: the
    same, and no period after a step's result."""
    import random

    from multispec.reasoning.data import make_problem

    opened = dropped = 0
    for i in range(100):
        words, lower, casual = (make_problem(random.Random(i), 1.0, style) for style in ("words", "lower", "casual"))
        assert (lower.question, lower.answer) == (casual.question, casual.answer) == (words.question, words.answer)
        steps = zip(words.solution.split("\n\n"), lower.solution.split("\n\n"), casual.solution.split("\n\n"),
                    strict=True)
        for w, lo, ca in steps:
            assert lo == (w if w.startswith("Answer:") else w[0].lower() + w[1:])
            assert ca == (lo[:-1] if re.search(r"\d\.$", lo) else lo)
            opened += lo[0].islower() and w[0].isupper()
            dropped += ca != lo
        assert is_correct(lower.solution, lower.answer) and is_correct(casual.solution, casual.answer)
    assert opened > 300 and dropped > 200  # every check and most operations open with a word; every operation


def test_practice_lines_are_right_in_every_phrasing():
    import random

    from multispec.reasoning.data import make_drill

    lines = make_drill(random.Random(3), facts=60, style="mixed").split("\n")
    kinds = set()
    for line in lines:
        numbers = [int(n) for n in re.findall(r"\d+", line)]
        if line[0].isdigit():  # "a op b = r" or "a plus b is r"
            a, b, r = numbers
            op = next(w for w in ("+", "-", "*", "x", "/", "plus", "minus", "times", "divided") if f" {w} " in line)
            kinds.add("=" if " = " in line else "is")
        else:  # "Add a to b: r", "Subtract b from a: r"
            x, y, r = numbers
            op = line.split()[0]
            a, b = (y, x) if op == "Subtract" else (x, y)
            kinds.add(":")
        expected = {"+": a + b, "plus": a + b, "Add": a + b, "-": a - b, "minus": a - b, "Subtract": a - b,
                    "*": a * b, "x": a * b, "times": a * b, "Multiply": a * b}.get(op, a // b)
        assert r == expected, line
    assert kinds == {"=", "is", ":"}
    assert all(" = " in line for line in make_drill(random.Random(3), facts=20).split("\n"))  # the default
    with pytest.raises(ValueError, match="style"):
        make_drill(random.Random(3), style="shouty")
