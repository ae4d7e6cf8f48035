"""The lean forward as a *target* (with the final hidden states EAGLE reads) and as the EAGLE head's
engine: the same numbers as `transformers`, picked automatically for Llama-family models; adaptive chains."""

import pytest
import torch

from multispec import Chain, SamplingConfig, StoppingConfig, speculative_generate, zoo
from multispec.drafters.eagle import EagleDrafter
from multispec.prompt import Prompt
from multispec.targets import FeatureRequest, HFCausalLM, as_target
from multispec.targets.lean import LeanCausalLM
from multispec.targets.lean_gemma import LeanGemma3CausalLM
from multispec.testing import make_perturbed_copy, make_target, ragged_prompts, source_prompts


def test_the_core_picks_the_lean_engine_where_it_applies():
    for kind in ("llama", "qwen2", "mistral"):
        assert type(as_target(make_target(kind))) is LeanCausalLM, kind
    assert type(as_target(make_target("gemma3"))) is LeanGemma3CausalLM
    from transformers import Gemma2Config, Gemma2ForCausalLM  # softcapping: the model's own forward

    gemma2 = Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    assert type(as_target(gemma2)) is HFCausalLM


LEAN = {"llama": LeanCausalLM, "qwen2": LeanCausalLM, "mistral": LeanCausalLM, "gemma3": LeanGemma3CausalLM}


# mistral: a 6-token window in every layer; gemma3: sliding (window 6) and full layers, q/k norms, two rotaries
@pytest.mark.parametrize("kind", list(LEAN))
def test_lean_target_logits_and_features_equal_transformers(kind):
    model = make_target(kind, seed=3)
    ids, mask = ragged_prompts(3, seed=2, lengths=(12, 5, 9))
    a, b = HFCausalLM(model), LEAN[kind](model, name="target")
    request = FeatureRequest(hidden=True, layers=(0, 1, a.num_layers))  # embeddings, layer 1 in, last out
    pa, pb = a.prefill(Prompt(ids, mask), request), b.prefill(Prompt(ids, mask), request)
    ra, rb = pa.roots, pb.roots
    assert torch.equal(ra, rb)
    real = mask[:, :-1].bool()
    assert (pa.features.hidden - pb.features.hidden)[real].abs().max() < 1e-5  # real (unpadded) positions
    for i in request.layers:
        assert (pa.features.layers[i] - pb.features.layers[i])[real].abs().max() < 1e-5, i
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        toks = torch.randint(3, 128, (3, 5), generator=g)
        toks[:, 0] = ra
        par = torch.tensor([[-1, 0, 0, 1, 3]] * 3)
        sa, sb = a.score(toks, par, request=request), b.score(toks, par, request=request)
        assert (sa.logits - sb.logits).abs().max() < 1e-4
        assert (sa.features.hidden - sb.features.hidden).abs().max() < 1e-5
        for i in request.layers:
            assert (sa.features.layers[i] - sb.features.layers[i]).abs().max() < 1e-4, i
        path = torch.tensor([[0, 1, 3, 4], [0, 2, -1, -1], [0, -1, -1, -1]])
        a.commit(path)
        b.commit(path)
        ra = toks.gather(1, torch.tensor([[4], [2], [0]]))[:, 0]


def test_windowed_eagle_head_drafts_what_the_full_head_drafts():
    """The zoo head slides over 128 positions: the lean engine prefills and reads only those (exact up to
    rounding: RoPE sees position differences only)."""
    pair = zoo.load("stdlib-bytes")
    ids, mask = source_prompts((600, 300))
    target = HFCausalLM(pair.target)
    prompt = Prompt(ids, mask)
    prefilled = target.prefill(prompt, FeatureRequest(hidden=True))
    roots, feats = prefilled.roots, prefilled.features
    lean = pair.drafter
    assert isinstance(lean.lm, LeanCausalLM) and lean.lm.window == 128
    full = EagleDrafter(lean.head, pair.target)
    full.lm = HFCausalLM(lean.head.decoder, name="eagle_head")
    sampling = SamplingConfig(do_sample=True)
    for drafter in (lean, full):
        drafter.start(prompt, feats)
    a = lean.propose(roots, Chain(4), sampling, torch.Generator().manual_seed(1))
    b = full.propose(roots, Chain(4), sampling, torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens)
    assert (a.draft_probs - b.draft_probs).abs().max() < 1e-4


def test_adaptive_chains_stop_on_the_draft_confidence_and_stay_lossless():
    target = make_target("llama", seed=4)
    ids, mask = ragged_prompts(3, seed=5)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
                           eos_token_id=None)
    fixed = speculative_generate(target, make_perturbed_copy(target), ids, attention_mask=mask, max_new_tokens=24,
                                 tree=8,
                                 stopping=StoppingConfig.never())
    adaptive = speculative_generate(target, make_perturbed_copy(target), ids, attention_mask=mask, max_new_tokens=24,
                                    tree=Chain(8, min_prob=0.5), stopping=StoppingConfig.never())
    assert torch.equal(fixed.sequences, want) and torch.equal(adaptive.sequences, want)
    assert adaptive.stats.drafted < fixed.stats.drafted  # it stopped early where the draft was unsure
    assert adaptive.stats.acceptance_rate > fixed.stats.acceptance_rate
    assert adaptive.stats.mean_accepted_length >= 1.8, adaptive.stats
    with pytest.raises(ValueError, match="min_prob"):
        Chain(4, min_prob=1.5)
