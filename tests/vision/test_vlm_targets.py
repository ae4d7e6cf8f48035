"""Vision-language targets (Llava with CLIP and SigLIP towers, LLaVA-NeXT and LLaVA-OneVision with their
image processors' any-resolution tiles, Qwen2-VL, Qwen2.5-VL) through the core:
tree logits equal the model's own forward on each node's path, greedy speculation equals `generate` (batch 1
and a ragged batch of 3, each row equal to that row alone), sampling reproduces the first-token
distribution, and bad inputs are refused by name."""

import pytest
import torch

from multispec import DynamicTree, EngineConfig, Prompt, SamplingConfig, StoppingConfig, speculative_generate
from multispec.drafters.controlled import ControlledDrafter
from multispec.targets.static import fixed_shape_class
from multispec.drafters import ModelDrafter
from multispec.targets import FeatureRequest, as_target
from multispec.testing import chi_square_pvalue, make_perturbed_copy, make_target
from multispec.vision import Gemma3VLTarget, Idefics3Target, LlavaTarget, PaliGemmaTarget, Qwen2VLTarget
from multispec.vision.testing import IMAGE_TOKEN, VLM_KINDS, make_vlm, row_of, vlm_prompts


@pytest.fixture(scope="module", params=VLM_KINDS)
def vlm(request):
    return request.param, make_vlm(request.param, seed=1)


def _extend(inputs: dict, tokens: torch.Tensor, kind: str = "") -> dict:
    """A row's model inputs with `tokens` appended as text (the reference: the model's own forward)."""
    out = dict(inputs)
    out["input_ids"] = torch.cat([inputs["input_ids"], tokens[None]], 1)
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    appended = 1 if kind == "paligemma" else 0  # PaliGemma: generated text is the causal suffix (type 1)
    for name in ("mm_token_type_ids", "token_type_ids"):  # one per token: appended text is type 0
        if name in inputs:
            out[name] = torch.cat([inputs[name], torch.full_like(tokens, appended)[None]], 1)
    return out


def _own_logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits[0, -1]


@pytest.mark.parametrize("step", ["eager", "static"])
def test_tree_logits_equal_the_model_forward_on_each_path(vlm, step):
    """Every node of a tree after the prompt, then a node after a commit of different paths, on the eager adapter
    and on its fixed-shape variant (budget 4: the six-node tree pads to 8)."""
    kind, model = vlm
    inputs = vlm_prompts(kind)
    target = as_target(model) if step == "eager" else fixed_shape_class(model)(model, capacity=128, node_budget=4)
    assert isinstance(target, Qwen2VLTarget if kind.startswith("qwen") else
                      Idefics3Target if kind in ("idefics3", "smolvlm") else
                      Gemma3VLTarget if kind == "gemma3" else PaliGemmaTarget if kind == "paligemma" else
                      LlavaTarget)
    prompt = Prompt.build(**inputs)
    request = FeatureRequest(hidden=True, layers=(0, 2), image_embeds=True)
    prefilled = target.prefill(prompt, request)
    images = prefilled.features.image_embeds
    assert images.shape[:2] == prefilled.features.image_mask.shape
    assert prefilled.features.image_mask.sum(1).tolist() == (inputs["input_ids"] == IMAGE_TOKEN).sum(1).tolist()
    # the residual stream entering layer 0 is the model's input: the image embeddings at the image tokens
    at_images = (inputs["input_ids"][:, :-1] == IMAGE_TOKEN)
    assert torch.allclose(prefilled.features.layers[0][at_images], images[prefilled.features.image_mask], atol=1e-6)
    assert prefilled.features.layers[2].shape == prefilled.features.hidden.shape  # the last layer's output
    g = torch.Generator().manual_seed(0)
    tokens = torch.cat([prefilled.roots[:, None], torch.randint(7, 128, (3, 5), generator=g)], 1)
    parents = torch.tensor([[-1, 0, 1, 2, 0, 1], [-1, 0, 1, 2, 0, 4], [-1, 0, 0, 2, 3, 1]])
    logits = target.score(tokens, parents, request=request).logits
    for r in range(3):
        alone = row_of(inputs, r)
        for node in range(6):
            path, j = [], node
            while j > 0:
                path.append(int(tokens[r, j]))
                j = int(parents[r, j])
            want = _own_logits(model, _extend(alone, torch.tensor(path[::-1], dtype=torch.long), kind))
            assert torch.allclose(logits[r, node], want, atol=1e-4), (kind, r, node)
    # commit a different path per row, then one more token per row
    target.commit(torch.tensor([[0, 1, 2], [0, 4, 5], [0, -1, -1]]))
    nxt = torch.randint(7, 128, (3, 1), generator=g)
    after = target.score(nxt, torch.full((3, 1), -1)).logits
    kept = [[1, 2], [4, 5], []]
    for r in range(3):
        extra = torch.cat([tokens[r, kept[r]], nxt[r]])
        want = _own_logits(model, _extend(row_of(inputs, r), extra, kind))
        assert torch.allclose(after[r, 0], want, atol=1e-4), (kind, r)
    assert step == "eager" or target.static_calls == 2


def test_a_forgotten_rope_delta_is_caught():
    """Negative control for the test above: Qwen2-VL nodes placed without the rope delta differ from the
    model's forward by more than the tolerance (so the path test can fail)."""
    model = make_vlm("qwen2-vl", seed=1)
    inputs = vlm_prompts("qwen2-vl")
    target = as_target(model)
    prefilled = target.prefill(Prompt.build(**inputs))
    assert bool((target.rope_deltas != 0).all())
    target.node_positions = lambda positions: positions[None].expand(3, -1, -1)  # the bug: no delta
    logits = target.score(prefilled.roots[:, None], torch.full((3, 1), -1)).logits
    want = _own_logits(model, _extend(row_of(inputs, 0), torch.zeros(0, dtype=torch.long)))
    assert (logits[0, 0] - want).abs().max() > 1e-3


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_speculation_equals_generate(vlm, batch):
    kind, model = vlm
    inputs = vlm_prompts(kind)
    if batch == 1:
        inputs = row_of(inputs, 2)
    n = 12
    drafter = ModelDrafter(make_perturbed_copy(model, noise=0.05))
    assert drafter.engine == "adapter"  # the draft VLM sees the images too
    for tree in (3, DynamicTree(depth=3, topk=2, total=6)):
        out = speculative_generate(model, drafter, max_new_tokens=n, tree=tree, **inputs,
                                   stopping=StoppingConfig.never())
        new = out.sequences[:, -n:]
        for r in range(batch):
            alone = row_of(inputs, r)
            with torch.no_grad():
                want = model.generate(**alone, max_new_tokens=n, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0, -n:]
            assert torch.equal(new[r], want), (kind, r, tree)
        assert out.stats.mean_accepted_length >= 1.5, (kind, out.stats)
    if batch == 1:  # and the batch-1 call equals generate on the same inputs
        with torch.no_grad():
            want = model.generate(**inputs, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out.sequences, want)


N = 4000
SAMPLING = dict(temperature=1.0, top_k=20)


def _first_tokens(model, inputs, seed=0, step="eager"):
    """N copies of one prompt (every input has one leading entry per row; Qwen2-VL's flattened patches
    repeat as one block per row)."""
    rows = {k: v.repeat(N, *([1] * (v.dim() - 1))) for k, v in inputs.items()}
    out = speculative_generate(model, ModelDrafter(make_perturbed_copy(model, noise=0.3)), max_new_tokens=1,
                               tree=2, generator=torch.Generator().manual_seed(seed), **rows,
                               sampling=SamplingConfig(do_sample=True, **SAMPLING), stopping=StoppingConfig.never(),
                               engine=EngineConfig(step=step))
    return out.sequences[:, -1], out


@pytest.mark.slow
@pytest.mark.parametrize("kind,step", [(k, "eager") for k in ("llava-siglip", "llava-next", "llava-onevision",
                                                                 "qwen2-vl", "mistral3", "idefics3", "qwen3-vl",
                                                                 "gemma3", "paligemma")]
                         + [(k, "static") for k in ("llava-siglip", "qwen2-vl", "gemma3")])
def test_sampled_first_token_follows_the_target(kind, step):
    """Power (`detectable_deviation(4000, 0.1, 20)`, level 1e-3, 90%): a 0.10 token moved by 3.1 points.
    Negative control: samples drawn with another image fail the same test. Three kinds on the static step too
    (Qwen2-VL's rope deltas, Gemma 3's bidirectional image block)."""
    model = make_vlm(kind, seed=2, head_scale=2.0)
    batch = vlm_prompts(kind)
    inputs, other = row_of(batch, 0), row_of(batch, 2)
    p = SamplingConfig(do_sample=True, **SAMPLING).probs(_own_logits(model, inputs)).double()
    first, out = _first_tokens(model, inputs, step=step)
    assert out.stats.steps[0].accepted > N // 10  # drafts were accepted, not only corrected
    assert chi_square_pvalue(first, p) > 1e-3
    # the same prompt text with another image of the same size: the test must notice
    control, _ = _first_tokens(model, dict(inputs, pixel_values=other["pixel_values"]), seed=1, step=step)
    assert chi_square_pvalue(control, p) < 1e-6


@pytest.mark.parametrize("step", ["eager", "static"])
@pytest.mark.parametrize("kind", ["gemma3", "paligemma"])
def test_bidirectional_blocks_wider_than_the_sliding_window(kind, step):
    """An image block (Gemma 3) or a prefix (PaliGemma) wider than the sliding window: `transformers` cuts
    Gemma 3's blocks with the window and lets PaliGemma's prefix attend across it; tree logits (the first root
    included) follow the model's forward either way, on the eager and the fixed-shape step, and the blocks change
    the logits here."""
    model = make_vlm(kind, seed=1)
    model.config.text_config.sliding_window = 3
    model.model.language_model.config.sliding_window = 3
    inputs = vlm_prompts(kind)
    target = as_target(model) if step == "eager" else fixed_shape_class(model)(model, capacity=96, node_budget=4)
    prefilled = target.prefill(Prompt.build(**inputs))
    tokens = torch.cat([prefilled.roots[:, None], torch.randint(7, 128, (3, 2), generator=torch.Generator())], 1)
    logits = target.score(tokens, torch.tensor([[-1, 0, 1]] * 3)).logits
    for r in range(3):
        alone = row_of(inputs, r)
        for node in range(3):
            want = _own_logits(model, _extend(alone, tokens[r, 1:node + 1], kind))
            assert torch.allclose(logits[r, node], want, atol=1e-4), (kind, r, node)
    causal = _own_logits(model, {k: v for k, v in row_of(inputs, 0).items() if k != "token_type_ids"})
    assert (causal - _own_logits(model, row_of(inputs, 0))).abs().max() > 1e-2  # the blocks matter here


def test_bad_inputs_are_refused_by_name():
    llama = make_target("llama")
    ids = torch.tensor([[9, 10, 11]])
    with pytest.raises(TypeError, match="pixel_values: target \\(LlamaForCausalLM\\) does not take this input"):
        speculative_generate(llama, "ngram", ids, pixel_values=torch.zeros(1, 3, 16, 16))
    qwen = make_vlm("qwen2-vl")
    inputs = row_of(vlm_prompts("qwen2-vl"), 0)
    for missing in ("image_grid_thw", "mm_token_type_ids"):
        partial = {k: v for k, v in inputs.items() if k != missing}
        with pytest.raises(ValueError, match=f"{missing}: Qwen2VLForConditionalGeneration needs it"):
            speculative_generate(qwen, "ngram", **partial)
    llava = make_vlm("llava-clip")
    inputs = row_of(vlm_prompts("llava-clip"), 0)
    with pytest.raises(ValueError, match="pixel_values: input_ids hold 16 image tokens"):
        speculative_generate(llava, "ngram", inputs["input_ids"])
    ends_with_image = torch.cat([inputs["input_ids"][:, :-3]], 1)
    with pytest.raises(ValueError, match="input_ids: a prompt ends with an image token"):
        speculative_generate(llava, "ngram", ends_with_image, pixel_values=inputs["pixel_values"])
    with pytest.raises(ValueError, match="pixel_values: given, but input_ids hold no image token"):
        speculative_generate(llava, "ngram", torch.tensor([[9, 10, 11]]), pixel_values=inputs["pixel_values"])
    with pytest.raises(ValueError, match="drafter: asks for image embeddings"):
        as_target(llama).check_request(FeatureRequest(image_embeds=True))


def test_a_session_over_a_vlm_rolls_back_and_continues_exactly():
    """Sessions keep the image prefix: generate, checkpoint, wander, roll back (the VLM draft restarts on the
    text with its image, per-token inputs extended), append text, continue == the model's own generate."""
    from multispec import Session

    model = make_vlm("qwen2-vl", seed=1)
    inputs = row_of(vlm_prompts("qwen2-vl"), 1)  # the 4x8 image: rope delta != 0
    session = Session(model, ModelDrafter(make_perturbed_copy(model, noise=0.05)), tree=3,
                      stopping=StoppingConfig.never())
    session.append(**inputs)
    first = session.generate(6)[0]
    mark = session.checkpoint()
    session.generate(5)
    session.rollback(mark)
    session.append(torch.tensor([[9, 10, 11]]))
    more = session.generate(8)[0]
    text = torch.tensor(first + [9, 10, 11])
    with torch.no_grad():
        want = model.generate(**_extend(inputs, text), max_new_tokens=8, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, -8:]
    assert more == want.tolist()
    assert session.stats.mean_accepted_length >= 1.5, session.stats


@pytest.mark.parametrize("kind", ["llava-clip", "llava-siglip"])
def test_lean_llava_target_equals_the_transformers_path(kind):
    """Llava with a Llama text model runs through the core's lean forward by default; its prefill features,
    tree logits and node features equal the reference path's (the model's own forward)."""
    from multispec.vision.targets import LeanLlavaTarget

    model = make_vlm(kind, seed=1)
    assert type(as_target(model)) is LeanLlavaTarget
    inputs = vlm_prompts(kind)  # ragged rows, left padding
    request = FeatureRequest(hidden=True, layers=(0, 1), image_embeds=True)
    g = torch.Generator().manual_seed(0)
    draft = torch.randint(7, 128, (3, 5), generator=g)
    parents = torch.tensor([[-1, 0, 1, 2, 0, 1], [-1, 0, 1, 2, 0, 4], [-1, 0, 0, 2, 3, 1]])
    got = []
    for target in (LlavaTarget(model), LeanLlavaTarget(model)):
        pre = target.prefill(Prompt.build(**inputs), request)
        out = target.score(torch.cat([pre.roots[:, None], draft], 1), parents, request=request)
        got.append((pre.features.hidden, pre.features.layers[1], pre.features.image_embeds, out.logits,
                    out.features.hidden))
    for ref, lean in zip(*got):
        assert torch.allclose(ref, lean, atol=1e-5), (ref - lean).abs().max()


def test_lean_llava_target_refuses_a_text_model_it_cannot_run():
    from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

    from multispec.vision.targets import LeanLlavaTarget

    model = make_vlm("llava-siglip", seed=1)
    config = LlavaConfig(vision_config=SiglipVisionConfig(**model.config.vision_config.to_dict()),
                         text_config=dict(model.config.text_config.to_dict(), hidden_act="gelu"),
                         image_token_id=IMAGE_TOKEN, vision_feature_select_strategy="full")
    gelu = LlavaForConditionalGeneration(config)
    assert type(as_target(gelu)) is LlavaTarget  # the reference path still takes it
    with pytest.raises(TypeError, match="hidden_act"):
        LeanLlavaTarget(gelu)


def test_mistral3_without_image_sizes_is_refused_by_name():
    model = make_vlm("mistral3", seed=1)
    inputs = vlm_prompts("mistral3")
    inputs.pop("image_sizes")
    with pytest.raises(ValueError, match="image_sizes: Mistral3ForConditionalGeneration needs"):
        speculative_generate(model, "ngram", max_new_tokens=2, **inputs)


def test_idefics3_pixel_values_without_the_images_axis_are_refused_by_name():
    model = make_vlm("idefics3", seed=1)
    inputs = vlm_prompts("idefics3")
    inputs["pixel_values"] = inputs["pixel_values"][:, 0]  # [rows, 3, H, W]: the per-row images axis lost
    with pytest.raises(ValueError, match=r"pixel_values: Idefics3ForConditionalGeneration takes \[batch, images"):
        speculative_generate(model, "ngram", max_new_tokens=2, **inputs)


@pytest.mark.parametrize("batch", [1, 3])
def test_static_step_equals_generate(vlm, batch):
    """The fixed-shape step (`step="static"`: the adapter's prefill with its images, then text nodes at fixed
    shapes, `multispec.targets.static_hf`): greedy output equal to `generate`, drafts accepted (PaliGemma through
    its own variant, `StaticPaliGemmaFeed`)."""
    kind, model = vlm
    inputs = vlm_prompts(kind)
    if batch == 1:
        inputs = row_of(inputs, 2)
    n = 12
    drafter = ControlledDrafter(model, acceptance=0.8, horizon=n)
    run = lambda: speculative_generate(model, drafter, max_new_tokens=n, tree=4, **inputs,  # noqa: E731
                                       stopping=StoppingConfig.never(), engine=EngineConfig(step="static"))
    out = run()
    with torch.no_grad():
        for r in range(batch):
            want = model.generate(**row_of(inputs, r), max_new_tokens=n, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, -n:]
            assert torch.equal(out.sequences[r, -n:], want), (kind, r)
    assert out.stats.mean_accepted_length > 2.0, (kind, out.stats)
    engine = next(iter(model._multispec_static_engines.values()))
    assert type(engine).__name__.startswith("Static") and engine.static_calls > 0


@pytest.mark.parametrize("kind", ["qwen2-vl", "paligemma"])
def test_the_compiled_vlm_step_has_no_graph_break_and_reads_once(kind, as_on_cuda):
    """`torch.compile(fullgraph=True)` (eager backend) over a VLM's fixed-shape decode (Qwen2-VL: its rope deltas,
    PaliGemma: its prefix flags, both graph-read attributes); greedy output equal to `generate`; a step reads the
    device once (the controlled drafter reads nothing itself)."""
    from multispec.session import Session
    from multispec.testing import CountReads, assert_one_read_per_step

    model = make_vlm(kind, seed=1)
    inputs = row_of(vlm_prompts(kind), 1)
    n = 12
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    engine = fixed_shape_class(model)(model, capacity=128, node_budget=8, compile="eager")
    drafter = ControlledDrafter(model, acceptance=0.8, horizon=n, continuation=want[:, -n:])
    session = Session(engine, drafter, tree=4, rollback=False, stopping=StoppingConfig.never())
    session.append(**inputs)
    with CountReads() as loop:
        new = session.generate(n)
    assert new[0] == want[0, -n:].tolist()
    steps = len(session.stats.steps)
    assert session.stats.mean_accepted_length > 2.0 and engine.static_calls == steps
    assert_one_read_per_step(loop, steps)
