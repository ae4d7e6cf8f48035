"""The zoo's fully local pair loads offline and speculates losslessly with real acceptance."""

import subprocess
import sys

import pytest
import torch

from multispec import DynamicTree, StoppingConfig, speculative_generate, zoo
from multispec.cli import main
from multispec.zoo.data import HELD_OUT, TRAINED_BUDGETS, corpus_text, read_source, stdlib_files


@pytest.fixture(scope="module")
def pair():
    return zoo.load("stdlib-bytes")


def test_registry_and_cli(capsys):
    assert {"stdlib-bytes", "stdlib-bytes-large", "gemma3-270m-eagle"} <= set(zoo.names())
    with pytest.raises(ValueError, match="name: unknown zoo entry"):
        zoo.path("gpt-17")
    assert main(["zoo", "list"]) == 0
    listed = capsys.readouterr().out
    assert "stdlib-bytes" in listed and "shipped" in listed
    assert main(["zoo", "path", "stdlib-bytes"]) == 0
    assert capsys.readouterr().out.strip().endswith("stdlib-bytes")
    with pytest.raises(SystemExit) as refused:  # argparse: NAME is required
        main(["zoo", "train"])
    assert refused.value.code == 2 and "name" in capsys.readouterr().err


def test_python_dash_m_runs_the_command():
    """`python -m multispec` is the `multispec` command (what `accelerate launch -m multispec` runs)."""
    done = subprocess.run([sys.executable, "-m", "multispec", "zoo", "path", "stdlib-bytes"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("stdlib-bytes")


def test_held_out_files_are_not_trained_on():
    train = set(stdlib_files("train"))
    held = stdlib_files("heldout")
    assert len(held) >= 5 and not train & set(held)
    assert all(str(p).endswith(HELD_OUT) for p in held)


def test_validation_files_are_in_no_recipe_text():
    """Validation files: train-split files whose text the pairs' training reads under none of the budgets,
    checked against the corpus text itself."""
    validation = stdlib_files("validation")
    assert len(validation) >= 20 and not set(validation) & set(stdlib_files("heldout"))
    assert set(validation) < set(stdlib_files("train"))
    texts = [corpus_text("train", max_chars=chars, seed=seed) for seed, chars in TRAINED_BUDGETS.items()]
    long_ones = [p for p in validation if len(read_source(p)) > 4000][:8]
    assert long_ones
    for p in long_ones:
        probe = read_source(p)[1000:1400]  # an inner slice: a licence header may repeat across files
        assert not any(probe in text for text in texts), p


@pytest.mark.parametrize("tree", [4, DynamicTree(depth=4, topk=4, total=16)], ids=["chain", "dynamic"])
def test_local_pair_is_lossless_and_accepts(pair, tree):
    prompt = read_source(stdlib_files("heldout")[0])[:400]
    ids = pair.tokenizer(prompt, return_tensors="pt")["input_ids"]
    expected = pair.target.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=0)
    out = speculative_generate(pair.target, pair.drafter, ids, max_new_tokens=64, tree=tree,
                               stopping=StoppingConfig(pad_token_id=0))
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length > 1.8  # a trained pair: most steps accept drafts
    assert isinstance(pair.tokenizer.decode(out.sequences[0, ids.shape[1]:]), str)


@pytest.mark.parametrize("tree", [4, DynamicTree(depth=4, topk=4, total=16)], ids=["chain", "dynamic"])
def test_main_job_pair_is_lossless_and_accepts(tree):
    """`stdlib-bytes-large` (the README's first command): EAGLE output equals `generate`, most steps accept
    drafts, and its draft model (the `stdlib-bytes` target) drafts for it losslessly too."""
    pair = zoo.load("stdlib-bytes-large")
    draft_layers = pair.draft_model.config.num_hidden_layers
    assert draft_layers < pair.target.config.num_hidden_layers
    assert pair.chain_k and pair.tree is not None  # chosen on the validation split (draft_shape.json)
    assert pair.recycling_tree is not None  # Token Recycling's tree, chosen there too
    prompt = read_source(stdlib_files("heldout")[0])[:400]
    ids = pair.tokenizer(prompt, return_tensors="pt")["input_ids"]
    expected = pair.target.generate(ids, max_new_tokens=48, do_sample=False, pad_token_id=0)
    for drafter in (pair.drafter, pair.draft_model):
        out = speculative_generate(pair.target, drafter, ids, max_new_tokens=48, tree=tree,
                                   stopping=StoppingConfig(pad_token_id=0))
        assert torch.equal(out.sequences, expected)
        assert out.stats.mean_accepted_length > 1.8


@pytest.mark.parametrize("name", ["stdlib-mamba2", "stdlib-bamba"])
def test_ssm_pairs_are_lossless_and_accept(name):
    """The SSM zoo pairs (byte-level Mamba-2 and Bamba targets, drafted by the byte Llama): STree output
    equals the target's own greedy generate, and the trained pair agrees often."""
    pair = zoo.load(name)
    prompt = read_source(stdlib_files("heldout")[1])[:300]
    ids = pair.tokenizer(prompt, return_tensors="pt")["input_ids"]
    expected = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                                    pad_token_id=0)
    out = speculative_generate(pair.target, pair.drafter, ids, max_new_tokens=40,
                               tree=DynamicTree(depth=4, topk=3, total=10), stopping=StoppingConfig(pad_token_id=0))
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length > 1.5


def test_untrained_entry_names_the_train_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="multispec zoo train stdlib-mamba2"):
        zoo.load("stdlib-mamba2", weights=tmp_path)
