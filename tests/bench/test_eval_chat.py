"""`multispec eval chat`: the Spec-Bench / MT-bench question format read as the field writes it, every turn run
(turn 2 after the model's own first answer), each greedy output compared with plain decoding's turn by turn,
the leaderboard by kind; the shipped question set."""

import json

import pytest

from multispec.bench.chat import KINDS, SHIPPED, Question, cut_message, per_kind, read_questions, select
from multispec.cli import main
from multispec.testing import make_perturbed_copy, make_target, save_checkpoint


def test_the_shipped_set_has_ten_questions_of_each_kind_half_validation():
    questions = read_questions(SHIPPED)
    assert len(questions) == 60
    for kind in KINDS:
        mine = [q for q in questions if q.kind == kind]
        assert len(mine) == 10, kind
        assert sorted(q.split for q in mine) == ["test"] * 5 + ["validation"] * 5
    multi = [q for q in questions if q.kind == "multi-turn conversation"]
    assert all(len(q.turns) == 2 for q in multi) and len({q.category for q in multi}) == 8  # MT-bench's eight
    assert len({q.question_id for q in questions}) == 60


def test_files_of_the_format_from_elsewhere_read_and_bad_ones_are_named(tmp_path):
    """A Spec-Bench line (no split field) reads as the test split; a line without turns is refused with its
    number, before any model loads."""
    good = tmp_path / "question.jsonl"
    good.write_text(json.dumps({"question_id": 81, "category": "writing", "turns": ["Compose a blog post.",
                                                                                    "Rewrite it."]}) + "\n"
                    + json.dumps({"question_id": 161, "category": "translation", "turns": ["Translate: ..."]}) + "\n")
    questions = read_questions(good)
    assert [q.kind for q in questions] == ["multi-turn conversation", "translation"]
    assert select(questions, "test", 1) == questions and not [q for q in questions if q.split]
    with pytest.raises(ValueError, match="no question of split 'validation'"):
        select(questions, "validation", None)
    assert [q.question_id for q in select(questions, "test", None, ("161",))] == [161]  # ids as text
    with pytest.raises(ValueError, match=r"--question-ids: no question 7 in split 'test'"):
        select(questions, "test", None, ("81", "7"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": []}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected 'turns'"):
        read_questions(bad)


def test_a_long_message_keeps_its_two_ends():
    class Words:  # a whitespace tokenizer
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": text.split()}

        def decode(self, ids):
            return " ".join(ids)

    text = " ".join(f"t{i}" for i in range(10))
    assert cut_message(text, Words(), 20) == text
    assert cut_message(text, Words(), 4) == "t0 t1 ... t8 t9"


def test_per_kind_ratios_are_taken_within_a_round():
    observed = {"plain": [("qa", 2.0, 10), ("rag", 1.0, 10)] * 2, "fast": [("qa", 1.0, 10), ("rag", 1.0, 10),
                                                                          ("qa", 0.5, 10), ("rag", 0.5, 10)]}
    figures = per_kind(observed, "plain", rounds=2)
    assert figures["fast"]["qa"] == {"speedup": 3.0, "speedup_spread": [2.0, 4.0]}
    assert figures["fast"]["rag"] == {"speedup": 1.5, "speedup_spread": [1.0, 2.0]}


def test_eval_chat_on_a_checkpoint_runs_every_turn_and_matches_plain_decoding(tmp_path, capsys):
    target = make_target("llama", seed=3)
    save_checkpoint(tmp_path / "target", target)
    save_checkpoint(tmp_path / "draft", make_perturbed_copy(target, noise=0.02))
    data = tmp_path / "q.jsonl"
    rows = [Question(1, "writing", ("w10 w11 w12 w10 w11", "w13 w14 w13 w14")),
            Question(2, "qa", ("w20 w21 w22 w20 w21 w22",)), Question(3, "rag", ("w30 w31 w32 w30 w31 w32",))]
    data.write_text("\n".join(json.dumps({"question_id": q.question_id, "category": q.category,
                                          "turns": list(q.turns)}) for q in rows) + "\n")
    out = tmp_path / "chat.json"
    assert main(["eval", "chat", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                 "--data", str(data), "--max-new-tokens", "8", "--rounds", "2", "--json", str(out),
                 "--markdown", str(tmp_path / "chat.md")]) == 0
    res = json.loads(out.read_text())
    greedy = res["tables"]["greedy"]["methods"]
    assert {"plain", "hf_prompt_lookup", "no_draft", "ngram_chain_k4", "suffix_tree", "draft_chain_k4"} <= set(greedy)
    assert res["outputs_identical"] is True
    for name, row in greedy.items():
        if name != "plain":
            assert row["outputs"] == {"identical": 6}, name  # three questions, two rounds, every turn equal
    assert greedy["draft_chain_k4"]["mean_accepted_length"] > 1.5  # drafts accepted
    assert res["settings"]["kinds"] == ["multi-turn conversation", "qa", "rag"]
    assert set(res["per_kind"]["greedy"]["draft_chain_k4"]) == set(res["settings"]["kinds"])
    assert "sampling" in res["tables"] and set(res["tables"]["sampling"]["methods"]) >= {"plain", "draft_chain_k4"}
    board = (tmp_path / "chat.md").read_text()
    assert "| method | multi-turn conversation | qa | rag | overall [spread] |" in board
    assert "speedup over plain decoding by kind" in capsys.readouterr().out  # printed as measured
    assert main(["eval", "chat", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "none.jsonl")]) == 2
    capsys.readouterr()
    assert main(["eval", "chat", "--target", str(tmp_path / "target"), "--data", str(data), "--chain-k", "auto"]) == 2
    assert "--chain-k auto: calibrates from a zoo pair's step profiles" in capsys.readouterr().err


def test_a_sampled_table_draws_anew_each_round_with_every_method_on_the_same_seed(tmp_path):
    """`timed(redraw=True)`: round r samples its answers from seed r (the warm-up from 0), for every method alike,
    so the spread over rounds holds the draw; one seed gives one answer again."""
    from dataclasses import replace

    from multispec import SamplingConfig
    from multispec.bench.chat import ChatRunner, timed
    from multispec.drafters import NGramDrafter
    from multispec.generate_cli import load_checkpoint

    save_checkpoint(tmp_path / "target", make_target("llama", seed=3))
    target, _, tokenizer = load_checkpoint(str(tmp_path / "target"), None)
    runner = ChatRunner(target, tokenizer, 12, "plain", None, SamplingConfig(do_sample=True, temperature=1.0))
    q = Question(1, "qa", ("w20 w21 w22 w20 w21",))
    first, again, other = (runner.speculative(replace(q, draw=d), NGramDrafter(), 2, {}).turns for d in (0, 0, 1))
    assert first == again and first != other
    assert runner.plain(q).turns == runner.plain(q).turns != runner.plain(replace(q, draw=1)).turns
    calls = []

    def method(name):
        return lambda q: calls.append((name, q.draw)) or runner.speculative(q, NGramDrafter(), 2, {})

    table, _ = timed({"plain": method("plain"), "lookup": method("lookup")}, [q], 3, compare=False, desc="t",
                     redraw=True)
    assert calls == [("plain", 0), ("lookup", 0)] + [(n, r) for r in range(3) for n in ("plain", "lookup")]
    assert table["round_inputs"] == "redraw"
