"""EAGLE heads in the layouts they are published in, from fixtures this project writes itself by the layouts'
documented names and shapes (vLLM's and SGLang's EAGLE-3 loaders, the EAGLE-1/2 reference code): each loads,
drafts losslessly, and proposes the token an independent plain-PyTorch reading of the same tensors computes
(so a misread name, a swapped half or an offset read as an id fails here); the heads trained here are written
in the EAGLE-3 layout and read back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

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


def _inv(theta=10000.0):
    return 1.0 / theta ** (torch.arange(0, HD, 2).float() / HD)


def _llama3_inv(theta, factor, low, high, context):
    """Llama 3's frequency scaling, as Meta's reference code describes it: long wavelengths slowed by `factor`,
    short ones kept, the band between blended."""
    inv = _inv(theta)
    wavelen = 2 * torch.pi / inv
    slowed = torch.where(wavelen > context / low, inv / factor, inv)
    smooth = (context / wavelen - low) / (high - low)
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, (1 - smooth) * slowed / factor + smooth * slowed, slowed)


def _rope(x, pos, inv=None):
    inv = _inv() if inv is None else inv
    f = pos[:, None].float() * inv
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    return x * cos + torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], -1) * sin


def _attend(x, t, p, inv=None):
    """Causal attention of one sequence `x` [S, width] with the weights `p` (plain PyTorch, by the names)."""
    s = x.shape[0]
    pos = torch.arange(s)
    q = _rope((x @ t[p + "self_attn.q_proj.weight"].T).view(s, NH, HD).transpose(0, 1), pos, inv)
    k = _rope((x @ t[p + "self_attn.k_proj.weight"].T).view(s, NKV, HD).transpose(0, 1), pos, inv)
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
    # independent reading: entry j pairs token x_{j+1} with g_j = fc(cat of the three layers at j); a speculators
    # file without norm_before_residual means true (as vLLM reads it)
    p = "midlayer." if variant == "vllm" else "layers.0."
    want = _eagle3_reading(target, tensors, p, AUX, prompt, variant == "speculators", _inv())
    torch.testing.assert_close(_head_logits(drafter, target, prompt), want, rtol=0, atol=1e-4)
    logits = want[-1]
    assert _first_draft(drafter, target, prompt) == int(ids[logits.argmax()])
    out = speculative_generate(target, drafter, prompt, max_new_tokens=16, tree=3, stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, target.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None,
                                                      pad_token_id=0))


def _eagle3_reading(target, tensors, p, aux, prompt, norm_before_residual, inv, variant=None, then=None):
    """Draft logits [S-1, Vd] of an EAGLE-3 head's tensors read in plain PyTorch: entry j pairs token x_{j+1} with
    g_j = fc(cat of the fused layers at j); the residual is g, or hidden_norm(g) when `norm_before_residual`.
    `variant` "norm_before_fc" / "fc_norm" / "norm_output": speculators' variants of the same names. `then`: a
    drafted token appended as one more entry whose feature is the last entry's output (normed with norm_output),
    as a chain's second step reads it; its logits come last."""
    with torch.no_grad():
        states = target(prompt, output_hidden_states=True).hidden_states
        parts = [states[i][0][:-1] for i in aux]
        if variant == "fc_norm":
            parts = [_rms(x, tensors[f"fc_norm.{k}.weight"]) for k, x in enumerate(parts)]
        fused = torch.cat(parts, -1)
        if variant == "norm_before_fc":
            fused = _rms(fused, tensors["input_norm.weight"])
        g = fused @ tensors["fc.weight"].T
        tokens = prompt[0, 1:]

        def layer(emb, g):
            normed = _rms(g, tensors[p + "hidden_norm.weight"])
            x = torch.cat([_rms(emb, tensors[p + "input_layernorm.weight"]), normed], -1)
            h = (normed if norm_before_residual else g) + _attend(x, tensors, p, inv)
            return h + _mlp(_rms(h, tensors[p + "post_attention_layernorm.weight"]), tensors, p)

        h = layer(target.get_input_embeddings()(tokens), g)
        out = _rms(h, tensors["norm.weight"])
        if then is not None:
            feature = out[-1:] if variant == "norm_output" else h[-1:]
            tokens = torch.cat([tokens, torch.tensor([then])])
            h = layer(target.get_input_embeddings()(tokens), torch.cat([g, feature]))
            out = _rms(h, tensors["norm.weight"])
        return out @ tensors["lm_head.weight"].T


def _head_logits(drafter, target, prompt):
    """The loaded head's own draft logits on the prompt's entries (the same pairing as `_eagle3_reading`)."""
    with torch.no_grad():
        states = target(prompt, output_hidden_states=True).hidden_states
        head = drafter.head
        g = head.fuse_target({i: states[i][:, :-1] for i in head.eagle.aux_layers})
        emb = drafter.embed(prompt[:, 1:])
        return head(torch.cat([emb, g], -1)).logits[0]


SPECULATORS_CONFIG = Path(__file__).parent / "data" / "speculators_eagle3_config.json"  # speculators 0.9.0 wrote it


def test_a_config_speculators_wrote_reads_as_vllm_reads_it(tmp_path, target):
    """speculators' own config.json (written by its `save_pretrained`: `rope_parameters` only, theta 500000 with
    Llama 3 scaling, norm_before_residual true) with tensors by its documented names: read as vLLM reads it, the
    head drafts what a plain reading with those settings computes. Mutations caught: theta read from the top level
    only (10000), the scaling dropped, norm_before_residual dropped."""
    config = json.loads(SPECULATORS_CONFIG.read_text())
    layer = config["transformer_layer_config"]
    assert "rope_theta" not in layer and layer["rope_parameters"]["rope_theta"] == 500000.0  # the case at issue
    tensors, ids = _eagle3_tensors("layers.0.")
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()  # as speculators stores
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    drafter = load_eagle(tmp_path, target)
    c = drafter.head.eagle
    assert (c.rope_theta, c.rope_scaling["rope_type"], c.norm_before_residual) == (500000.0, "llama3", True)
    assert drafter.head.embed_tokens is None  # the stored embeddings are the target's: the target's are used
    rope = layer["rope_parameters"]
    inv = _llama3_inv(500000.0, rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                      rope["original_max_position_embeddings"])
    prompt = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 8, 30, 11, 99, 3, 58, 71, 40, 12, 26, 90, 33, 7]])
    aux = config["eagle_aux_hidden_state_layer_ids"]
    want = _eagle3_reading(target, tensors, "layers.0.", aux, prompt, True, inv)
    got = _head_logits(drafter, target, prompt)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    # the reading has power: each setting read otherwise moves the logits by far more than the tolerance
    for other in (_eagle3_reading(target, tensors, "layers.0.", aux, prompt, False, inv),
                  _eagle3_reading(target, tensors, "layers.0.", aux, prompt, True, _inv(500000.0)),
                  _eagle3_reading(target, tensors, "layers.0.", aux, prompt, True, _inv(10000.0))):
        assert (other - want).abs().max() > 1e-2
    assert _first_draft(drafter, target, prompt) == int(ids[want[-1].argmax()])


@pytest.mark.parametrize("variant", ["vllm", "speculators"])
def test_norm_before_residual_defaults_as_each_layout_means_it(tmp_path, target, variant):
    """Without the key: a speculators file means true (speculators trains so and vLLM reads a missing key so), a
    reference file false; with it, as written. The head drafts as the flag says (plain reading)."""
    tensors, ids = _eagle3_tensors("midlayer." if variant == "vllm" else "layers.0.")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    prompt = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 8, 30]])
    p = "midlayer." if variant == "vllm" else "layers.0."
    for written, means in ((None, variant == "speculators"), (True, True), (False, False)):
        config = _eagle3_config(nested=variant == "speculators")
        if written is not None:
            config["norm_before_residual"] = written
        (tmp_path / "config.json").write_text(json.dumps(config))
        drafter = load_eagle(tmp_path, target)
        assert drafter.head.eagle.norm_before_residual is means, (variant, written)
        want = _eagle3_reading(target, tensors, p, AUX, prompt, means, _inv())
        torch.testing.assert_close(_head_logits(drafter, target, prompt), want, rtol=0, atol=1e-4)


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
    """The reference layout by value, on every field vLLM and SGLang read. Mutations caught: `vocab_size` written
    as the draft vocabulary's (vLLM sizes the target logits from it), `tie_word_embeddings` true (SGLang ties
    `lm_head` to the embeddings), the aux ids in one place only or in one numbering, `norm_before_residual` always
    false."""
    (tmp_path / "in").mkdir()
    tensors, _ = _eagle3_tensors()
    (tmp_path / "in" / "config.json").write_text(json.dumps(_eagle3_config() | {"norm_before_residual": True}))
    save_file(tensors, str(tmp_path / "in" / "model.safetensors"))
    head = Eagle3Head.load(tmp_path / "in", target=target)
    head.save(tmp_path / "out", dtype=torch.float32)
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(written) == set(tensors)  # the same names: midlayer.*, fc, norm, lm_head, d2t (offsets), t2d
    assert all(torch.equal(written[k], tensors[k]) for k in tensors)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["vocab_size"] == V and config["draft_vocab_size"] == VD  # the target's, and the draft's
    assert config["target_hidden_size"] == H and config["hidden_size"] == H and config["num_hidden_layers"] == 1
    assert config["tie_word_embeddings"] is False
    assert config["norm_before_residual"] is True  # as read, not a constant
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX  # vLLM: the stream entering each layer
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in AUX]  # SGLang: layer outputs
    assert config["rope_theta"] == 10000.0 and config["rope_parameters"]["rope_theta"] == 10000.0
    again = Eagle3Head.load(tmp_path / "out", target=target)
    assert again.eagle.norm_before_residual and list(again.eagle.aux_layers) == AUX
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def test_the_speculators_layout_written_here_is_the_one_speculators_writes(tmp_path, target):
    """`save(layout="speculators")` (what `train draft --format speculators` writes): every key speculators' own
    file has (its config.json from `save_pretrained`, in tests/core/data) at the top level and in the layer's
    config; the fields vLLM reads by value (the layer's `vocab_size` the target's, `draft_vocab_size`, the aux ids,
    no tied embeddings, the variant flags); speculators' tensor names with the target's embeddings; read back by a
    plain reading to the head's own logits, rope theta 500000 and the normed residual kept. (speculators 0.9.0
    itself loads such a folder unchanged: benchmarks/probes/speculators_check.py, results in docs/benchmarks.)"""
    (tmp_path / "in").mkdir()
    tensors, _ = _eagle3_tensors()
    config = _eagle3_config() | {"norm_before_residual": True, "rope_theta": 500000.0}
    (tmp_path / "in" / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "in" / "model.safetensors"))
    head = Eagle3Head.load(tmp_path / "in", target=target)
    head.save(tmp_path / "out", dtype=torch.float32, layout="speculators", target=target, verifier="org/target")
    ours = json.loads((tmp_path / "out" / "config.json").read_text())
    theirs = json.loads(SPECULATORS_CONFIG.read_text())
    computed = {"auto_map", "dtype", "transformers_version"}  # what their save adds from the running library
    assert set(theirs) - computed <= set(ours), set(theirs) - computed - set(ours)
    assert set(theirs["transformer_layer_config"]) <= set(ours["transformer_layer_config"])
    assert set(theirs["speculators_config"]) == set(ours["speculators_config"])
    layer = ours["transformer_layer_config"]
    assert ours["speculators_model_type"] == "eagle3" and ours["architectures"] == ["Eagle3Speculator"]
    assert layer["vocab_size"] == V and ours["draft_vocab_size"] == VD and layer["model_type"] == "llama"
    assert ours["tie_word_embeddings"] is False and layer["tie_word_embeddings"] is False
    assert ours["eagle_aux_hidden_state_layer_ids"] == AUX and ours["norm_before_residual"] is True
    assert (ours["norm_before_fc"], ours["fc_norm"], ours["norm_output"]) == (False, False, False)
    assert layer["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    assert (layer["head_dim"], layer["num_hidden_layers"], layer["hidden_size"]) == (HD, 1, H)
    assert ours["speculators_config"]["verifier"] == {"name_or_path": "org/target",
                                                      "architectures": ["LlamaForCausalLM"]}
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    layer_names = {k.removeprefix("midlayer.") for k in tensors if k.startswith("midlayer.")}
    assert set(written) == {f"layers.0.{k}" for k in layer_names} | {
        "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight"}
    assert torch.equal(written["embed_tokens.weight"], target.get_input_embeddings().weight.detach())
    prompt = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 8, 30, 11, 99, 3]])
    want = _eagle3_reading(target, written, "layers.0.", ours["eagle_aux_hidden_state_layer_ids"], prompt, True,
                           _inv(layer["rope_parameters"]["rope_theta"]))
    again = load_eagle(tmp_path / "out", target)
    torch.testing.assert_close(_head_logits(again, target, prompt), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("variant", ["norm_before_fc", "fc_norm", "norm_output"])
def test_speculators_variants_draft_as_a_plain_reading_of_them(tmp_path, target, variant):
    """speculators' `norm_before_fc` (one norm over the fused layers), `fc_norm` (one per layer) and `norm_output`
    (the normed output is the next step's feature): the first two drafted tokens of a chain are the plain
    reading's, and the variant changes what is drafted (the reading without it differs)."""
    tensors, ids = _eagle3_tensors("layers.0.")
    if variant == "norm_before_fc":
        tensors["input_norm.weight"] = 1 + _rand(3 * H, scale=0.5)
    if variant == "fc_norm":
        tensors |= {f"fc_norm.{k}.weight": 1 + _rand(H, scale=0.5) for k in range(3)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(_eagle3_config(nested=True) | {variant: True}))
    drafter = load_eagle(tmp_path, target)
    prompt = torch.tensor([[5, 17, 42, 9, 77, 23, 64, 8, 30, 11, 99, 3]])
    first = _eagle3_reading(target, tensors, "layers.0.", AUX, prompt, True, _inv(), variant)
    torch.testing.assert_close(_head_logits(drafter, target, prompt), first, rtol=0, atol=1e-4)
    d1 = int(first[-1].argmax())
    second = _eagle3_reading(target, tensors, "layers.0.", AUX, prompt, True, _inv(), variant, then=int(ids[d1]))
    plain = _eagle3_reading(target, tensors, "layers.0.", AUX, prompt, True, _inv(), None, then=int(ids[d1]))
    assert (second[-1] - plain[-1]).abs().max() > 1e-2  # the variant matters here
    adapter = __import__("multispec").HFCausalLM(target)
    pre = adapter.prefill(Prompt.build(prompt), drafter.feature_request)
    drafter.start(Prompt.build(prompt), pre.features)
    draft = drafter.propose(pre.roots, Chain(2), SamplingConfig()).tokens[0].tolist()
    assert draft == [int(ids[d1]), int(ids[second[-1].argmax()])]


def test_what_an_eagle3_reader_does_not_run_is_refused_by_name(tmp_path, target):
    tensors, _ = _eagle3_tensors("layers.0.")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    base = _eagle3_config(nested=True)
    cases = [({"transformer_layer_config": {**base["transformer_layer_config"], "num_hidden_layers": 2}},
              "2 decoder layers .*one-layer EAGLE-3 heads"),
             ({"transformer_layer_config": {**base["transformer_layer_config"], "model_type": "qwen3"}},
              "a qwen3 draft layer"),
             ({"transformer_layer_config": {**base["transformer_layer_config"], "rope_parameters": {
                 "rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}}, "rope_type: 'dynamic'"),
             ({"norm_before_fc": True, "fc_norm": True}, "one or the other")]
    for change, message in cases:
        (tmp_path / "config.json").write_text(json.dumps(base | change))
        with pytest.raises(ValueError, match=message):
            load_eagle(tmp_path, target)


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
