"""The rows that teach the zoo's base the step-level methods' prompts: wrong steps are wrong, the scoring and
verdict rows are laid out exactly as the methods send their prompts at run time, and reflective cues sit where
they are asked for."""

import random

import pytest

from multispec import zoo
from multispec.reasoning import zoo_pair
from multispec.reasoning.data import REFLECT_CUE, SEPARATOR, apply_op, make_problem, read_problems
from multispec.reasoning.scoring import PromptScorer
from multispec.reasoning.speculative_verdict import ExpertAnswer, PromptVerdict
from multispec.reasoning.task_data import (SCORE_INSTRUCTION, SCORE_LEAD, parse_operation, corrupt_step, scoring_row,
                                           steps_of, verdict_row)
from multispec.reasoning.zoo_pair import ByteTokenizer


def _values(step):
    op, swapped, (x, y, r) = parse_operation(step)
    a, b = (int(y.group()), int(x.group())) if swapped else (int(x.group()), int(y.group()))
    return op, a, b, int(r.group())


def test_every_step_of_a_solution_is_right_and_every_corrupted_one_wrong():
    rng = random.Random(0)
    kinds = {"operand": 0, "result": 0, "answer": 0}
    for _ in range(300):
        p = make_problem(rng)
        for step in steps_of(p):
            wrong = corrupt_step(step, rng, [3, 7, 50])
            assert wrong is not None and wrong != step
            if parse_operation(step) is None:  # the answer step
                assert step.startswith("Answer:") and wrong.startswith("Answer:")
                kinds["answer"] += 1
                continue
            op, a, b, r = _values(step)
            assert apply_op(a, op, b) == r  # the reference's steps (checks included) are right
            op2, a2, b2, r2 = _values(wrong)
            assert op2 == op and ((a2, b2) != (a, b) or r2 != r)
            if (a2, b2) != (a, b):  # another operand, the arithmetic redone on it (the small models' error)
                assert apply_op(a2, op, b2) == r2
                kinds["operand"] += 1
            else:
                assert r2 != apply_op(a, op, b)
                kinds["result"] += 1
    assert min(kinds.values()) > 100


def test_scoring_rows_end_with_the_prompt_the_scorer_sends_and_score_right_steps_9():
    tok = ByteTokenizer()
    suffix = tok.decode(PromptScorer.plain(tok, instruction=SCORE_INSTRUCTION, lead=SCORE_LEAD).suffix())
    rng = random.Random(1)
    right = wrong = 0
    for _ in range(200):
        p = make_problem(rng)
        text, at = scoring_row(p, rng, "\x03")
        assert at == len(text) - 1 and text[:at].endswith(suffix)
        candidate = text[:at - len(suffix)]
        assert candidate.startswith(p.prompt())
        written = candidate[len(p.prompt()):]
        if text[at] == "9":
            right += 1
            assert (p.solution + "\n\x03").startswith(written)  # the reference's own steps
        else:
            wrong += 1
            assert text[at] in "012" and not (p.solution + "\n\x03").startswith(written)
        assert written.endswith(SEPARATOR) or written.endswith("\n\x03")  # as a writer's step ends
    assert 70 < right < 130 and right + wrong == 200


def test_verdict_rows_are_the_compact_prompt_then_the_right_solution():
    rng = random.Random(2)
    tok = ByteTokenizer()
    for _ in range(20):
        p = make_problem(rng, 0.0)
        text, start = verdict_row(p, rng, "\x03")
        assert text[start:] == p.solution + "\n\x03"
        solutions = text[:start].split("Expert ")[1:]
        reasoning = {f"e{i}": s.split(":\n", 1)[1] for i, s in enumerate(solutions)}
        reasoning[f"e{len(solutions) - 1}"] = reasoning[f"e{len(solutions) - 1}"].split("Check their")[0]
        answers = {n: ExpertAnswer(t, None) for n, t in reasoning.items()}
        assert PromptVerdict(None, tok, compact=True).prompt(p.question, reasoning, answers) == text[:start]
    with pytest.raises(ValueError, match="compact"):
        PromptVerdict(None, tok, compact=True, chat=True)


def test_reflective_cues_open_the_steps_asked_for():
    rng = random.Random(3)
    for _ in range(100):
        p = make_problem(rng, 0.0, reflect=(0.0, 0.0, 1.0))
        ops = [s for s in p.solution.split(SEPARATOR) if not s.startswith("Answer")]
        assert [s.startswith(REFLECT_CUE) for s in ops] == [i >= 2 for i in range(len(ops))]
    # no cues asked: the problems (and the random stream) are those of earlier releases, e.g. the stored test split
    stored = read_problems(zoo.path(zoo_pair.NAME) / "test.jsonl")
    assert [(p.question, p.answer) for p in zoo_pair.test_split()] == [(p.question, p.answer) for p in stored]
    with pytest.raises(ValueError, match="reflect"):
        make_problem(rng, reflect=(0.5, 1.5))


def test_task_rows_teach_only_the_score_or_the_verdict():
    stream = zoo_pair.Batches(zoo_pair.TEACH_TASKS, set())
    tok = ByteTokenizer()
    seen = {"score": 0, "verdict": 0}
    for _ in range(4):
        batch = next(stream)
        for ids, labels in zip(batch["input_ids"], batch["labels"]):
            text = tok.decode([int(t) for t in ids if t])
            learnt = [int(t) for t in labels if t != -100]
            if SCORE_LEAD in text:
                assert len(learnt) == 1 and chr(learnt[0]) in "0129"
                seen["score"] += 1
            elif "Check their steps" in text:
                assert tok.decode(learnt).startswith(text.split("Solution:\n")[-1][:10])
                seen["verdict"] += 1
    assert min(seen.values()) > 0


def test_scoring_batches_hold_scores_alone():
    """`score_batches`: a share of batches made of scoring rows only, so the score's one token per row is not
    drowned by the problems' many; the other batches keep the stage's mix."""
    stream = zoo_pair.Batches(zoo_pair.TEACH_SCORES, set())
    tok = ByteTokenizer()
    kinds = []
    for _ in range(12):
        batch = next(stream)
        learnt = (batch["labels"] != -100).sum(1).tolist()
        scoring = [SCORE_LEAD in tok.decode([int(t) for t in ids if t]) for ids in batch["input_ids"]]
        kinds.append("scores" if all(scoring) and learnt == [1] * len(learnt) else "mixed")
        if kinds[-1] == "mixed":
            assert not all(scoring)
    assert 2 <= kinds.count("scores") <= 10


def test_the_checking_recipe_checks_after_every_operation_it_can_invert():
    """`Recipe.checks`: the checking styled drafter's stream follows operations with checks far more often than
    the base's (CHECK_RATE); the check rate of a recipe that does not set it is unchanged."""
    tok = ByteTokenizer()

    def check_share(recipe) -> float:
        stream, steps, checks = zoo_pair.Batches(recipe, set()), 0, 0
        for _ in range(6):
            for ids in next(stream)["input_ids"]:
                text = tok.decode([int(t) for t in ids if t])
                if "Solution:\n" in text:
                    parts = text.split("Solution:\n")[1].split("\n\n")[:-1]  # the answer line ends the solution
                    steps += len(parts)
                    checks += sum(("check" in s.lower() or "verify" in s) for s in parts)
        return checks / steps

    assert zoo_pair.STYLED.checks == zoo_pair.CHECK_RATE
    assert check_share(zoo_pair.STYLED_CHECKING) > 0.35 > check_share(zoo_pair.STYLED) > 0.05


def test_drill_scoring_rows_score_one_line_and_teach_only_the_score():
    """`score_form="drill"`: each scoring row is one "a op b = r" line and its score, 9 exactly when r is right."""
    from multispec.reasoning.task_data import drill_scoring_row

    rng = random.Random(5)
    for _ in range(200):
        text, at = drill_scoring_row(rng)
        a, op, b, _, r = text[len("Practice:\n"): at].split("\n")[0].split()
        right = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(r)
        assert text[:at].endswith(SCORE_LEAD) and (text[at] == "9") == right and at == len(text) - 1
    stream = zoo_pair.Batches(zoo_pair.TEACH_DRILL_SCORES, set())
    tok = ByteTokenizer()
    batch = next(stream)
    for ids, labels in zip(batch["input_ids"], batch["labels"]):
        text = tok.decode([int(t) for t in ids if t])
        learnt = [int(t) for t in labels if t != -100]
        assert text.startswith("Practice:\n") and len(learnt) == 1 and chr(learnt[0]) in "0129"
    from dataclasses import replace

    with pytest.raises(ValueError, match="score_form"):
        next(zoo_pair.Batches(replace(zoo_pair.TEACH_DRILL_SCORES, score_form="essay"), set()))
