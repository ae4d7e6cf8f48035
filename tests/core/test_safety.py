"""Defaults and safety nets of the loop: unusable logits raise naming the model, randomness is drawn on the
generator's device, the pad id is `generate`'s, acceptance counts only drafts that could be emitted, and
the same inputs give the same tokens in every process."""

import json
import os
import subprocess
import sys

import pytest
import torch

from multispec import DynamicTree, SamplingConfig, StoppingConfig, speculative_generate
from multispec.sampling import check_logits_finite, exponential, uniform
from multispec.testing import make_perturbed_copy, make_target, ragged_prompts


def _poisoned(model, value):
    """`model` whose LM head returns `value` at one vocabulary entry of every position."""
    bad = make_perturbed_copy(model, noise=0.0)
    with torch.no_grad():
        bad.get_output_embeddings().bias = torch.nn.Parameter(torch.zeros(bad.config.vocab_size))
        bad.get_output_embeddings().bias[7] = value
    return bad


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
def test_non_finite_target_logits_raise_naming_the_target(value, do_sample):
    target = make_target("llama", seed=1)
    ids, mask = ragged_prompts(2, seed=1)
    with pytest.raises(ValueError, match=r"target \(LlamaForCausalLM\): the model returned unusable logits"):
        speculative_generate(_poisoned(target, value), make_perturbed_copy(target), ids, attention_mask=mask,
                             max_new_tokens=4,
                             tree=3, sampling=SamplingConfig(do_sample=do_sample))


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
def test_non_finite_draft_logits_raise_naming_the_draft(do_sample):
    target = make_target("llama", seed=1)
    ids, mask = ragged_prompts(2, seed=1)
    with pytest.raises(ValueError, match=r"draft_model \(LlamaForCausalLM\): the model returned unusable logits"):
        speculative_generate(target, _poisoned(target, float("nan")), ids, attention_mask=mask, max_new_tokens=4,
                             tree=DynamicTree(depth=2, topk=2, total=4), sampling=SamplingConfig(do_sample=do_sample))


def test_finite_check_allows_masked_entries_but_not_dead_rows():
    logits = torch.randn(2, 3, 10)
    logits[0, 1, :4] = float("-inf")  # a logits processor may mask tokens
    check_logits_finite(logits, "target")
    logits[1, 2] = float("-inf")  # but a row with no possible token is an error
    with pytest.raises(ValueError, match="1 rows that are -inf everywhere"):
        check_logits_finite(logits, "target")


def test_randomness_is_drawn_on_the_generator_device(monkeypatch):
    """A CPU generator driving tensors elsewhere (a CUDA model): the draws must happen on the generator's
    device and be moved. Spied on the CPU, where no second device exists: every draw names the
    generator's device, whatever device the result is asked for."""
    seen = []
    real_rand, real_empty = torch.rand, torch.empty

    def rand(*shape, generator=None, device=None, **kw):
        seen.append(("rand", generator is not None, str(device)))
        return real_rand(*shape, generator=generator, device=device, **kw)

    def empty(*shape, device=None, **kw):
        seen.append(("empty", True, str(device)))
        return real_empty(*shape, device=device, **kw)

    monkeypatch.setattr(torch, "rand", rand)
    monkeypatch.setattr(torch, "empty", empty)
    g = torch.Generator()
    assert uniform((3,), g, "meta").device.type == "meta"
    assert exponential((2, 2), g, "meta").device.type == "meta"
    assert seen == [("rand", True, "cpu"), ("empty", True, "cpu")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_generator_drives_a_cuda_model():
    target = make_target("llama", seed=1).cuda()
    ids, mask = ragged_prompts(2, seed=1)
    runs = [speculative_generate(target, make_perturbed_copy(target), ids.cuda(), attention_mask=mask.cuda(),
                                 max_new_tokens=8,
                                 tree=DynamicTree(depth=2, topk=2, total=4), generator=torch.Generator().manual_seed(3),
                                 sampling=SamplingConfig(do_sample=True)) for _ in range(2)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_default_pad_is_the_first_eos_as_generate_picks_it():
    target = make_target("llama", seed=1)
    target.generation_config.pad_token_id = None
    ids = torch.tensor([[5, 17, 42]])
    eos = [19, 4]  # not sorted: generate pads with eos[0], not min(eos)
    for e in (eos, torch.tensor(eos)):
        out = speculative_generate(target, make_perturbed_copy(target), ids, max_new_tokens=8,
                                   stopping=StoppingConfig(eos_token_id=e))
        want = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                               eos_token_id=e)
        if out.num_new_tokens[0] < 8:  # padded: with generate's pad id
            assert (out.sequences[0, 3 + out.num_new_tokens[0]:] == 19).all()
        assert torch.equal(out.sequences, want[:, : out.sequences.shape[1]])


def test_acceptance_counts_only_drafts_that_could_be_emitted():
    """The target drafting for itself accepts everything it drafts; cut by max_new_tokens or an EOS, the
    drafts past the cut could never have been emitted and must not count as drafted (or accepted)."""
    target = make_target("llama", seed=5)
    ids = torch.tensor([[5, 17, 42]])
    out = speculative_generate(target, target, ids, max_new_tokens=6, tree=4, stopping=StoppingConfig.never())
    # steps: 4 drafted + bonus (5 tokens), then 1 token of room: 1 countable draft of the 4
    assert [s.drafted for s in out.stats.steps] == [4, 1] and [s.accepted for s in out.stats.steps] == [4, 1]
    assert out.stats.acceptance_rate == 1.0
    free = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, 3:]
    j = next(i for i in range(1, 5) if int(free[i]) not in free[:i].tolist())  # a token new at position j
    eos = int(free[j])  # ends the row at its (j + 1)-th token: deeper drafts could not be emitted
    out = speculative_generate(target, target, ids, max_new_tokens=8, tree=4,
                               stopping=StoppingConfig(eos_token_id=eos, pad_token_id=0))
    assert out.num_new_tokens == [j + 1]
    assert out.stats.steps[0].drafted == min(4, j + 1) == out.stats.steps[0].accepted
    assert out.stats.acceptance_rate == 1.0


SCRIPT = """
import json, sys, torch
from multispec import zoo, speculative_generate, DynamicTree, SamplingConfig, StoppingConfig
from multispec.testing import source_prompts
pair = zoo.load("stdlib-bytes")
ids, mask = source_prompts((200, 120))
out = speculative_generate(pair.target, pair.drafter, ids, attention_mask=mask, max_new_tokens=24,
                           sampling=SamplingConfig(do_sample=True, temperature=0.8),
                           tree=DynamicTree(depth=3, topk=3, total=8), generator=torch.Generator().manual_seed(11),
                           stopping=StoppingConfig.never())
print(json.dumps(out.sequences[:, -24:].tolist()))
"""


@pytest.mark.slow
def test_two_processes_with_the_same_seed_print_the_same_tokens():
    env = dict(os.environ, MULTISPEC_FAST_HEAD="0")
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True)
            for _ in range(2)]
    tokens = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    assert tokens[0] == tokens[1]
    assert len(set(map(tuple, tokens[0]))) == 2  # two different rows, really sampled
