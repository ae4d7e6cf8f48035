"""The demo tabs' logic on the shipped zoo pairs (the Gradio layout is built too, not launched)."""

import pytest

from demos import app, compare, ssm_tab, text_tab
from multispec import DynamicTree, zoo


def test_text_tab_rows_match_plain_and_show_traces():
    table, completion, chain_html, tree_html = text_tab.run("stdlib-bytes", "def parse(self, text):\n",
                                                            max_new_tokens=24)
    assert table.count("| yes |") == 5 and "NO" not in table  # plain + 4 methods, all equal to plain
    assert len(completion) > 0
    assert 'class="acc"' in chain_html and 'class="step"' in tree_html


def test_ssm_tab_compares_replay_closed_form_and_stree():
    pair = zoo.load("stdlib-mamba2")  # the trained byte-level Mamba-2 and its byte Llama draft
    ms = ssm_tab.methods(pair.target, pair.drafter, chain_k=3, tree=DynamicTree(3, 2, 6))
    assert list(ms) == ["chain k=3, state replay", "chain k=3, closed-form commit", "STree 3/2/6"]
    results = compare.compare(pair.target, pair.tokenizer, "import os\nimport sys\n\n\ndef main(", ms,
                              max_new_tokens=16)
    assert all(r.token_ids == results[0].token_ids for r in results)
    assert all(r.tokens == 16 for r in results)
    assert all(r.mean_accepted_length >= 1.8 for r in results[1:]), [r.mean_accepted_length for r in results]
    assert "| NO |" not in compare.summary_markdown(results)


def test_bad_demo_input_names_the_argument():
    with pytest.raises(ValueError, match="pair"):
        ssm_tab.run("nope", "x")
    with pytest.raises(ValueError, match="max_new_tokens"):
        text_tab.run("stdlib-bytes", "x", max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt"):
        text_tab.run("stdlib-bytes", "", max_new_tokens=4)


def test_gradio_app_builds():
    import gradio as gr

    blocks = app.build()
    assert isinstance(blocks, gr.Blocks)


def test_cli_demo_builds_the_app_and_serves_where_it_is_told(capsys, monkeypatch):
    import gradio as gr

    from multispec.cli import main

    assert main(["demo", "--build-only"]) == 0
    assert "built Blocks" in capsys.readouterr().out
    launched = {}
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: launched.update(kw))
    assert main(["demo", "--host", "0.0.0.0", "--port", "7861"]) == 0
    assert launched == {"server_name": "0.0.0.0", "server_port": 7861, "share": False}
    assert main(["demo"]) == 0 and launched["server_name"] == "127.0.0.1"  # this machine only by default
    with pytest.raises(SystemExit):
        main(["demo", "--port", "0"])
    assert "--port" in capsys.readouterr().err


def test_vision_tab_answers_with_every_drafter_and_highlights_accepted_tokens():
    from demos import vision_tab

    image, question = vision_tab.sample("table", seed=4)
    table, answer, shown = vision_tab.run(image, question, max_new_tokens=48, chain_k=3, depth=3, topk=2, total=6)
    assert table.count("| yes |") == 6 and "NO" not in table  # 3 drafters x (chain, tree), all equal to plain
    assert answer
    assert "#c8f7c5" in shown  # some tokens came from accepted drafts
    with pytest.raises(ValueError, match="question"):
        vision_tab.run(image, "  ")
    with pytest.raises(ValueError, match="kind"):
        vision_tab.sample("pie")


def test_image_tab_generates_with_every_method_and_colours_the_token_grid():
    from demos import image_tab

    table, gallery, grids = image_tab.run(7, seed=1, delta=0.2)
    assert len(gallery) == 3 and gallery[0][0].size == (224, 224)
    assert table.count("| ") >= 3 * 5 and "LANTERN delta=0.2" in table
    assert "#c8f7c5" in grids  # some codes came from accepted drafts
    with pytest.raises(ValueError, match="label"):
        image_tab.run(12)
    with pytest.raises(ValueError, match="delta"):
        image_tab.run(3, delta=2.0)


def test_continuous_tab_runs_every_method_and_colours_the_patch_grid():
    from demos import continuous_tab

    table, gallery, grid = continuous_tab.run(4, seed=2, k=4)
    assert len(gallery) == 3 and gallery[0][0].size == (224, 224)
    assert "speculative (k=4, exact)" in table and "5 diffusion steps" in table
    assert "#c8f7c5" in grid  # some patches came from accepted drafts
    with pytest.raises(ValueError, match="label"):
        continuous_tab.run(10)
    with pytest.raises(ValueError, match="fewer_steps"):
        continuous_tab.run(3, fewer_steps=50)


def test_reasoning_tab_solves_a_problem_and_colours_who_wrote_each_step():
    from demos import reasoning_tab

    table, chain, thinking = reasoning_tab.run(0, threshold=10.0)  # every step rewritten by the base model
    assert "| base alone |" in table and "| SpecReason |" in table and "| Speculative Thinking |" in table
    assert "#cfe3ff" in chain and "line-through" in chain and "score" in chain
    table, chain, _ = reasoning_tab.run(0, threshold=0.0)  # every small step accepted
    assert "#c8f7c5" in chain and "line-through" not in chain
    table, _, _ = reasoning_tab.run(0, question="Compute 12 + 7 - 3.")
    assert "| - |" in table  # no reference answer for a question of one's own
    with pytest.raises(ValueError, match="problem"):
        reasoning_tab.run(10_000)
    with pytest.raises(ValueError, match="threshold"):
        reasoning_tab.run(0, threshold=11)


def test_reasoning_tab_colours_the_tokens_only_the_judge_approved():
    from demos import reasoning_tab

    table, text = reasoning_tab.run_judge(0, judge_threshold=1.0)  # nothing passes: exact decoding
    assert "| exact (styled drafter" in table and "| judge (styled drafter" in table
    assert "approved 0 drafted" in table and reasoning_tab.TOKEN_COLOURS["judge"] not in text
    assert reasoning_tab.TOKEN_COLOURS["exact"] in text and reasoning_tab.TOKEN_COLOURS["base"] in text
    # the shipped judge approves some of the styled drafter's wordings within the first few problems
    assert any(reasoning_tab.TOKEN_COLOURS["judge"] in reasoning_tab.run_judge(p)[1] for p in range(6))
    with pytest.raises(ValueError, match="judge_threshold"):
        reasoning_tab.run_judge(0, judge_threshold=2)


def test_endpoints_have_names_and_bad_requests_show_their_message():
    """Every button is a named endpoint with readable parameters (it used to be `/lambda_4` taking `l, s, d, g`);
    a bad request raises `gradio.Error` with the message, which Gradio shows in the page (it used to show only
    its generic "error" badge, the message reaching the server log alone)."""
    import inspect

    import gradio as gr

    from demos import image_tab

    blocks = app.build()
    names = {fn.api_name for fn in blocks.fns.values() if fn.api_name}
    assert {"text", "ssm", "vision", "vision_sample", "image", "continuous", "reasoning", "reasoning_judge"} <= names
    assert not any(name.startswith("lambda") for name in names)
    assert list(inspect.signature(compare.shown(image_tab.generate_digit)).parameters) == \
        ["digit_class", "seed", "delta", "guidance_scale"]
    for call, message in [(lambda: compare.shown(text_tab.run)("stdlib-bytes", "", 4), "prompt"),
                          (lambda: compare.shown(image_tab.generate_digit)(12, 0, 0.2, 2.0), "label"),
                          (lambda: compare.shown(ssm_tab.run)("nope", "x"), "pair")]:
        with pytest.raises(gr.Error, match=message):
            call()


def test_the_text_tab_serves_a_users_checkpoint(tmp_path, capsys, monkeypatch):
    """`multispec demo --target PATH --draft PATH`: the user's model and draft model become the Text tab's default
    pair; its rows are named by the drafter they use and equal plain decoding, with drafts accepted."""
    import gradio as gr

    from multispec.cli import main
    from multispec.testing import make_perturbed_copy, make_target, save_checkpoint

    target = make_target("llama", seed=3)
    save_checkpoint(tmp_path / "target", target)
    save_checkpoint(tmp_path / "draft", make_perturbed_copy(target, noise=0.02))
    launched = {}
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: launched.update(kw))
    try:
        assert main(["demo", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft")]) == 0
        name = text_tab.PAIRS[0]
        assert name == "your checkpoint (target)" and launched
        table, completion, _, _ = text_tab.run(name, "w10 w11 w12 w10 w11", max_new_tokens=16, chain_k=3)
        assert "| draft model chain k=3 |" in table and "| draft model tree 4/4/15 |" in table
        assert table.count("| yes |") == 5 and completion
        rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| draft model chain")]
        assert float(rows[0][3]) > 1.5  # accepted length: the draft model's drafts are accepted
    finally:
        text_tab.PAIRS.remove("your checkpoint (target)")
    for args, message in [(["--target", str(tmp_path)], "--target: no config.json"),
                          (["--draft", "ngram"], "--draft: drafts the model of --target")]:
        assert main(["demo", *args]) == 2
        assert message in capsys.readouterr().err
