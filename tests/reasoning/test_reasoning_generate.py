"""`multispec generate --pair arith-reasoning --method M --prompt QUESTION`: a reasoning method solves a question,
the base model alone beside it with --compare."""

import json

from multispec.cli import main

QUESTION = "Mia reads 22 pages on Monday and 27 pages on Tuesday. The book has 90 pages. How many pages are left?"


def test_a_method_solves_a_question_beside_the_base_model(tmp_path, capsys):
    out = tmp_path / "solve.json"
    assert main(["generate", "--pair", "arith-reasoning", "--method", "exact", "--prompt", QUESTION, "--compare",
                 "--json", str(out)]) == 0
    record = json.loads(out.read_text())["records"][0]
    assert record["answer"] == 41 and record["base"]["answer"] == 41  # lossless: the base's own answer
    assert record["text"] == record["base"]["text"]
    assert record["mean_accepted_length"] > 1.5 and record["speedup_vs_base"] > 0
    printed = capsys.readouterr().out
    assert QUESTION in printed and "Answer: 41" in printed and "answers agree" in printed
    assert main(["generate", "--pair", "arith-reasoning", "--prompt", QUESTION, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["method"] == "specreason_likelihood"


def test_options_the_reasoning_methods_do_not_take_are_refused(capsys):
    for args, message in [(["--sample"], "--sample: the reasoning methods"), (["--tree", "4"], "--tree: the reasoning"),
                          (["--delta", "0.2"], "--delta: only for image AR")]:
        assert main(["generate", "--pair", "arith-reasoning", "--prompt", QUESTION, *args]) == 2, args
        assert message in capsys.readouterr().err, args
