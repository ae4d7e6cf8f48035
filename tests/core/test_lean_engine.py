"""The lean forward engine computes what `transformers` computes (same cache bookkeeping, own forward), its
attention window is the model run on the window, and bad configurations are refused by name."""

import pytest
import torch

from multispec import DynamicTree, StoppingConfig, speculative_generate
from multispec.drafters.model import ModelDrafter
from multispec.targets import FeatureRequest, HFCausalLM
from multispec.targets.lean import LeanCausalLM, lean_unsupported
from multispec.testing import make_perturbed_copy, make_target, ragged_prompts


def _rounds(a, b, batch, seed):
    """Feed both engines the same trees (parents fed earlier and within the call), commit the same paths;
    return the largest logit difference seen."""
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(3):
        toks = torch.randint(3, 128, (batch, 5), generator=g)
        par = torch.tensor([[-1, 0, 0, 1, 3]] * batch)
        worst = max(worst, (a.feed(toks, par).logits - b.feed(toks, par).logits).abs().max().item())
        toks2 = torch.randint(3, 128, (batch, 3), generator=g)
        par2 = torch.tensor([[1, 2, 6]] * batch)  # two earlier parents, one fed in this same call
        valid = torch.ones(batch, 3, dtype=torch.bool)
        valid[-1, 2] = False  # an invalid node in the last row
        diff = a.feed(toks2, par2, valid).logits[valid] - b.feed(toks2, par2, valid).logits[valid]
        worst = max(worst, diff.abs().max().item())
        toks3 = torch.randint(3, 128, (batch, 2), generator=g)
        par3 = torch.tensor([[3, 6]] * batch)  # every parent fed by an earlier call: the one-gather path
        worst = max(worst, (a.feed(toks3, par3).logits - b.feed(toks3, par3).logits).abs().max().item())
        path = torch.tensor([[0, 1, 3, 8], [0, 2, -1, -1], [0, 1, 5, 6]][:batch])
        a.commit(path)
        b.commit(path)
    return worst


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: q/k/v biases
@pytest.mark.parametrize("batch", [1, 3])
def test_lean_logits_equal_transformers(kind, batch):
    model = make_target(kind, seed=1)
    ids, mask = ragged_prompts(batch, seed=7)
    a, b = HFCausalLM(model), LeanCausalLM(model)
    assert torch.equal(a.start(ids, mask).roots, b.start(ids, mask).roots)
    assert _rounds(a, b, batch, seed=batch) < 1e-4
    if batch > 1:  # drop a row, keep going
        keep = torch.tensor([0, 2])
        a.select(keep)
        b.select(keep)
        toks = torch.randint(3, 128, (2, 2))
        par = torch.tensor([[-1, 0]] * 2)
        assert (a.feed(toks, par).logits - b.feed(toks, par).logits).abs().max() < 1e-4


def test_lean_window_is_the_model_on_the_window():
    model = make_target("llama", seed=2)
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    w = 16
    # the first tree after the prompt sees exactly the last `w` committed tokens, positions restarted
    ref, lean = HFCausalLM(model), LeanCausalLM(model, window=w)
    ref.start(ids[:, -w - 1:], torch.ones(1, w + 1, dtype=torch.long))
    lean.start(ids, torch.ones_like(ids))
    toks, par = torch.randint(3, 128, (1, 4)), torch.tensor([[-1, 0, 0, 1]])
    assert (ref.feed(toks, par).logits - lean.feed(toks, par).logits).abs().max() < 1e-4
    # a window longer than the context changes nothing
    full, wide = HFCausalLM(model), LeanCausalLM(model, window=1000)
    full.start(ids, torch.ones_like(ids))
    wide.start(ids, torch.ones_like(ids))
    assert _rounds(full, wide, 1, seed=3) < 1e-4
    # and a short window really differs from full attention (the test can fail)
    short = LeanCausalLM(model, window=4)
    full2 = HFCausalLM(model)
    short.start(ids, torch.ones_like(ids))
    full2.start(ids, torch.ones_like(ids))
    assert (short.feed(toks, par).logits - full2.feed(toks, par).logits).abs().max() > 1e-3


@pytest.mark.parametrize("window", [None, 6])
def test_speculation_with_lean_draft_equals_generate(window):
    target = make_target("llama", seed=4)
    draft = ModelDrafter(make_perturbed_copy(target, noise=0.03), window=window)
    assert draft.engine == "lean"
    ids, mask = ragged_prompts(3, seed=1, lengths=(20, 11, 16))
    for tree in (3, DynamicTree(depth=3, topk=2, total=6)):
        want = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
        out = speculative_generate(target, draft, ids, attention_mask=mask, max_new_tokens=24, tree=tree,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences, want)
        # drafts are accepted (a short window makes the draft worse, not wrong)
        assert out.stats.mean_accepted_length >= (2.0 if window is None else 1.3), out.stats


def test_weights_changed_in_place_are_repacked():
    model = make_target("llama", seed=6)
    ids, mask = ragged_prompts(1, seed=2)
    lean = LeanCausalLM(model)
    lean.start(ids, mask)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(1.5)
        model.model.layers[1].mlp.down_proj.weight.add_(0.01)
    ref = HFCausalLM(model)
    ref.start(ids, mask)
    lean.start(ids, mask)  # a new generation packs again
    toks, par = torch.randint(3, 128, (1, 3)), torch.tensor([[-1, 0, 1]])
    assert (ref.feed(toks, par).logits - lean.feed(toks, par).logits).abs().max() < 1e-4


def test_engine_choice_and_errors():
    gemma = make_target("gemma3")
    assert "model_type" in lean_unsupported(gemma)
    assert ModelDrafter(gemma).engine == "hf"  # auto falls back
    assert ModelDrafter(make_target("llama")).engine == "lean"
    assert ModelDrafter(make_target("llama"), engine="hf").engine == "hf"
    with pytest.raises(TypeError, match="draft_model"):
        ModelDrafter(gemma, engine="lean")
    with pytest.raises(ValueError, match="engine"):
        ModelDrafter(gemma, engine="fast")
    with pytest.raises(ValueError, match="window"):
        ModelDrafter(make_target("llama"), engine="hf", window=8)
    with pytest.raises(ValueError, match="window"):
        LeanCausalLM(make_target("llama"), window=0)
    rope = make_target("llama")
    rope.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert "rope" in lean_unsupported(rope)
    lean = LeanCausalLM(make_target("llama"))
    ids, mask = ragged_prompts(1)
    lean.start(ids, mask)
    out = lean.feed(torch.tensor([[5]]), torch.tensor([[-1]]), request=FeatureRequest(hidden=True, layers=(0, 2)))
    assert out.logits.shape == (1, 1, 128) and out.features.hidden.shape == (1, 1, 64)  # features for EAGLE drafters
    assert sorted(out.features.layers) == [0, 2] and out.features.layers[2].shape == (1, 1, 64)
