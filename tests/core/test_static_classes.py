"""The fixed-shape step over the model's own forward (`multispec.targets.static_hf`) for decoders the lean engine
does not serve: RoPE variants, q/k norms, experts, per-layer sliding windows, soft-capping, logit and residual
scales, attention sinks (`multispec.testing.DECODERS`). Per class: its logits equal the eager feed's on every
node of a tree (across commits and a dropped row), its greedy output equals `generate` at batch 1 and a ragged
batch of 3 with drafts accepted, and `torch.compile(fullgraph=True)` traces the step without a graph break."""

import ast
import copy
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from multispec import EngineConfig, StoppingConfig, speculative_generate
from multispec.drafters.controlled import ControlledDrafter
from multispec.targets.base import FeatureRequest
from multispec.targets.hf import HFCausalLM
from multispec.targets.static import FIXED_SHAPE, fixed_shape_class, generic_static_unsupported, register_fixed_shape
from multispec.targets.static_hf import StaticFeed, StaticHFCausalLM
from multispec.testing import DECODERS, compare_tree_feeds, make_decoder, make_target, ragged_prompts



@pytest.fixture(scope="module", params=list(DECODERS))
def decoder(request):
    return request.param, make_decoder(request.param, seed=1)


def test_static_feed_logits_equal_eager_on_every_tree_node(decoder):
    """Trees fed in calls (parents fed earlier and within a call, invalid nodes, a call wider than the largest
    budget), commits of paths, then a row dropped: every valid node's logits and features equal the eager
    feed's."""
    name, model = decoder
    ids, mask = ragged_prompts(3, seed=7)
    static = StaticHFCausalLM(model, capacity=64, node_budget=(2, 4))
    compare_tree_feeds(HFCausalLM(model), static, ids, mask, FeatureRequest(hidden=True, layers=(0, 2)), counts=True)
    assert static.static_calls == 7, name  # the 5-node calls too (padded to 8)


@pytest.mark.parametrize("rows", [1, 3], ids=["B1", "ragged-B3"])
def test_greedy_equals_generate_with_drafts_accepted(decoder, rows):
    """The eager step and the static one, each equal to `generate`."""
    name, model = decoder
    ids, mask = ragged_prompts(rows, seed=3)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    for step in ("eager", "static"):
        drafter = ControlledDrafter(model, acceptance=0.8, horizon=16)
        got = speculative_generate(model, drafter, ids, attention_mask=mask, max_new_tokens=16, tree=4,
                                   stopping=StoppingConfig.never(), engine=EngineConfig(step=step))
        assert torch.equal(got.sequences[:, : want.shape[1]], want), (name, step)
        assert got.stats.mean_accepted_length > 2.0, got.stats  # drafts accepted: not plain decoding in disguise
    engines = list(model._multispec_static_engines.values())
    assert [type(e) for e in engines] == [StaticHFCausalLM] and engines[0].static_calls > 0


def test_compiled_step_has_no_graph_break(decoder):
    """`torch.compile(fullgraph=True)` (dynamo's tracing, run by the eager backend) raises at any graph break;
    the compiled step's output equals `generate`."""
    name, model = decoder
    ids, mask = ragged_prompts(3, seed=5)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    engine = StaticHFCausalLM(model, capacity=64, node_budget=8, compile="eager")
    got = speculative_generate(engine, ControlledDrafter(model, 0.8, 10), ids, attention_mask=mask, max_new_tokens=10,
                               tree=4,
                               stopping=StoppingConfig.never())
    assert torch.equal(got.sequences[:, : want.shape[1]], want), name
    assert engine.static_calls > 0


def test_what_the_static_step_refuses_is_named():
    dynamic = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                           num_attention_heads=4, num_key_value_heads=2, rope_parameters=dict(
                                               rope_type="dynamic", rope_theta=10000.0, factor=2.0))).eval()
    assert generic_static_unsupported(dynamic) is None  # one dynamic NTK state: served (`dynamic_rope`)
    dynamic.model.second_rope = copy.deepcopy(dynamic.model.rotary_emb)  # two states: refused on both steps
    assert "2 dynamic rotary embeddings" in generic_static_unsupported(dynamic)  # (tests/core/test_dynamic_rope.py)
    from multispec.ssm.testing import make_bamba
    from multispec.vision.testing import make_vlm
    assert generic_static_unsupported(make_vlm("paligemma")) is None  # its own variant: tests/vision/
    assert generic_static_unsupported(make_vlm("qwen2-vl")) is None  # served: tests/vision/test_vlm_targets.py
    assert generic_static_unsupported(make_bamba()) is None  # served: tests/ssm/test_ssm_static.py
    with pytest.raises(ValueError, match="capacity: expected an int above the largest node budget"):
        StaticHFCausalLM(make_target("gemma3"), capacity=8, node_budget=16)


def test_an_adapter_runs_at_fixed_shapes_only_on_the_class_written_for_it(monkeypatch):
    """The fixed-shape contract: the class registered for exactly the adapter's class (named, written beside it);
    a user's subclass of a served adapter is refused by name (the parent's static class would drop its overrides,
    a silent wrong answer), until a class is registered for it; `register_fixed_shape` takes only a fixed-shape
    subclass of the adapter."""
    from multispec.vision.targets import LlavaTarget, StaticLlavaTarget
    from multispec.vision.testing import make_vlm
    model = make_vlm("llava-clip")
    assert fixed_shape_class(model) is StaticLlavaTarget  # LeanLlavaTarget serves it; its eager_class is Llava's

    class MyLlava(LlavaTarget):
        def node_positions(self, *args, **kwargs):  # a user's own positions, say
            return super().node_positions(*args, **kwargs)

    monkeypatch.setattr("multispec.targets.static.ADAPTERS", [(lambda m: True, MyLlava)])
    with pytest.raises(ValueError, match=r"served by MyLlava, which has no fixed-shape class: write one for it "
                                         r"\(class StaticMyLlava\(StaticFeed, MyLlava\)"):
        fixed_shape_class(model)
    with pytest.raises(TypeError, match="static: expected a fixed-shape subclass of MyLlava"):
        register_fixed_shape(MyLlava, StaticLlavaTarget)  # not a subclass of MyLlava

    class StaticMyLlava(StaticFeed, MyLlava):
        pass

    monkeypatch.setitem(FIXED_SHAPE, MyLlava, StaticMyLlava)
    assert fixed_shape_class(model) is StaticMyLlava


def test_no_class_is_made_at_run_time():
    """Every fixed-shape class is written out by name: no three-argument `type(name, bases, namespace)` anywhere in
    the package or its modalities."""
    root = Path(__file__).resolve().parents[2]
    made = [f"{path.relative_to(root)}:{node.lineno}" for folder in ("multispec", "vision", "image_ar", "ssm",
                                                                      "reasoning")
            for path in (root / folder).rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
            and len(node.args) == 3]
    assert not made, f"classes made at run time: {made}"
