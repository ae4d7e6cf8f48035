"""Bad input fails early with a message naming the argument."""

import pytest
import torch

from multispec import SamplingConfig, speculative_generate
from multispec.testing import make_target


@pytest.fixture(scope="module")
def target():
    return make_target("llama")


def test_vocabulary_mismatch(target):
    other = make_target("llama", vocab=64)
    with pytest.raises(ValueError, match="drafter: vocabulary size 64"):
        speculative_generate(target, other, torch.tensor([[3, 4]]), max_new_tokens=4)


def test_negative_max_new_tokens(target):
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, "ngram", torch.tensor([[3, 4]]), max_new_tokens=-1)
    with pytest.raises(TypeError, match="max_new_tokens"):
        speculative_generate(target, "ngram", torch.tensor([[3, 4]]), max_new_tokens=2.5)


def test_shapes(target):
    with pytest.raises(ValueError, match="attention_mask"):
        speculative_generate(target, "ngram", torch.tensor([[3, 4]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="attention_mask: only left padding"):
        speculative_generate(target, "ngram", torch.tensor([[3, 4]]), attention_mask=torch.tensor([[1, 0]]))
    with pytest.raises(TypeError, match="input_ids"):
        speculative_generate(target, "ngram", torch.tensor([[3.0, 4.0]]))
    with pytest.raises(ValueError, match="input_ids: token ids"):
        speculative_generate(target, "ngram", torch.tensor([[3, 999]]))


def test_unsupported_models(target):
    with pytest.raises(TypeError, match="target"):
        speculative_generate(torch.nn.Linear(2, 2), "ngram", torch.tensor([[1]]))
    with pytest.raises(TypeError, match="drafter"):
        speculative_generate(target, 3.5, torch.tensor([[1]]))
    with pytest.raises(ValueError, match="drafter: unknown"):
        speculative_generate(target, "medusa", torch.tensor([[1]]))
    from transformers import MiniMaxConfig, MiniMaxForCausalLM
    minimax = MiniMaxForCausalLM(MiniMaxConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention"], num_local_experts=2,
        num_experts_per_tok=1, pad_token_id=0, eos_token_id=2))
    with pytest.raises(TypeError, match="multispec.ssm"):  # stateful, and no SSM adapter for it
        speculative_generate(minimax, "ngram", torch.tensor([[1]]))


def test_bad_sampling_arguments(target):
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, "ngram", torch.tensor([[1]]),
                             sampling=SamplingConfig(do_sample=True, temperature=0.0))
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(do_sample=True, top_k=0)
    with pytest.raises(ValueError, match="rule"):
        speculative_generate(target, "ngram", torch.tensor([[1]]), rule="greedy",
                             sampling=SamplingConfig(do_sample=True))
    with pytest.raises(ValueError, match="rule: unknown"):
        speculative_generate(target, "ngram", torch.tensor([[1]]), rule="lenient")


def test_tree_arguments(target):
    with pytest.raises(ValueError, match="tree: the one named shape is 'auto'"):
        speculative_generate(target, "ngram", torch.tensor([[1]]), tree="big")
    from multispec import StaticTree
    with pytest.raises(TypeError, match="n-gram drafter proposes chains only"):
        speculative_generate(target, "ngram", torch.tensor([[1]]), tree=StaticTree.full([2]))


def test_length_beyond_position_embeddings(target):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        speculative_generate(target, "ngram", torch.tensor([[1, 2]]), max_new_tokens=600)


def test_a_bad_command_line_prints_the_error_first_and_a_hint_not_the_usage(capsys):
    """argparse's error, first and alone with where the options are listed (it printed 12-23 lines of usage before
    the one that mattered)."""
    from multispec.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["generate", "--pair", "stdlib-bytes", "--prompt", "x", "--max-new-tokens", "-3"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("multispec generate: error: argument --max-new-tokens")
    assert err[1:] == ["(`multispec generate --help` lists every option)"]


def test_ctrl_c_ends_the_command_quietly(capsys, monkeypatch):
    """Ctrl-C: exit status 130 and one line, no traceback (a bench prints its finished rounds first:
    tests/bench/test_recorder.py; training says where it can continue: tests/core/test_train_draft.py)."""
    from multispec import cli, cli_commands

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_commands, "_zoo_list", interrupted)
    assert cli.main(["zoo", "list"]) == 130
    assert capsys.readouterr().err.strip() == "multispec: interrupted"
