"""The fixed-shape step over each class's own forward, captured in CUDA graphs (`multispec.targets.static_hf`):
replays give the eager step's tokens and `generate`'s (fp32), with drafts accepted; one class also under
`torch.compile` (inductor); the state-space, PaliGemma and Janus engines too, and the continuous loop's step.
CPU twins: tests/core/test_static_classes.py, tests/vision/test_vlm_targets.py, tests/ssm/test_ssm_static.py,
tests/image_ar/test_janus.py, tests/image_ar/test_continuous_static.py."""

import pytest
import torch

from multispec import EngineConfig, StoppingConfig, speculative_generate
from multispec.drafters.controlled import ControlledDrafter
from multispec.image_ar.continuous import (PatchAR, PatchARConfig, PatchEagle, PatchEagleConfig, TrajectoryRatio,
                                           generate_continuous)
from multispec.image_ar.continuous.diffusion_head import Trajectory
from multispec.image_ar.continuous.head_sampler import HeadSampler
from multispec.image_ar.continuous.static import StaticContinuous
from multispec.image_ar.continuous.targets import plain_trajectories
from multispec.testing import DECODERS, make_decoder, ragged_prompts

CUDA = torch.device("cuda")


def _run(model, ids, mask, step: str, n: int = 24):
    drafter = ControlledDrafter(model, acceptance=0.8, horizon=n)
    return speculative_generate(model, drafter, ids, attention_mask=mask, max_new_tokens=n, tree=4,
                                stopping=StoppingConfig.never(),
                                engine=EngineConfig(step=step))


@pytest.mark.parametrize("name", list(DECODERS))
def test_captured_step_replays_equal_eager_and_generate(name):
    model = make_decoder(name, seed=1).to(CUDA)
    ids, mask = (t.to(CUDA) for t in ragged_prompts(3, seed=3))
    want = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    eager, static = _run(model, ids, mask, "eager"), _run(model, ids, mask, "static")
    assert torch.equal(static.sequences, eager.sequences), name
    assert torch.equal(static.sequences[:, : want.shape[1]], want), name
    assert static.stats.mean_accepted_length > 2.0
    engine = next(iter(model._multispec_static_engines.values()))
    assert engine.cuda_graphs and engine._graphs and engine.static_calls > 0  # replayed, not eager


@pytest.mark.parametrize("name", ["qwen3", "gemma2"])
def test_inductor_compiled_step_equals_eager(name):
    model = make_decoder(name, seed=1).to(CUDA)
    ids, mask = (t.to(CUDA) for t in ragged_prompts(2, seed=3))
    assert torch.equal(_run(model, ids, mask, "compiled", 16).sequences, _run(model, ids, mask, "eager", 16).sequences)


@pytest.mark.parametrize("kind", ["llava-clip", "qwen2-vl", "gemma3"])
def test_vlm_captured_decode_equals_generate(kind):
    from multispec.vision.testing import make_vlm, row_of, vlm_prompts

    model = make_vlm(kind, seed=1).to(CUDA)
    batch = {k: v.to(CUDA) if isinstance(v, torch.Tensor) else v for k, v in vlm_prompts(kind).items()}
    # the ragged batch, then rows 0 and 1 alone: the second single-row generation replays the first one's graphs
    # with another image size (Qwen2-VL: other rope deltas), so its positions must be read as graph inputs
    for inputs in (batch, row_of(batch, 0), row_of(batch, 1)):
        out = speculative_generate(model, ControlledDrafter(model, 0.8, 12), max_new_tokens=12, tree=4, **inputs,
                                   stopping=StoppingConfig.never(), engine=EngineConfig(step="static"))
        for r in range(inputs["input_ids"].shape[0]):
            want = model.generate(**row_of(inputs, r), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, -12:]
            assert torch.equal(out.sequences[r, -12:], want), (kind, r)


@pytest.mark.parametrize("kind", ["paligemma"])
def test_paligemma_captured_decode_equals_generate(kind):
    """PaliGemma's own variant (`StaticPaliGemmaFeed`): the prefix root's flags are graph-read tensors."""
    test_vlm_captured_decode_equals_generate(kind)


@pytest.mark.parametrize("kind", ["mamba2", "mamba", "bamba", "jamba", "qwen3_next", "zamba2"])
def test_ssm_captured_step_replays_equal_eager_and_generate(kind):
    """The state-space engines (`ssm/static.py`, `ssm/static_hybrid.py`) captured in CUDA graphs: the Triton tree
    kernels inside the graph, the states in fixed buffers. CPU twin: tests/ssm/test_ssm_static.py."""
    from multispec.ssm import testing as ssm_testing
    from multispec.testing import greedy_rows_alone

    maker = {"mamba2": ssm_testing.make_mamba2, "mamba": ssm_testing.make_mamba, "bamba": ssm_testing.make_bamba,
             "jamba": ssm_testing.make_jamba, "qwen3_next": ssm_testing.make_qwen3_next,
             "zamba2": ssm_testing.make_zamba2}[kind]
    model = maker(seed=1).to(CUDA)
    ids, mask = (t.to(CUDA) for t in ragged_prompts(3, seed=3))
    eager, static = _run(model, ids, mask, "eager"), _run(model, ids, mask, "static")
    assert torch.equal(static.sequences, eager.sequences), kind
    assert torch.equal(static.sequences[:, -24:], greedy_rows_alone(model, ids, mask, 24)), kind
    engine = next(iter(model._multispec_static_engines.values()))
    assert engine.cuda_graphs and engine._graphs and engine.static_calls > 0


def test_janus_captured_guided_step_equals_janus_generate():
    from multispec.drafters import ModelDrafter
    from multispec.image_ar.testing import NUM_IMAGE_TOKENS, janus_prompts, make_janus
    from multispec.targets import GuidedTarget
    from multispec.testing import make_perturbed_copy

    janus = make_janus(seed=1).to(CUDA)
    draft = ModelDrafter(GuidedTarget(make_perturbed_copy(janus, noise=0.05), 3.0))
    ids, mask = (t.to(CUDA) for t in janus_prompts((6, 4, 5)))
    out = speculative_generate(GuidedTarget(janus, 3.0), draft, ids, attention_mask=mask,
                               max_new_tokens=NUM_IMAGE_TOKENS, tree=3,
                               engine=EngineConfig(step="static"))
    for r in range(3):
        alone = ids[r, mask[r].bool()][None]
        want = janus.generate(alone, attention_mask=torch.ones_like(alone), generation_mode="image",
                              do_sample=False, guidance_scale=3.0)
        assert torch.equal(out.sequences[r, -NUM_IMAGE_TOKENS:], want[0]), r


def _jittered(model):
    """A random model whose zero-initialised modulations are moved: its head's noise prediction depends on its
    condition, so a draft's trajectories are accepted and rejected."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.to(CUDA).eval()


@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_continuous_captured_step_replays_equal_the_uncaptured_step(kind):
    torch.manual_seed(0)
    cfg = dict(image_size=6, patch=2, hidden=16, heads=2, head_width=16, head_blocks=1, steps=4, stop=50,
               num_classes=2)
    target = _jittered(PatchAR(PatchARConfig(layers=2, **cfg)))
    draft = _jittered(PatchAR(PatchARConfig(layers=1, **cfg)) if kind == "draft"
                      else PatchEagle(PatchEagleConfig(hidden=16, heads=2, token_dim=4, tokens=9)))
    labels, c = torch.tensor([0, 1, 1], device=CUDA), target.config
    trajectory = Trajectory.make(c.steps, c.stop)
    p = HeadSampler(target, trajectory, 2.0)
    q = p if kind == "eagle" else HeadSampler(draft, trajectory, 2.0)
    prefix, _ = plain_trajectories(target, labels, p, 1, torch.Generator(CUDA).manual_seed(2))
    runs = {}
    for graphs in (False, True):
        engine = StaticContinuous(target, labels, p, draft, q, 2, TrajectoryRatio(), cuda_graphs=graphs)
        with torch.no_grad():
            runs[graphs] = engine.generate(prefix, c.tokens - 1, torch.Generator(CUDA).manual_seed(3))
        assert engine.cuda_graphs == graphs and (engine._graph is not None) == graphs
    assert runs[True].steps > 2  # the graph replayed
    torch.testing.assert_close(runs[True].output.values, runs[False].output.values, atol=1e-5, rtol=1e-5)
    assert 0 < runs[True].output.stats.accepted < runs[True].output.stats.drafted
    for step in ("static", "compiled"):  # the public path, a CPU generator driving the CUDA step
        out = generate_continuous(target, labels.cpu(), draft, tree=3, engine=EngineConfig(step=step),
                                  generator=torch.Generator().manual_seed(1))
        assert out.drafted > 0 and bool(torch.isfinite(out.tokens).all()), step


def test_the_dynamic_ntk_table_on_cuda_is_the_growth_function_per_length():
    """On CUDA the rotary table is one vectorised call of `transformers`' growth function over a column of
    lengths (`dynamic_rope.DynamicNTK._grown`); it must equal the 0-d call `generate`'s update makes, bit for bit,
    at Llama-3's head size and theta (on the CPU the two differ, so there each length is its own call)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from multispec.targets.dynamic_rope import DynamicNTK

    config = LlamaConfig(vocab_size=32, hidden_size=1024, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64,
                         rope_parameters=dict(rope_type="dynamic", rope_theta=500000.0, factor=4.0))
    ntk = DynamicNTK(LlamaForCausalLM(config).to(CUDA).model.rotary_emb)
    ntk.cover(2000)
    for n in range(65, 2001):
        want, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, CUDA, seq_len=torch.tensor(n, device=CUDA))
        assert torch.equal(ntk.table[n], want), n
