"""Int8 checkpoint storage: every stored weight is within half a row scale of the original, the reloaded model is
the dequantized one (same class and config), and the file is about half of fp16's."""

import pytest
import torch
from transformers import LlamaForCausalLM

from multispec.testing import make_target
from multispec.zoo.int8 import FILE, dequantize, load_int8, quantize, save_int8


def test_quantize_is_within_half_a_scale_and_keeps_extremes():
    w = torch.randn(7, 33) * torch.logspace(-3, 1, 7)[:, None]  # rows of very different magnitudes
    q, scale = quantize(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (7,)
    err = (dequantize(q, scale) - w).abs()
    assert bool((err <= scale.float()[:, None] * 0.5 + 1e-6 + w.abs() * 1e-3).all())
    assert int(q.abs().max(dim=1).values.min()) == 127  # each row's largest value uses the full range
    with pytest.raises(ValueError, match="weight"):
        quantize(torch.ones(3))


def test_saved_model_reloads_as_its_dequantized_self(tmp_path):
    model = make_target("llama", seed=3, vocab=256, layers=2)
    save_int8(model, tmp_path)
    loaded = load_int8(LlamaForCausalLM, tmp_path)
    assert type(loaded) is LlamaForCausalLM and loaded.config.num_hidden_layers == 2
    for name, value in model.state_dict().items():
        expected = dequantize(*quantize(value)) if value.dim() == 2 else value.half().float()
        assert torch.equal(loaded.state_dict()[name], expected), name
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        a, b = model(ids).logits, loaded(ids).logits
    assert (a - b).abs().max() < 0.05 * a.abs().max()  # close, not equal: the shipped model is the int8 one
    params = sum(p.numel() for p in model.parameters())
    assert (tmp_path / FILE).stat().st_size < 0.6 * 2 * params  # about half of fp16
    with pytest.raises(FileNotFoundError, match=FILE):
        load_int8(LlamaForCausalLM, tmp_path / "nothing")


def test_eagle_head_stored_in_int8_reloads_dequantized(tmp_path):
    """`EagleHead.save(int8=True)`: half the bytes, `load` gives the dequantized head (its vocabulary map exact)."""
    from multispec.drafters.eagle import EagleConfig, EagleHead

    torch.manual_seed(0)
    head = EagleHead(EagleConfig(hidden_size=96, draft_vocab_size=16, target_vocab_size=64, intermediate_size=192,
                                 num_attention_heads=4, num_key_value_heads=2), torch.randperm(64)[:16])
    head.save(tmp_path / "fp16")
    head.save(tmp_path / "int8", int8=True)
    loaded = EagleHead.load(tmp_path / "int8")
    assert torch.equal(loaded.d2t, head.d2t)
    for name, value in head.state_dict().items():
        if value.is_floating_point():
            expected = dequantize(*quantize(value)) if value.dim() == 2 else value.half().float()
            assert torch.equal(loaded.state_dict()[name], expected), name
    size = lambda d: (tmp_path / d / "eagle.safetensors").stat().st_size  # noqa: E731
    assert size("int8") < 0.6 * size("fp16")
