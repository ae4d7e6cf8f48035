"""The benchmark commands end to end on the shipped local pairs, shortened: JSON layout, every method's
output checked against plain decoding, ratios consistent with the reported speeds."""

import dataclasses
import json

import pytest

from multispec import zoo
from multispec.cli import main
from multispec.draft_length import StepProfile
from multispec.drafters.recycling import tree_to_text


def _check_table(table: dict, names: set[str], rounds: int = 2) -> dict:
    """The recorder's table: every method timed in every round, each ratio inside its own spread."""
    assert table["baseline"] == "plain" and table["rounds"] == rounds and table["round_inputs"] == "repeat"
    methods = table["methods"]
    assert names <= set(methods)
    assert methods["plain"]["speedup"] == 1.0 and methods["plain"]["speedup_spread"] == [1.0, 1.0]
    for r in methods.values():
        assert r["tokens_per_s"] > 0 and r["tokens"] > 0
        assert len(r["speedup_rounds"]) == rounds
        lo, hi = r["speedup_spread"]
        assert lo <= r["speedup"] <= hi
        assert lo == pytest.approx(min(r["speedup_rounds"]), abs=1e-3)
    return methods


def _check_results(res: dict, benchmark: str) -> None:
    assert res["schema"] == "multispec.bench/1" and res["benchmark"] == benchmark
    assert {"cpu", "git_commit", "torch"} <= set(res["machine"])


def test_bench_text_on_the_main_job_pair(tmp_path):
    """The README's first command (shortened): every row, the draft model's and assisted generation's too."""
    path = tmp_path / "text.json"
    # one round: the 20-layer target's 1200-byte prefills dominate this test's time
    assert main(["bench", "text", "--pair", "stdlib-bytes-large", "--quick", "--max-new-tokens", "12", "--rounds",
                 "1", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    _check_results(res, "text")
    assert res["outputs_identical"] is True
    # the pair ships step profiles, so the chain length is calibrated here: one of the profiled lengths
    k = res["settings"]["chain_k"]
    assert res["settings"]["chain_k_by"] == "calibrated here" and res["settings"]["split"] == "heldout"
    # Token Recycling runs the pair's tree chosen on validation (draft_shape.json), not the CPU default
    assert res["settings"]["recycling_tree"] == tree_to_text(zoo.load("stdlib-bytes-large").recycling_tree)
    assert k in {p.chain_k for p in zoo.load("stdlib-bytes-large").step_profiles if p.chain_k > 0}
    # --quick: its rows (`QUICK_ROWS`) beside plain decoding and the peers
    rows = {"plain", "no_draft", "hf_prompt_lookup", "hf_assisted", f"ngram_chain_k{k}", f"draft_chain_k{k}",
            f"eagle_chain_k{k}", "eagle_chain_auto", "eagle_dynamic_tree", f"hybrid_chain_k{k}", "recycling_tree",
            "suffix_tree"}
    greedy = _check_table(res["tables"]["greedy"], rows, rounds=1)
    assert set(greedy) == rows
    # every greedy output compared with plain decoding's for the same prompt
    for name in ("no_draft", f"eagle_chain_k{k}", f"draft_chain_k{k}", "hf_assisted"):
        assert greedy[name]["outputs"] == {"identical": len(res["settings"]["prompts"])}, name
    assert greedy[f"eagle_chain_k{k}"]["mean_accepted_length"] > 1.5  # the trained pair agrees
    for peer in ("no_draft", "hf_prompt_lookup", "hf_assisted"):
        assert f"speedup_vs_{peer}" in greedy[f"eagle_chain_k{k}"]
    _check_table(res["tables"]["sampling"], {"plain", "no_draft", f"draft_chain_k{k}", f"eagle_chain_k{k}"}, rounds=1)
    from multispec.bench.text import check_row_names
    check_row_names(list(greedy))  # every row the bench makes is one `--methods` accepts before anything loads


def test_bench_text_compile_rows(tmp_path, monkeypatch):
    """`--compile` adds the EAGLE rows on the compiled static step, lossless. `torch.compile` is replaced by
    the function itself here (inductor's CPU build takes minutes; tests/core/test_static_step.py compiles)."""
    compiled = []
    monkeypatch.setattr("torch.compile", lambda fn, **kw: compiled.append(kw) or fn)
    path = tmp_path / "text.json"
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--max-new-tokens", "12", "--rounds", "1",
                 "--compile", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    assert res["outputs_identical"] is True and res["settings"]["compile"] is True
    greedy = _check_table(res["tables"]["greedy"], {"eagle_chain_k4_compiled", "eagle_dynamic_tree_compiled"}, 1)
    assert greedy["eagle_chain_k4_compiled"]["outputs"] == {"identical": len(res["settings"]["prompts"])}
    assert greedy["eagle_chain_k4_compiled"]["mean_accepted_length"] > 1.5
    _check_table(res["tables"]["sampling"], {"eagle_chain_k4_compiled"}, 1)
    assert compiled and all(kw.get("fullgraph") for kw in compiled)


def test_bench_text_methods_runs_those_rows_beside_the_baselines(tmp_path, capsys):
    path = tmp_path / "text.json"
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--max-new-tokens", "8", "--rounds", "1",
                 "--methods", "eagle_chain_k4,suffix_tree", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    greedy, sampling = res["tables"]["greedy"]["methods"], res["tables"]["sampling"]["methods"]
    assert {"plain", "no_draft", "hf_prompt_lookup", "eagle_chain_k4", "suffix_tree"} <= set(greedy)
    assert not {"eagle_dynamic_tree", "ngram_chain", "recycling_tree", "plain_fast_head"} & set(greedy)
    assert set(sampling) == {"plain", "no_draft", "eagle_chain_k4", "suffix_tree"}
    assert res["settings"]["methods"] == ["eagle_chain_k4", "suffix_tree"] and res["outputs_identical"] is True
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--methods", "eagle_chain_k9"]) == 2
    err = capsys.readouterr().err
    assert "--methods: no row eagle_chain_k9; rows: plain, no_draft" in err and "eagle_chain_k4" in err
    with pytest.raises(SystemExit):  # refused by argparse, before anything loads
        main(["bench", "text", "--methods", ","])
    assert "--methods: expected distinct comma-separated names" in capsys.readouterr().err


def test_a_row_no_table_can_have_is_refused_before_any_model_loads(capsys, monkeypatch):
    """A misspelt row fails at once, naming the rows (K standing for the chain length, known after calibration);
    a row of another chain length than the calibrated one fails after it (the test above)."""
    from multispec import zoo

    monkeypatch.setattr(zoo, "load", lambda *a, **k: pytest.fail("a model loaded before the check"))
    assert main(["bench", "text", "--methods", "eagle_chain_k4,eagle_tre"]) == 2
    err = capsys.readouterr().err
    assert "--methods: no row eagle_tre; rows: plain," in err and "eagle_chain_kK" in err


@pytest.mark.parametrize("pair", ["stdlib-mamba2", "stdlib-bamba"])
def test_bench_ssm_on_the_ssm_pairs(tmp_path, pair):
    path = tmp_path / "ssm.json"
    # one round: the CLI's plumbing (the recorder's rounds are tested on a fake clock in test_recorder.py)
    assert main(["bench", "ssm", "--pair", pair, "--quick", "--max-new-tokens", "10", "--rounds", "1",
                 "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    _check_results(res, "ssm")
    assert res["outputs_identical"] is True
    names = {"plain", "chain_k4", "stree_static", "stree_dynamic", "ngram_chain_k5", "hybrid_chain_k4",
             "hybrid_stree_dynamic"}
    if pair == "stdlib-mamba2":
        names.add("chain_replay_k4")
    greedy = _check_table(res["tables"]["greedy"], names, rounds=1)
    _check_table(res["tables"]["sampling"], {"plain", "chain_k4", "stree_dynamic", "hybrid_stree_dynamic"}, rounds=1)
    assert greedy["stree_dynamic"]["mean_accepted_length"] > 1.5


def test_bench_core_runs_every_method(tmp_path):
    path = tmp_path / "core.json"
    assert main(["bench", "core", "--quick", "--max-new-tokens", "6", "--rounds", "2", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    _check_results(res, "core")
    assert res["outputs_identical"] is True
    _check_table(res["tables"]["greedy"], {"plain", "hf_assisted", "draft_chain_k4", "recycling_tree", "suffix_tree"})


@pytest.mark.parametrize("option", ["--max-new-tokens", "--chain-k", "--threads", "--rounds"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_bench_options_reject_non_positive_counts_before_loading(option, value, capsys):
    """`--max-new-tokens 0` once ran 128 tokens and `--chain-k 0` printed `*_chain_k0` rows: a count below 1 is
    refused by argparse, naming the option, before any model loads."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "text", "--quick", option, value])
    assert exit_info.value.code == 2 and option in capsys.readouterr().err


@pytest.mark.parametrize("argv,option", [
    (["bench", "text", "--tree", "4x4"], "--tree"),
    (["bench", "text", "--tree", "0/4/15"], "--tree"),
    (["bench", "vision", "--tree", "8/2"], "--tree"),
    (["bench", "image-ar", "--method", "lantern", "--tree", "a/b/c"], "--tree"),
    (["eval", "reasoning", "--limit", "0"], "--limit"),
    (["eval", "vqa", "--limit", "0"], "--limit"),
    (["eval", "vqa", "--max-new-tokens", "-5"], "--max-new-tokens"),
    (["bench", "reasoning", "--k", "0"], "--k"),
    (["train", "draft", "--target", "x", "--data", "y", "--out", "z", "--steps", "0"], "--steps"),
])
def test_every_count_and_tree_is_checked_by_argparse(argv, option, capsys):
    """`--tree 4x4` once exited 1 without the `multispec` prefix and `eval reasoning --limit 0` ran all 300
    problems: bad values now exit 2 with argparse's message naming the option, before anything loads."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and f"argument {option}" in capsys.readouterr().err


def test_bad_files_name_the_record_or_option_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """A text file given as an image (eval vqa) or as an .npz of images (eval image) is refused with the
    record or option named, before any model loads (it used to give PIL's traceback, or numpy's allow_pickle
    advice after loading the models)."""
    from multispec.image_ar import zoo_pair
    from multispec.vision import cli as vision_cli

    monkeypatch.setattr(zoo_pair, "load_pair", lambda *a, **k: pytest.fail("a model loaded first"))
    monkeypatch.setattr(vision_cli, "_load_target", lambda *a, **k: pytest.fail("a model loaded first"))
    (tmp_path / "notes.txt").write_text("not an image")
    data = tmp_path / "q.jsonl"
    data.write_text('{"question_id": 7, "question": "What?", "image": "notes.txt", "answers": ["x"]}\n')
    assert main(["eval", "vqa", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "notes.txt is not an image" in err and "q.jsonl" in err
    from transformers import LlavaConfig

    LlavaConfig().save_pretrained(tmp_path / "vlm")  # a VLM target's config: train draft routes to the VLM trainer
    assert main(["train", "draft", "--target", str(tmp_path / "vlm"), "--data", str(data), "--out",
                 str(tmp_path / "o")]) == 2
    assert "notes.txt is not an image" in capsys.readouterr().err
    assert main(["train", "draft", "--target", str(tmp_path / "vlm"), "--data", str(data), "--out",
                 str(tmp_path / "o"), "--seq-len", "64"]) == 2
    assert "--seq-len: not an option for this target (vision-language)" in capsys.readouterr().err
    assert main(["train", "draft", "--target", str(tmp_path / "vlm"), "--data", str(data), "--out",
                 str(tmp_path / "o"), "--kind", "eagle3"]) == 2
    assert "--kind: eagle3 does not train for this target; its kinds: vispec, specvlm, eagle" in capsys.readouterr().err
    assert main(["eval", "image", "--images", str(tmp_path / "notes.txt")]) == 2
    err = capsys.readouterr().err
    assert "--images:" in err and "not an .npz archive" in err and "allow_pickle" not in err.split("(")[0]
    assert main(["eval", "image", "--num", "15"]) == 2
    assert "--num: expected a positive multiple of 10" in capsys.readouterr().err


def test_bench_text_chain_k_auto_calibrates_on_this_machine(tmp_path, capsys, monkeypatch):
    """`--chain-k auto` (the default for a pair with step profiles) measures the verification cost here and
    runs the predicted length: with profiles for k = 3 alone beside the baseline, it must run k = 3 and
    store the measured cost and the prediction. A pair without profiles is refused by name."""
    load = zoo.load

    def with_profiles(name):
        pair = load(name)
        pair.step_profiles = [StepProfile(k, mode, widths, 100, 0.5, 2.0) for mode in ("greedy", "sampling")
                              for k, widths in ((0, {1: 100}), (3, {1: 10, 4: 30}))]
        return pair

    monkeypatch.setattr(zoo, "load", with_profiles)
    path = tmp_path / "text.json"
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--max-new-tokens", "8", "--rounds", "1",
                 "--methods", "eagle_chain_k3", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    s = res["settings"]
    assert s["chain_k"] == 3 and s["chain_k_by"] == "calibrated here"
    # the profiled widths 1 and 4, and every width up to 2 beyond the widest (where a step may be padded to)
    assert set(s["chain_k_calibration"]["verify_ms"]) == {"1", "2", "3", "4", "5", "6"}
    assert all(int(w) > int(m) for m, w in s["chain_k_calibration"]["pad_widths"].items())
    # of the rows that ran, only the profiled row pads (the other rows' widths were never profiled; the suffix
    # chains of its length, not run here, pad too)
    calibration = s["chain_k_calibration"]
    assert calibration["padded_rows"] == (["eagle_chain_k3"] if calibration["pad_widths"] else [])
    assert set(s["chain_k_calibration"]["predicted_speedup_vs_no_draft"]) == {"3"}
    assert "eagle_chain_k3" in res["tables"]["greedy"]["methods"] and res["outputs_identical"] is True
    assert "chosen chain k=3" in capsys.readouterr().out
    monkeypatch.setattr(zoo, "load", load)
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--chain-k", "auto"]) == 2
    assert "--chain-k auto: stdlib-bytes has no step profiles" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # refused by argparse
        main(["bench", "text", "--chain-k", "fast"])


def test_zoo_tune_chooses_shapes_on_validation_and_writes_them(tmp_path, capsys, monkeypatch):
    """`multispec zoo tune`: every candidate timed on validation prompts against plain decoding; `--write` stores
    the choice (and the chain lengths' step profiles) in the pair's draft_shape.json, which `zoo.load` reads,
    then Token Recycling's tree beside it. The pair's shipped file is left alone (the test writes a copy)."""
    from multispec.bench import tune

    shipped = tune.shape_file("stdlib-bytes")
    monkeypatch.setattr(tune, "shape_file", lambda name: tmp_path / "draft_shape.json")
    path = tmp_path / "shape.json"
    assert main(["zoo", "tune", "stdlib-bytes", "--chains", "2,3", "--trees", "2/2/3", "--rounds", "1",
                 "--max-new-tokens", "8", "--json", str(path), "--write"]) == 0
    res = json.loads(path.read_text())
    greedy = res["tables"]["greedy"]["methods"]
    assert {"plain", "no_draft", "chain_k2", "chain_k3", "tree_2/2/3"} <= set(greedy)
    assert res["chosen"]["chain_k"] in (2, 3) and res["chosen"]["tree"] == "2/2/3"
    written = json.loads((tmp_path / "draft_shape.json").read_text())
    assert written["chain_k"] == res["chosen"]["chain_k"] and written["tree"] == "2/2/3"
    assert {(p["chain_k"], p["mode"]) for p in written["profiles"]} >= {(2, "greedy"), (3, "sampling")}
    assert written["chosen_by"].startswith("multispec zoo tune stdlib-bytes --what shape")
    assert main(["zoo", "tune", "stdlib-bytes", "--what", "recycling", "--trees", "0", "0,1", "--rounds", "1",
                 "--max-new-tokens", "8", "--write"]) == 0
    again = json.loads((tmp_path / "draft_shape.json").read_text())
    assert again["recycling_tree"] in ("0", "0,1") and again["chain_k"] == written["chain_k"]
    assert "chosen on validation" in capsys.readouterr().out
    assert not shipped.exists() or "zoo tune" not in shipped.read_text()  # the shipped file untouched
    assert main(["zoo", "tune", "stdlib-bytes", "--trees", "2/2"]) == 2
    assert "--trees: expected DEPTH/TOPK/TOTAL" in capsys.readouterr().err


def test_zoo_tune_chooses_chat_lookup_on_validation_questions_and_eval_chat_runs_it(tmp_path, capsys, monkeypatch):
    """`zoo tune --what chat-lookup`: every (chain length, shortest n-gram) candidate timed on the chat set's
    validation questions against plain decoding, every turn compared; `--write` stores the fastest, `zoo.load`
    reads it and `eval chat` runs it as a row of its own (in `--quick` too), lossless."""
    from multispec import zoo
    from multispec.bench import tune

    monkeypatch.setattr(tune, "shape_file", lambda name: tmp_path / "draft_shape.json")
    path = tmp_path / "lookup.json"
    assert main(["zoo", "tune", "stdlib-bytes", "--what", "chat-lookup", "--chains", "2,3", "--min-ngrams", "1,2",
                 "--per-category", "1", "--max-new-tokens", "32", "--rounds", "1", "--json", str(path),
                 "--write"]) == 0
    res = json.loads(path.read_text())
    greedy = res["tables"]["greedy"]["methods"]
    names = {"ngram_chain_k2_min1", "ngram_chain_k3_min1", "ngram_chain_k2_min2", "ngram_chain_k3_min2"}
    assert set(greedy) == {"plain"} | names
    assert all(greedy[n]["outputs"] == {"identical": 6} for n in names)  # six validation questions, one each kind
    assert all(greedy[n]["mean_accepted_length"] > 1.1 for n in names)  # with drafts accepted (2-grams' too)
    # the shortest n-gram reaches the drafter: refusing 1-token matches drafts (and keeps) less on these answers
    assert greedy["ngram_chain_k2_min2"]["mean_accepted_length"] < greedy["ngram_chain_k2_min1"]["mean_accepted_length"]
    best = f"ngram_chain_k{res['chosen']['chain_k']}_min{res['chosen']['min_ngram']}"
    assert greedy[best]["speedup"] == max(greedy[n]["speedup"] for n in names)  # the fastest (ties: either)
    written = json.loads((tmp_path / "draft_shape.json").read_text())["chat_lookup"]
    assert written["chosen_by"].startswith("multispec zoo tune stdlib-bytes --what chat-lookup (validation split, 6 "
                                           "questions")
    shape = zoo.load("stdlib-bytes")  # the small pair reads no shape file: give it the written one
    monkeypatch.setattr(zoo, "load", lambda name: dataclasses.replace(
        shape, chat_lookup=(written["chain_k"], written["min_ngram"])))
    out = tmp_path / "chat.json"
    assert main(["eval", "chat", "--pair", "stdlib-bytes", "--quick", "--max-new-tokens", "32", "--rounds", "1",
                 "--json", str(out)]) == 0
    chat = json.loads(out.read_text())["tables"]["greedy"]["methods"]
    assert chat[best]["outputs"] == {"identical": 6} and chat[best]["mean_accepted_length"] > 1.1
    assert "hf_prompt_lookup" in chat
    # the sampled table has the row, every turn run (the byte model ends its turn at once with p = 0.61 after
    # "assistant:", so sampled answers here are too short to show drafts kept: the core's chi-square tests do that)
    assert main(["eval", "chat", "--pair", "stdlib-bytes", "--split", "validation", "--per-category", "1",
                 "--max-new-tokens", "32", "--rounds", "1", "--methods", best, "--json", str(out)]) == 0
    sampled = json.loads(out.read_text())["tables"]["sampling"]["methods"]
    assert set(sampled) == {"plain", best} and sampled[best]["tokens"] >= 7  # six questions, seven turns
    assert main(["zoo", "tune", "stdlib-bytes", "--what", "chat-lookup", "--min-ngrams", "4"]) == 2
    assert "--min-ngrams: at most 3" in capsys.readouterr().err
    assert main(["zoo", "tune", "stdlib-bytes", "--min-ngrams", "2"]) == 2
    assert "--min-ngrams: for --what chat-lookup only" in capsys.readouterr().err


def test_zoo_tune_sampled_chat_lookup_is_stored_apart_and_runs_in_the_sampled_table_only(tmp_path, capsys,
                                                                                         monkeypatch):
    """`zoo tune --what chat-lookup --sampled`: the candidates ("auto" an adaptive chain) and the pair's greedy
    choice timed sampled on validation questions; `--write` stores the choice apart (`chat_lookup_sampled`), and
    `eval chat` runs it in its sampled table, not its greedy one."""
    from multispec import zoo
    from multispec.adaptive import AdaptiveChain
    from multispec.bench import tune

    monkeypatch.setattr(tune, "shape_file", lambda name: tmp_path / "draft_shape.json")
    shape = dataclasses.replace(zoo.load("stdlib-bytes"), chat_lookup=(3, 2))  # a greedy choice, as Gemma's
    monkeypatch.setattr(zoo, "load", lambda name: shape)
    path = tmp_path / "lookup.json"
    assert main(["zoo", "tune", "stdlib-bytes", "--what", "chat-lookup", "--sampled", "--chains", "auto,2",
                 "--per-category", "1", "--max-new-tokens", "32", "--rounds", "1", "--json", str(path),
                 "--write"]) == 0
    res = json.loads(path.read_text())
    sampled = res["tables"]["sampling"]["methods"]
    assert set(res["tables"]) == {"sampling"} and res["settings"]["temperature"] == tune.TEMPERATURE
    assert set(sampled) == {"plain", "ngram_chain_auto_min2", "ngram_chain_k2_min2", "ngram_chain_k3_min2"}
    assert all(sampled[n]["tokens"] >= 7 for n in sampled)  # six questions, seven turns, each run
    name = f"ngram_chain_{'auto' if res['chosen']['chain_k'] == 'auto' else 'k' + str(res['chosen']['chain_k'])}_min2"
    assert sampled[name]["speedup"] == max(r["speedup"] for n, r in sampled.items() if n != "plain")
    written = json.loads((tmp_path / "draft_shape.json").read_text())
    assert "chat_lookup" not in written  # the greedy choice is not touched
    stored = written["chat_lookup_sampled"]
    assert stored["temperature"] == tune.TEMPERATURE and "--sampled" in stored["chosen_by"]
    assert zoo._draft_shape(tmp_path)["chat_lookup_sampled"] == (stored["chain_k"], 2)
    assert isinstance(tune.chat_lookup_row("auto", 2).tree, AdaptiveChain)
    # eval chat: the sampled choice in the sampled table only; the greedy choice in both
    monkeypatch.setattr(zoo, "load", lambda name: dataclasses.replace(shape, chat_lookup_sampled=("auto", 2)))
    out = tmp_path / "chat.json"
    assert main(["eval", "chat", "--pair", "stdlib-bytes", "--split", "validation", "--per-category", "1",
                 "--max-new-tokens", "32", "--rounds", "1", "--methods", "ngram_chain_k3_min2,ngram_chain_auto_min2",
                 "--json", str(out)]) == 0
    chat = json.loads(out.read_text())
    assert "ngram_chain_auto_min2" not in chat["tables"]["greedy"]["methods"]
    assert chat["tables"]["greedy"]["methods"]["ngram_chain_k3_min2"]["outputs"] == {"identical": 6}
    assert {"ngram_chain_k3_min2", "ngram_chain_auto_min2"} <= set(chat["tables"]["sampling"]["methods"])
    assert chat["settings"]["sampled_only_rows"] == ["ngram_chain_auto_min2"]
    for argv, error in ((["--temperature", "0.5"], "--temperature: goes with --sampled"),
                        (["--sampled", "--temperature", "0"], "--temperature: must be > 0")):
        assert main(["zoo", "tune", "stdlib-bytes", "--what", "chat-lookup", *argv]) == 2
        assert error in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["zoo", "tune", "stdlib-bytes", "--what", "chat-lookup", "--chains", "auto,k"])
    assert "--chains: expected distinct comma-separated positive integers or auto" in capsys.readouterr().err
    assert main(["zoo", "tune", "stdlib-bytes", "--sampled"]) == 2
    assert "--sampled: for --what chat-lookup only" in capsys.readouterr().err
    assert main(["zoo", "tune", "stdlib-bytes", "--chains", "auto,4"]) == 2
    assert "--chains: auto is a --what chat-lookup candidate only" in capsys.readouterr().err


def test_a_batch_sweep_times_ragged_batches_and_finds_the_crossover(tmp_path, capsys):
    """`bench text --batch`: per batch size, plain batched `generate`, no drafts and the rows on the same ragged
    batch (rows of other lengths), every output identical to plain batched decoding's, tokens/s summed over the
    rows, each table printed when measured; the crossover per row and the plot."""
    path, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--batch", "1,3", "--max-new-tokens", "8",
                 "--rounds", "1", "--json", str(path), "--plot", str(png)]) == 0
    res = json.loads(path.read_text())
    assert set(res["tables"]) == {"1", "3"} and res["settings"]["batches"] == [1, 3]
    k = res["settings"]["chain_k"]
    for b, table in res["tables"].items():
        rows = table["methods"]
        assert {"plain", "no_draft", f"eagle_chain_k{k}", "eagle_dynamic_tree"} <= set(rows)
        for name, row in rows.items():
            if name != "plain":
                assert row["outputs"] == {"identical": 1}, (b, name)
        assert rows["plain"]["tokens"] == int(b) * 8  # summed over the batch's rows
    assert set(res["crossover"]) >= {f"eagle_chain_k{k}"} and "no_draft" not in res["crossover"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "batch 1 (tokens/s summed over the rows)" in printed and "crossover" in printed
    with pytest.raises(SystemExit):  # refused by argparse, before anything loads
        main(["bench", "text", "--batch", "0,2"])
    # a chain row of another length than the run's is named, not silently dropped
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--batch", "1", "--chain-k", "3",
                 "--methods", "eagle_chain_k4,no_draft"]) == 2
    assert "--methods: no row eagle_chain_k4 here: the chain rows have k = 3" in capsys.readouterr().err
