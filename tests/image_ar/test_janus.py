"""Janus image generation with classifier-free guidance through the core: greedy speculative output equals
Janus's own `generate(..., generation_mode="image")`, the sampled first image token follows the guided
distribution, and guidance is refused for targets that cannot build an unconditional prompt."""

import pytest
import torch

from multispec import EngineConfig, SamplingConfig, Session, StoppingConfig, speculative_generate
from multispec.drafters.controlled import ControlledDrafter
from multispec.drafters import ModelDrafter
from multispec.image_ar import JanusImageTarget
from multispec.image_ar.testing import IMAGE_VOCAB, NUM_IMAGE_TOKENS, janus_prompts, make_janus
from multispec.targets import FeatureRequest, GuidedTarget, as_target
from multispec.targets.static import fixed_shape_class
from multispec.testing import (CountReads, assert_one_read_per_step, chi_square_pvalue, compare_tree_feeds,
                               make_perturbed_copy, make_target)

SCALE = 3.0


@pytest.fixture(scope="module")
def janus():
    return make_janus(seed=1)


def _guided_draft(model, noise=0.05):
    return ModelDrafter(GuidedTarget(make_perturbed_copy(model, noise=noise), SCALE))


@pytest.mark.parametrize("step", ["eager", "static"])
@pytest.mark.parametrize("lengths", [(6,), (6, 4, 5)])
def test_greedy_guided_speculation_equals_janus_generate(janus, lengths, step):
    """Static: the guided Janus's fixed-shape engine (`StaticJanusFeed`: the nodes' image and text-root
    embeddings computed before the fixed-shape call) runs both halves."""
    ids, mask = janus_prompts(lengths)
    assert isinstance(as_target(janus), JanusImageTarget)
    out = speculative_generate(GuidedTarget(janus, SCALE), _guided_draft(janus), ids, attention_mask=mask,
                               max_new_tokens=NUM_IMAGE_TOKENS, tree=3, engine=EngineConfig(step=step))
    new = out.sequences[:, -NUM_IMAGE_TOKENS:]
    for r in range(len(lengths)):
        alone = ids[r, mask[r].bool()][None]
        with torch.no_grad():
            want = janus.generate(alone, attention_mask=torch.ones_like(alone), generation_mode="image",
                                  do_sample=False, guidance_scale=SCALE)
        assert torch.equal(new[r], want[0]), r
    assert out.stats.mean_accepted_length >= 1.5, out.stats
    if step == "static":
        (engine,) = janus.__dict__["_multispec_static_engines"].values()
        assert type(engine).__name__ == "StaticJanusImageTarget" and engine.static_calls > 0


def _guided_first_token_probs(model, prompt: torch.Tensor, scale: float, sampling) -> torch.Tensor:
    target = as_target(model)
    uncond = target.unconditional_prompt(__import__("multispec").Prompt.build(prompt)).input_ids
    with torch.no_grad():
        logits = []
        for ids in (prompt, uncond):
            embeds = model.get_input_embeddings()(ids)
            hidden = model.model.language_model(inputs_embeds=embeds).last_hidden_state[:, -1]
            logits.append(model.model.generation_head(hidden)[0].float())
    cond, un = logits
    return sampling.probs(un + scale * (cond - un)).double()


N = 4000


@pytest.mark.slow
@pytest.mark.parametrize("step", ["eager", "static"])
def test_sampled_first_image_token_follows_the_guided_distribution(step):
    """Power (`detectable_deviation(4000, p, 64)`, level 1e-3, 90%): a 0.10 token moved by 3.8 points, a
    0.02 token by 1.8 points. Negative control: the unguided distribution (scale 1) fails the same samples
    (the two laws differ by total variation 0.11)."""
    model = make_janus(seed=2, head_scale=16.0)  # a peaked first-token law: guided and unguided differ by TV 0.11
    ids, _ = janus_prompts((6,))
    sampling = SamplingConfig(do_sample=True, temperature=1.0)
    rows = ids.expand(N, -1).contiguous()
    out = speculative_generate(GuidedTarget(model, SCALE), _guided_draft(model, noise=0.3), rows, max_new_tokens=1,
                               tree=2, sampling=sampling, generator=torch.Generator().manual_seed(0),
                               engine=EngineConfig(step=step))
    first = out.sequences[:, -1]
    assert out.stats.steps[0].accepted > N // 10
    assert chi_square_pvalue(first, _guided_first_token_probs(model, ids, SCALE, sampling)) > 1e-3
    assert chi_square_pvalue(first, _guided_first_token_probs(model, ids, 1.0, sampling)) < 1e-6


def test_guidance_needs_a_model_that_builds_unconditional_prompts():
    llama = make_target("llama")
    with pytest.raises(ValueError, match="guidance_scale: target \\(LlamaForCausalLM\\) does not say how to build"):
        GuidedTarget(llama, 2.0)
    with pytest.raises(TypeError, match="guidance_scale: give it in the target: GuidedTarget"):
        speculative_generate(llama, "ngram", torch.tensor([[9, 10, 11]]), guidance_scale=2.0)
    with pytest.raises(ValueError, match="guidance_scale: expected a positive number"):
        GuidedTarget(make_janus(), 0.0)


def test_lantern_on_janus_neighbourhoods_from_its_vq_codebook(janus):
    """LANTERN on a user's model: the neighbourhoods come from Janus's `vq_config` codebook; delta = 0 is
    the exact rule token for token, delta > 0 accepts more and reports TVD <= delta."""
    from multispec import DynamicTree
    from multispec.image_ar import Relaxed

    codebook = janus.model.vqmodel.quantize.embedding.weight
    assert codebook.shape[0] == janus.config.vq_config.num_embeddings
    ids, mask = janus_prompts((6, 4, 5, 6))
    ids, mask = ids.repeat(4, 1), mask.repeat(4, 1)
    results = {}
    for name, rule in (("exact", None), ("zero", Relaxed.from_codebook(codebook, 8, delta=0.0)),
                       ("lantern", Relaxed.from_codebook(codebook, 8, delta=0.3))):
        tvd = []
        record = lambda d, v, rows: tvd.append(float(getattr(v, "tvd", torch.zeros(1)).max()))  # noqa: E731
        out = speculative_generate(GuidedTarget(janus, SCALE), _guided_draft(janus, noise=0.3), ids,
                                   attention_mask=mask,
                                   max_new_tokens=NUM_IMAGE_TOKENS, tree=DynamicTree(3, 3, 6), rule=rule,
                                   sampling=SamplingConfig(do_sample=True, top_k=32),
                                   generator=torch.Generator().manual_seed(0), engine=EngineConfig(on_step=record))
        results[name] = (out.sequences, out.stats.mean_accepted_length, max(tvd))
    assert torch.equal(results["zero"][0], results["exact"][0]) and results["zero"][2] == 0.0
    assert 0.0 < results["lantern"][2] <= 0.3 + 1e-6
    assert results["lantern"][1] > results["exact"][1]


def test_static_feed_logits_equal_eager_on_every_tree_node(janus):
    """Janus's fixed-shape variant against its eager adapter: trees fed in calls, commits, a dropped row; the first
    root's text embedding included (`compare_tree_feeds`)."""
    ids, mask = janus_prompts((6, 4, 5))
    engine = fixed_shape_class(janus)(janus, capacity=64, node_budget=(2, 4))
    compare_tree_feeds(JanusImageTarget(janus), engine, ids, mask, FeatureRequest(hidden=True), counts=True)
    assert engine.static_calls == 7


def test_the_compiled_guided_step_has_no_graph_break_and_reads_once(janus, as_on_cuda):
    """`torch.compile(fullgraph=True)` (eager backend) over the guided Janus step, greedy output equal to Janus's
    `generate`; a step reads the device once (the drafter reads nothing itself)."""
    ids, mask = janus_prompts((6,))
    engine = fixed_shape_class(janus)(janus, capacity=64, node_budget=8, compile="eager")
    alone = ids[0, mask[0].bool()][None]
    with torch.no_grad():
        want = janus.generate(alone, attention_mask=torch.ones_like(alone), generation_mode="image", do_sample=False,
                              guidance_scale=SCALE)
    drafter = ControlledDrafter(janus, acceptance=0.8, horizon=NUM_IMAGE_TOKENS,
                                continuation=want[:, -NUM_IMAGE_TOKENS:], vocab_size=IMAGE_VOCAB)
    session = Session(GuidedTarget(engine, SCALE), drafter, tree=4, rollback=False,
                      stopping=StoppingConfig.never())
    session.append(ids, mask)
    with CountReads() as loop:
        new = session.generate(NUM_IMAGE_TOKENS)
    assert new[0] == want[0, -NUM_IMAGE_TOKENS:].tolist()
    steps = len(session.stats.steps)
    assert session.stats.mean_accepted_length > 2.0 and engine.static_calls == steps
    assert_one_read_per_step(loop, steps)
