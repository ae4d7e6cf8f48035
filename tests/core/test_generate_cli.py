"""`multispec generate`: text in, text out. On the zoo's byte pair the streamed text is the speculative
output, which equals plain `generate` (greedy) with drafts accepted; on a user's checkpoint folder with its
own tokenizer and a draft model or prompt lookup; bad options exit 2 naming the option, before any model
loads."""

import json

import pytest

from multispec import zoo
from multispec.cli import main
from multispec.testing import make_decoder, make_perturbed_copy, make_target, save_checkpoint


def test_a_zoo_pair_streams_what_it_generates_and_compares_with_generate(tmp_path, capsys):
    out = tmp_path / "gen.json"
    assert main(["generate", "--pair", "stdlib-bytes", "--prompt", "def parse(", "--max-new-tokens", "24",
                 "--compare", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())["records"][0]
    assert printed.startswith("def parse(" + record["text"] + "\n")  # streamed as committed, nothing lost
    assert record["new_tokens"] == 24 and record["identical_to_plain"] is True
    assert record["mean_accepted_length"] > 1.5  # drafts are accepted: this is speculation
    assert "mean accepted length" in printed and "plain generate" in printed and "outputs identical" in printed
    assert "warmed up, 5 alternating rounds" in printed and record["rounds"] == 5 and len(record["speedup_spread"]) == 2
    assert len(record["plain_rates"]) == 5 and record["plain"]["tokens"]


def test_compare_warms_both_up_and_alternates_which_goes_first(monkeypatch):
    """The comparison `--compare` prints: plain `generate` runs once untimed before any timing (the streamed run
    warmed speculation), the rounds alternate which goes first, the median and spread come from the rounds, and
    rounds more than 20% apart are called noisy. Mutation caught: timing the cold first runs (the README example
    printed 0.40x so)."""
    import multispec.bench.machine as machine
    from multispec.generate_cli import timed_rounds

    monkeypatch.setattr(machine, "busy", lambda: None)
    calls, clock = [], iter([0.0, 1.0, 1.0, 1.5, 2.0, 2.25, 3.0, 4.0, 4.0, 4.5, 5.0, 5.25])
    monkeypatch.setattr("multispec.generate_cli.time.perf_counter", lambda: next(clock))

    class Out:
        num_new_tokens = [10]

    def spec():
        calls.append("spec")
        return Out()

    def plain():
        calls.append("plain")
        return {"tokens": list(range(10))}

    result = timed_rounds(spec, plain, rounds=3)
    assert calls == ["plain", "plain", "spec", "spec", "plain", "plain", "spec"]
    # rounds: plain 1 s / spec 0.5 s -> 2x; spec 0.25 s / plain 1 s -> 4x; plain 0.5 s / spec 0.25 s -> 2x
    assert result["speedup"] == 2.0 and result["speedup_spread"] == [2.0, 4.0] and result["rounds"] == 3
    assert "more than 20% apart" in result["noisy"]


def test_a_gemma2_checkpoint_on_the_static_step(tmp_path):
    """`--step static` on a class the lean step does not serve: the model's own forward at fixed shapes."""
    save_checkpoint(tmp_path / "target", make_decoder("gemma2", seed=3))
    assert main(["generate", "--target", str(tmp_path / "target"), "--prompt", "w10 w11 w12 w10 w11 w12 w10",
                 "--max-new-tokens", "16", "--step", "static", "--compare", "--no-stream", "--json",
                 str(tmp_path / "g.json")]) == 0
    record = json.loads((tmp_path / "g.json").read_text())["records"][0]
    assert record["identical_to_plain"] is True and record["new_tokens"] == 16


@pytest.mark.parametrize("draft", ["model", "ngram", "suffix"])
def test_a_users_checkpoint_with_a_draft_model_or_lookup(tmp_path, capsys, draft):
    target = make_target("llama", seed=3)
    save_checkpoint(tmp_path / "target", target)
    args = ["generate", "--target", str(tmp_path / "target"), "--prompt", "w10 w11 w12 w10 w11",
            "--max-new-tokens", "16", "--tree", "3", "--compare", "--no-stream", "--json", str(tmp_path / "g.json")]
    if draft == "model":
        save_checkpoint(tmp_path / "draft", make_perturbed_copy(target, noise=0.02))
        args += ["--draft", str(tmp_path / "draft")]
    elif draft == "suffix":
        args += ["--draft", "suffix"]
    assert main(args) == 0
    record = json.loads((tmp_path / "g.json").read_text())["records"][0]
    assert record["identical_to_plain"] is True and record["new_tokens"] > 0
    if draft == "model":
        assert record["mean_accepted_length"] > 1.5
    assert capsys.readouterr().out.startswith("w10 w11 w12 w10 w11" + record["text"])


def test_bad_options_name_themselves_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(zoo, "load", lambda *a, **k: pytest.fail("a model loaded before the check"))
    prompts = tmp_path / "empty.txt"
    prompts.write_text("\n\n")
    for args, message in [(["--pair", "nope", "--prompt", "x"], "--pair: unknown zoo pair"),
                          (["--pair", "stdlib-bytes", "--prompt", "x", "--draft", "ngram"], "--draft: a zoo pair"),
                          (["--target", str(tmp_path), "--prompt", "x"], "--target: no config.json"),
                          (["--pair", "stdlib-bytes", "--prompt", ""], "--prompt: empty"),
                          (["--pair", "stdlib-bytes", "--prompts", str(prompts)], "--prompts: "),
                          (["--pair", "stdlib-bytes", "--prompt", "x", "--tree", "0"], "--tree: a chain"),
                          (["--pair", "stdlib-bytes", "--prompt", "x", "--tree", "4x4"], "--tree: expected K"),
                          (["--pair", "stdlib-bytes", "--prompt", "x", "--sample", "--temperature", "0"],
                           "--temperature"),
                          (["--pair", "arith-reasoning", "--prompt", "x", "--step", "static"],
                           "--step: 'static' serves the text, vision-language and image pairs; reasoning pairs run")]:
        assert main(["generate", *args]) == 2, args
        assert message in capsys.readouterr().err, args
    with pytest.raises(SystemExit):  # argparse: exit 2, the option named
        main(["generate", "--pair", "stdlib-bytes", "--prompt", "x", "--max-new-tokens", "0"])
    assert "--max-new-tokens" in capsys.readouterr().err
    assert main(["generate", "--pair", "stdlib-bytes"]) == 2
    assert "--prompt: give the text" in capsys.readouterr().err
    # another modality's option on a text pair names the option and the pairs it is for
    assert main(["generate", "--pair", "stdlib-bytes", "--prompt", "x", "--image", "a.png"]) == 2
    assert "--image: only for vision-language pairs (vqa-llava)" in capsys.readouterr().err
