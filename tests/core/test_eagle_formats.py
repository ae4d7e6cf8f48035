"""EAGLE heads in the layouts they are published in, from fixtures this project writes itself by the layouts'
documented names and shapes (vLLM's and SGLang's EAGLE-3 loaders, the EAGLE-1/2 reference code): each loads,
drafts losslessly, and proposes the token an independent plain-PyTorch reading of the same tensors computes
(so a misread name, a swapped half or an offset read as an id fails here); the heads trained here are written
in the EAGLE-3 layout and read back unchanged."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from multispec import SamplingConfig, StoppingConfig, speculative_generate
from multispec.drafters.eagle import EagleDrafter
from multispec.drafters.eagle3 import Eagle3Drafter, Eagle3Head
from multispec.drafters.formats import layout, load_eagle
from multispec.prompt import Prompt
from multispec.targets.base import FeatureRequest
from multispec.testing import make_target
from multispec.tree import Chain

H, V, VD, I, NH, NKV, HD = 64, 128, 96, 96, 4, 2, 16
AUX = [1, 3, 4]  # residual streams entering layers 1, 3 and 4 of a 6-layer target (vLLM's numbering)


@pytest.fixture(scope="module")
def target():
    return make_target("llama", seed=11, layers=6)


def _rand(*shape, scale=0.08, seed=[0]):
    seed[0] += 1
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed[0])) * scale


def _eagle3_tensors(prefix="midlayer."):
    ids = torch.sort(torch.randperm(V, generator=torch.Generator().manual_seed(5))[:VD]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    layer = {"input_layernorm.weight": 1 + _rand(H), "hidden_norm.weight": 1 + _rand(H),
             "post_attention_layernorm.weight": 1 + _rand(H),
             "self_attn.q_proj.weight": _rand(NH * HD, 2 * H), "self_attn.k_proj.weight": _rand(NKV * HD, 2 * H),
             "self_attn.v_proj.weight": _rand(NKV * HD, 2 * H), "self_attn.o_proj.weight": _rand(H, NH * HD),
             "mlp.gate_proj.weight": _rand(I, H), "mlp.up_proj.weight": _rand(I, H), "mlp.down_proj.weight": _rand(H, I)}
    tensors = {prefix + k: v for k, v in layer.items()}
    tensors |= {"fc.weight": _rand(H, 3 * H), "norm.weight": 1 + _rand(H), "lm_head.weight": _rand(VD, H, scale=0.5),
                "d2t": ids - torch.arange(VD), "t2d": t2d}  # d2t on disk: offsets
    return tensors, ids


def _eagle3_config(nested=False):
    layer = dict(hidden_size=H, intermediate_size=I, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
                 rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512, num_hidden_layers=1,
                 vocab_size=V, model_type="llama")
    keys = dict(draft_vocab_size=VD, target_hidden_size=H, eagle_aux_hidden_state_layer_ids=AUX)
    if nested:  # the speculators format: the layer's config nested, the algorithm named
        return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                "transformer_layer_config": layer, **keys}
    return {"architectures": ["LlamaForCausalLMEagle3"], **layer, **keys}


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos):
    inv = 1.0 / 10000.0 ** (torch.arange(0, HD, 2).float() / HD)
    f = pos[:, None].float() * inv
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    return x * cos + torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], -1) * sin


def _attend(x, t, p):
    """Causal attention of one sequence `x` [S, width] with the weights `p` (plain PyTorch, by the names)."""
    s = x.shape[0]
    pos = torch.arange(s)
    q = _rope((x @ t[p + "self_attn.q_proj.weight"].T).view(s, NH, HD).transpose(0, 1), pos)
    k = _rope((x @ t[p + "self_attn.k_proj.weight"].T).view(s, NKV, HD).transpose(0, 1), pos)
    v = (x @ t[p + "self_attn.v_proj.weight"].T).view(s, NKV, HD).transpose(0, 1)
    k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
    att = (q @ k.transpose(1, 2) / HD ** 0.5).masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    return (att.softmax(-1) @ v).transpose(0, 1).reshape(s, -1) @ t[p + "self_attn.o_proj.weight"].T


def _mlp(x, t, p):
    return (F.silu(x @ t[p + "mlp.gate_proj.weight"].T) * (x @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T


def _first_draft(drafter, target, ids):
    """The drafter's first greedy draft token after the prompt `ids` [1, L]."""
    request = drafter.feature_request
    adapter = __import__("multispec").HFCausalLM(target)
    pre = adapter.prefill(Prompt.build(ids), request)
    drafter.start(Prompt.build(ids), pre.features)
    return int(drafter.propose(pre.roots, Chain(1), SamplingConfig()).tokens[0, 0])


@pytest.mark.parametrize("variant", ["vllm", "speculators"])
def test_an_eagle3_checkpoint_loads_drafts_losslessly_and_reads_as_its_layout_says(tmp_path, target, variant):
    tensors, ids = _eagle3_tensors("midlayer." if variant == "vllm" else "layers.0.")
    (tmp_path / "config.json").write_text(json.dumps(_eagle3_config(nested=variant == "speculators")))
    if variant == "vllm":
        save_file(tensors, str(tmp_path / "model.safetensors"))
    else:
        torch.save(tensors, tmp_path / "pytorch_model.bin")
    assert layout(tmp_path) == "eagle3"
    drafter = load_eagle(tmp_path, target)
    assert isinstance(drafter, Eagle3Drafter) and drafter.feature_request == FeatureRequest(layers=tuple(AUX))
    prompt = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 8, 30]])
    # independent reading: entry j pairs token x_{j+1} with g_j = fc(cat of the three layers at j)
    with torch.no_grad():
        states = target(prompt, output_hidden_states=True).hidden_states  # [i]: the stream entering layer i
        g = torch.cat([states[i][0] for i in AUX], -1)[:-1] @ tensors["fc.weight"].T
        emb = target.get_input_embeddings()(prompt[0, 1:])
        p = "midlayer." if variant == "vllm" else "layers.0."
        x = torch.cat([_rms(emb, tensors[p + "input_layernorm.weight"]), _rms(g, tensors[p + "hidden_norm.weight"])], -1)
        h = g + _attend(x, tensors, p)
        h = h + _mlp(_rms(h, tensors[p + "post_attention_layernorm.weight"]), tensors, p)
        logits = _rms(h[-1], tensors["norm.weight"]) @ tensors["lm_head.weight"].T
    assert _first_draft(drafter, target, prompt) == int(ids[logits.argmax()])
    out = speculative_generate(target, drafter, prompt, max_new_tokens=16, tree=3, stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, target.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None,
                                                      pad_token_id=0))


def test_a_reference_eagle12_checkpoint_loads_and_reads_as_the_reference_code_does(tmp_path, target):
    layer = {"self_attn.q_proj.weight": _rand(NH * HD, H), "self_attn.k_proj.weight": _rand(NKV * HD, H),
             "self_attn.v_proj.weight": _rand(NKV * HD, H), "self_attn.o_proj.weight": _rand(H, NH * HD),
             "mlp.gate_proj.weight": _rand(I, H), "mlp.up_proj.weight": _rand(I, H), "mlp.down_proj.weight": _rand(H, I),
             "post_attention_layernorm.weight": 1 + _rand(H)}
    tensors = {f"layers.0.{k}": v for k, v in layer.items()} | {"fc.weight": _rand(H, 2 * H), "fc.bias": _rand(H),
                                                                 "embed_tokens.weight": _rand(V, H)}
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLM"], hidden_size=H, intermediate_size=I, num_attention_heads=NH,
        num_key_value_heads=NKV, num_hidden_layers=1, vocab_size=V, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=512, bias=True)))
    assert layout(tmp_path) == "eagle-reference"
    drafter = load_eagle(tmp_path, target)
    assert isinstance(drafter, EagleDrafter) and drafter.head.config.reference_layout
    prompt = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 8, 30]])
    with torch.no_grad():  # the reference: fc(cat(emb, f)), no input norm, no final norm, the target's LM head
        f = target.model(prompt).last_hidden_state[0, :-1]
        emb = target.get_input_embeddings()(prompt[0, 1:])
        x = torch.cat([emb, f], -1) @ tensors["fc.weight"].T + tensors["fc.bias"]
        t = {k.removeprefix("layers.0."): v for k, v in tensors.items()}
        h = x + _attend(x, t, "")
        h = h + _mlp(_rms(h, t["post_attention_layernorm.weight"]), t, "")
        logits = target.get_output_embeddings()(h[-1])
    assert _first_draft(drafter, target, prompt) == int(logits.argmax())
    out = speculative_generate(target, drafter, prompt, max_new_tokens=16, tree=3, stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, target.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None,
                                                      pad_token_id=0))


def test_a_head_written_here_is_in_the_eagle3_layout_and_reads_back_unchanged(tmp_path, target):
    (tmp_path / "in").mkdir()
    tensors, _ = _eagle3_tensors()
    (tmp_path / "in" / "config.json").write_text(json.dumps(_eagle3_config()))
    save_file(tensors, str(tmp_path / "in" / "model.safetensors"))
    head = Eagle3Head.load(tmp_path / "in", target=target)
    head.save(tmp_path / "out", dtype=torch.float32)
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(written) == set(tensors)  # the same names: midlayer.*, fc, norm, lm_head, d2t (offsets), t2d
    assert all(torch.equal(written[k], tensors[k]) for k in tensors)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == VD
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX and config["target_hidden_size"] == H
    again = Eagle3Head.load(tmp_path / "out", target=target)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def test_layouts_that_are_not_heads_are_refused_by_name(tmp_path, target):
    with pytest.raises(FileNotFoundError, match="neither eagle_config.json"):
        layout(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_eagle3_config()))
    save_file({"fc.weight": torch.zeros(H, 3 * H)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="not an EAGLE-3 head this loader knows: missing"):
        load_eagle(tmp_path, target)
    wrong = _eagle3_config() | {"hidden_size": 32}
    (tmp_path / "config.json").write_text(json.dumps(wrong))
    tensors, _ = _eagle3_tensors()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises((ValueError, RuntimeError)):
        load_eagle(tmp_path, target)
