"""Model classes the generic adapter cannot drive are refused by name, before any forward: the check reads
the cache layers `transformers` would build for the config (not the `_is_stateful` flag, which LFM2 lacks)."""

import pytest
import torch
import transformers

from multispec import ModelDrafter, speculative_generate
from multispec.targets.hf import cache_layer_types, check_causal_lm, keeps_state
from multispec.testing import make_target

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2)


def _config(name: str):
    """Tiny configs of the hybrid and recurrent classes, with at least one non-attention layer each."""
    t = transformers
    if name == "Lfm2":
        return t.Lfm2Config(**SMALL, full_attn_idxs=[1])
    if name == "MiniMax":  # lightning (linear) attention layers
        return t.MiniMaxConfig(**SMALL, layer_types=["linear_attention", "full_attention", "linear_attention"],
                               num_local_experts=2, num_experts_per_tok=1, head_dim=8, pad_token_id=0,
                               eos_token_id=2)
    if name == "OlmoHybrid":  # gated delta-rule layers of another layout
        return t.OlmoHybridConfig(**SMALL, pad_token_id=0, eos_token_id=2)
    raise KeyError(name)


# (GraniteMoeHybrid, NemotronH, FalconMamba, Jamba, FalconH1, Lfm2, Zamba2 and Qwen3Next are served by
# multispec.ssm: tests/ssm)
CLASSES = ["MiniMax", "OlmoHybrid"]


@pytest.mark.parametrize("name", CLASSES)
def test_hybrid_and_recurrent_classes_are_refused_before_any_forward(name):
    config = _config(name)
    model = getattr(transformers, f"{name}ForCausalLM")(config).eval()
    assert set(cache_layer_types(config)) - {"full_attention", "sliding_attention", "dummy"}
    model.forward = lambda *a, **k: pytest.fail("a forward ran before the refusal")
    ids = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(TypeError, match=rf"target: {name}ForCausalLM keeps .*no registered adapter drives"):
        speculative_generate(model, "ngram", ids, max_new_tokens=4)
    llama = make_target("llama")  # and as a draft model for an attention target
    with pytest.raises(TypeError, match=rf"{name}ForCausalLM keeps"):
        speculative_generate(llama, ModelDrafter(model), ids, max_new_tokens=4)


def test_lfm2_keeps_state_although_it_does_not_flag_itself_stateful():
    """The case the flag missed: LFM2 keeps conv states without `_is_stateful`; it used to crash inside
    transformers' cache at batch 2 and be silently wrong at batch 1. Its conv layers mark it stateful (so
    `multispec.ssm`'s adapter and draft engine take it, tests/ssm); an LFM2 of attention layers only keeps
    a plain KV cache and is not."""
    model = transformers.Lfm2ForCausalLM(_config("Lfm2")).eval()
    assert not getattr(model, "_is_stateful", False)
    assert cache_layer_types(model.config) == ["conv", "full_attention", "conv"]
    assert keeps_state(model)
    with pytest.raises(TypeError, match="Lfm2ForCausalLM keeps cache layers that are not attention"):
        check_causal_lm(model, "target")  # the generic adapter alone still refuses it
    all_attention = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**SMALL)).eval()
    assert set(cache_layer_types(all_attention.config)) == {"full_attention"} and not keeps_state(all_attention)


def test_attention_classes_with_windows_pass_the_check():
    for kind in ("llama", "gemma3", "mistral"):
        assert set(cache_layer_types(make_target(kind).config)) <= {"full_attention", "sliding_attention"}
