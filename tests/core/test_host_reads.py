"""The speculative step reads the device once (`multispec.host`, `multispec.step_read`).

On CUDA each read of a device value on the host waits for the GPU; a CPU test cannot see that wait, so it
counts the calls that would wait (`int(t)`, `bool(t)`, `t.tolist()`, `t.item()`, `nonzero`, a tensor
built from host data onto a device) under a `TorchFunctionMode`, with "cpu" added to the device types whose
checks are deferred, which makes the loop run as it does on CUDA (`as_on_cuda`, tests/conftest.py). The
deferred checks must still raise."""

import pytest
import torch

from multispec import DynamicTree, SamplingConfig, Session, StaticTree, StoppingConfig, speculative_generate, zoo
from multispec.drafters.base import Drafter
from multispec.targets.static_step import capacity_for, static_pair
from multispec.drafters.controlled import ControlledDrafter
from multispec.targets.static_hf import StaticHFCausalLM
from multispec.testing import (CountReads, assert_one_read_per_step, make_decoder, ragged_prompts, source_prompts,
                               step_read_line)
from multispec.tree import DraftTree

_READ = step_read_line()


@pytest.fixture(scope="module")
def byte_pair():
    return zoo.load("stdlib-bytes")


def _generate_counting(target, drafter, ids, mask, n, **kw):
    """Reads while prefilling and while generating, and the steps taken."""
    session = Session(target, drafter, tree=4, rollback=False, stopping=StoppingConfig.never(),
                      **kw)
    with CountReads() as prefill:
        session.append(ids, mask)
    with CountReads() as loop:
        session.generate(n)
    return prefill, loop, len(session.stats.steps)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_static_eagle_chain_reads_the_device_once_per_step(byte_pair, as_on_cuda, sample):
    ids, mask = source_prompts((40,))
    kw = dict(sampling=SamplingConfig(do_sample=True, temperature=0.8),
              generator=torch.Generator().manual_seed(0)) if sample else {}
    target, drafter = static_pair(byte_pair.target, byte_pair.drafter, capacity=capacity_for(40, 48, 8),
                                  node_budget=8)
    _, loop, steps = _generate_counting(target, drafter, ids, mask, 48, **kw)
    assert steps < 48  # drafts were accepted: this is speculative decoding, not plain decoding
    assert_one_read_per_step(loop, steps)


@pytest.mark.parametrize("tree", [StaticTree.full([2, 2]), DynamicTree(depth=3, topk=2, total=6)],
                         ids=["static-tree", "dynamic-tree"])
def test_static_eagle_trees_read_the_device_once_per_step(byte_pair, as_on_cuda, tree, monkeypatch):
    """Trees verified by the Triton kernels (as on CUDA; the interpreter here): one read a step too."""
    monkeypatch.setenv("MULTISPEC_KERNELS", "triton")
    ids, mask = source_prompts((40,))
    target, drafter = static_pair(byte_pair.target, byte_pair.drafter, capacity=capacity_for(40, 32, 8, 16),
                                  node_budget=8)
    # a first generation builds what is built once (the static tree's index tensors on the device)
    speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=4, tree=tree,
                         stopping=StoppingConfig.never())
    session = Session(target, drafter, tree=tree, rollback=False, stopping=StoppingConfig.never())
    session.append(ids, mask)
    with CountReads() as loop:
        session.generate(32)
    steps = len(session.stats.steps)
    assert session.stats.mean_accepted_length > 1.5
    assert loop.where[_READ] == steps and loop.total - steps <= 1, dict(loop.where)


def test_ragged_batch_reads_once_per_step_plus_retirements(byte_pair, as_on_cuda):
    """Rows that finish early leave the batch (a read each time: rare); otherwise one read a step."""
    ids, mask = source_prompts((24, 31))
    target, drafter = static_pair(byte_pair.target, byte_pair.drafter, capacity=capacity_for(31, 40, 8),
                                  node_budget=8)
    _, loop, steps = _generate_counting(target, drafter, ids, mask, 40)
    assert loop.where[_READ] == steps, dict(loop.where)
    # one retirement and the final cut: the session's index, the target's and the drafter's engines
    assert loop.total - steps <= 8, dict(loop.where)




def test_output_is_unchanged_when_checks_are_deferred(byte_pair, as_on_cuda):
    ids, mask = source_prompts((40,))
    expected = byte_pair.target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                                         pad_token_id=0, eos_token_id=None)
    target, drafter = static_pair(byte_pair.target, byte_pair.drafter, capacity=capacity_for(40, 24, 8),
                                  node_budget=8)
    out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=24,
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length > 1.5


def test_deferred_non_finite_logits_still_raise(byte_pair, as_on_cuda):
    """A NaN in the target's logits surfaces at the step's read, with the same message, before any token."""
    ids, mask = source_prompts((20,))
    target, drafter = static_pair(byte_pair.target, byte_pair.drafter, capacity=capacity_for(20, 8, 8),
                                  node_budget=8)
    original = target.score

    def poisoned(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits[..., 3] = float("nan")
        return out

    target.score = poisoned
    with pytest.raises(ValueError, match=r"target .*unusable logits \(\d+ NaN"):
        speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=8,
                             stopping=StoppingConfig.never())


class BackwardsDrafter(Drafter):
    """Proposes a tree whose second node names a later node as its parent."""

    def start(self, prompt, features=None):
        pass

    def propose(self, roots, spec, sampling, generator=None):
        b = roots.shape[0]
        tokens = torch.ones(b, 2, dtype=torch.long, device=roots.device)
        parents = torch.tensor([[-1, 1]] * b, device=roots.device)
        return DraftTree(tokens, parents, torch.ones_like(tokens, dtype=torch.bool))

    def commit(self, draft, verdict, features=None):
        pass

    def select(self, rows):
        pass


def test_deferred_malformed_tree_still_raises(byte_pair, as_on_cuda):
    ids, mask = source_prompts((20,))
    with pytest.raises(ValueError, match="parents: .*(must precede it|fed before it)"):
        speculative_generate(byte_pair.target, BackwardsDrafter(), ids, attention_mask=mask, max_new_tokens=4,
                             stopping=StoppingConfig.never())


def test_counter_sees_a_read():
    """The counter is shown to count: a drafter that reads the device every step is caught."""
    with CountReads() as reads:
        t = torch.arange(4)
        int(t.max())
        t.tolist()
        torch.tensor([1, 2], device="cpu")
    assert reads.total == 3


@pytest.mark.parametrize("name", ["gemma2", "qwen3-moe", "llama-rope-dynamic"])
def test_static_step_reads_the_device_once_per_step(name, as_on_cuda):
    model = make_decoder(name, seed=2)
    ids, mask = ragged_prompts(1, seed=4)
    engine = StaticHFCausalLM(model, capacity=96, node_budget=8)
    drafter = ControlledDrafter(model, acceptance=0.8, horizon=32)
    session = Session(engine, drafter, tree=4, rollback=False, stopping=StoppingConfig.never())
    session.append(ids, mask)
    with CountReads() as loop:
        session.generate(32)
    steps = len(session.stats.steps)
    assert session.stats.mean_accepted_length > 2.0
    assert_one_read_per_step(loop, steps)
