"""Device safety without a GPU: every modality's generation runs under `DeviceGuard` (tests/device_guard.py),
which flags each tensor factory called from the project's source without `device=`, and each random draw
that does not come from the caller's generator or is not made on the generator's device. Those are the
calls that pass on a CPU and crash with a CUDA model (a CPU class-token tensor indexing CUDA embeddings;
`torch.rand(..., generator=cuda_generator)` on the CPU); tests/gpu/test_cuda_generation.py runs the same
paths on a GPU.

The policy for generators on another device than the model (chosen here, and what `generate` allows):
it works. Every draw is made on the generator's own device and then moved to the data's device, so a CPU
generator drives a CUDA model and a CUDA generator a CUDA model, and seeded runs reproduce on each.

The guard itself is shown to work: a planted `torch.zeros(3)` is flagged (with its file and line), the same
call from code outside the checked folders is not, nor is a factory torch calls internally."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from device_guard import EXEMPT, REPO, DeviceGuard
from multispec import (DynamicTree, HybridDrafter, SamplingConfig, Session, StaticTree, SuffixDecodingDrafter,
                       TokenRecyclingDrafter, speculative_generate)
from multispec.continuous import continuous_generate
from multispec.drafters import ModelDrafter
from multispec.drafters.eagle import EagleConfig, EagleDrafter, EagleHead
from multispec.gmm_ar import GaussianMixtureAR, GMMDrafter, GMMTarget
from multispec.image_ar import (HeadSampling, PatchAR, PatchARConfig, PatchEagle, PatchEagleConfig, Relaxed,
                                TrajectoryRatio,
                                generate_ar, generate_continuous, generate_images, latent_neighbours)
from multispec.image_ar.testing import NUM_IMAGE_TOKENS, janus_prompts, make_image_gpt, make_janus
from multispec.reasoning import (LikelihoodVerdict, SpecReason, SpecReasonConfig, SpeculativeThinking,
                                 SpeculativeThinkingConfig, SpeculativeVerdict, TextExpert, Writer)
from multispec.rules import Judge
from multispec.rules.judge_head import JudgeHead
from multispec.sampling import exponential, normal, uniform
from multispec.ssm import testing as ssm_testing
from multispec.targets import GuidedTarget, HFCausalLM
from multispec.testing import make_text_models, make_perturbed_copy, make_target, ragged_prompts
from multispec.vision import VisionEagleDrafter
from multispec.vision.testing import make_vlm, tiny_head, vlm_prompts
from multispec.zoo.bytes_lm import ByteTokenizer

HERE = str(Path(__file__).resolve())


def _guarded(run, generator) -> DeviceGuard:
    guard = DeviceGuard(require_generator=generator is not None)
    with guard:
        run(generator)
    return guard


# ---- the guard ----------------------------------------------------------------------------------------------


def _planted(g):
    """Code that would break with a CUDA model; one violation per line, named below by offset."""
    torch.zeros(3)  # +1: no device
    torch.rand(3, generator=g)  # +2: no device (on a CUDA generator: "Expected a 'cpu' device type")
    torch.rand(3, device="cpu")  # +3: not the caller's generator
    torch.empty(3, device="cpu").exponential_()  # +4: not the caller's generator
    torch.tensor([1, 2])  # +5: no device
    # fine: explicit devices, the caller's generator, *_like and new_* follow their input, tensor data kept
    x = torch.rand(3, generator=g, device=g.device)
    torch.zeros_like(x), x.new_ones(2), torch.as_tensor(x), torch.empty(3, device=x.device).exponential_(generator=g)
    torch.nn.Linear(2, 2)  # its factories are torch's own (nn.Linear.__init__), not this code's


_PLANTED_LINE = _planted.__code__.co_firstlineno + 1  # the def line, then the docstring


def test_the_guard_flags_a_planted_factory_and_nothing_else():
    g = torch.Generator().manual_seed(0)
    guard = DeviceGuard(roots=(HERE,))
    with guard:
        _planted(g)
    where = lambda offset: f"tests/test_device_safety.py:{_PLANTED_LINE + offset}"  # noqa: E731
    assert [str(v) for v in guard.violations] == [
        f"{where(1)}: torch.zeros without device=",
        f"{where(2)}: torch.rand without device=",
        f"{where(3)}: torch.rand draws without the caller's generator",
        f"{where(4)}: Tensor.exponential_ draws without the caller's generator",
        f"{where(5)}: torch.tensor without device=",
    ], guard.report()
    # the same code outside the checked folders (transformers', the tests') is not ours to flag
    outside = DeviceGuard()
    with outside:
        _planted(g)
    assert outside.violations == [] and outside.calls == 0
    # without a generator in the run, a draw from the global generator is what the caller asked for
    lenient = DeviceGuard(require_generator=False, roots=(HERE,))
    with lenient:
        _planted(g)
    assert [v.what for v in lenient.violations] == ["torch.zeros without device=", "torch.rand without device=",
                                                    "torch.tensor without device="]


def test_exempt_files_exist():
    for path in EXEMPT:
        assert (REPO / path).is_file(), path


def test_draws_are_made_on_the_generator_device_and_moved_to_the_data():
    """A CPU generator with data elsewhere ("meta" stands in for CUDA here): the values are the CPU
    generator's (its state advances exactly as a CPU draw of the same shape) and land on the data's device."""
    for draw in (uniform, normal, exponential):
        g, ref = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
        guard = DeviceGuard()
        with guard:
            out = draw((2, 3), g, "meta")
        assert out.device.type == "meta" and out.shape == (2, 3)
        draw((2, 3), ref, "cpu")
        assert torch.equal(g.get_state(), ref.get_state()), draw.__name__
        assert guard.violations == []
        assert draw((4,), None, "cpu").device.type == "cpu"  # no generator: the global one, on the data's device


# ---- models (built outside the guard: construction is not generation) ---------------------------------------


@pytest.fixture(scope="module")
def text():
    return make_text_models() | dict(judge=JudgeHead(64), prompts=ragged_prompts(2))


@pytest.fixture(scope="module")
def vision():
    out = {}
    for kind, mode in (("llava-clip", "specvlm"), ("qwen2-vl", "vispec")):
        model = make_vlm(kind)
        out[kind] = (model, tiny_head(model, mode), make_perturbed_copy(model), vlm_prompts(kind))
    return out


@pytest.fixture(scope="module")
def image():
    gpt = make_image_gpt(seed=1)
    table = latent_neighbours(torch.randn(gpt.config.codebook_size, 4, generator=torch.Generator().manual_seed(0)), 8)
    head = EagleHead(EagleConfig(hidden_size=64, draft_vocab_size=64, target_vocab_size=64, intermediate_size=128,
                                 num_attention_heads=4, num_key_value_heads=2), torch.arange(64))
    janus = make_janus(seed=1)
    return dict(gpt=gpt, draft=ModelDrafter(GuidedTarget(make_perturbed_copy(gpt, noise=0.2), 2.0)), table=table,
                head=head, janus=janus, janus_draft=ModelDrafter(GuidedTarget(make_perturbed_copy(janus), 3.0)),
                janus_prompts=janus_prompts((6, 4)))


@pytest.fixture(scope="module")
def continuous():
    torch.manual_seed(0)
    cfg = dict(image_size=4, patch=2, hidden=16, heads=2, head_width=16, head_blocks=1, steps=4, stop=50, num_classes=2)
    gmm = GaussianMixtureAR.random(seed=0)
    return dict(target=PatchAR(PatchARConfig(layers=2, **cfg)).eval(), draft=PatchAR(PatchARConfig(layers=1, **cfg)).eval(),
                eagle=PatchEagle(PatchEagleConfig(hidden=16, heads=2, token_dim=4, tokens=4)).eval(),
                gmm=gmm, gmm_draft=gmm.perturbed(0.4))


@pytest.fixture(scope="module")
def ssm():
    testing = ssm_testing
    return [(model, make_perturbed_copy(model, noise=0.1, seed=3))
            for model in (testing.make_mamba2(seed=1), testing.make_mamba(seed=1), testing.make_bamba(seed=1))]


@pytest.fixture(scope="module")
def reasoning():
    class Tok(ByteTokenizer):
        eos_token_id = 2

    base, small = make_target("llama", seed=11, vocab=256, layers=2), make_target("llama", seed=12, vocab=256, layers=1)
    experts = {f"e{i}": TextExpert(make_target("llama", seed=20 + i, vocab=256, layers=1), Tok(), max_new_tokens=4)
               for i in range(2)}
    return dict(base=base, small=small, tok=Tok(), experts=experts,
                verdict=LikelihoodVerdict(TextExpert(base, Tok(), max_new_tokens=4)))


# ---- every modality's generation ----------------------------------------------------------------------------


def _text_model(m, g):
    ids, mask = m["prompts"]
    sample = dict(sampling=SamplingConfig(do_sample=True), generator=g, max_new_tokens=4)
    speculative_generate(m["target"], m["draft"], ids, attention_mask=mask, tree=3, max_new_tokens=4, generator=g,
                         sampling=SamplingConfig(do_sample=True, top_k=20, top_p=0.9))
    speculative_generate(m["gemma"], m["gemma_draft"], ids, attention_mask=mask, tree=DynamicTree(3, 2, 5), **sample)
    # transformers' own forwards, greedy on a static tree (the kernels' reference tree walk)
    speculative_generate(HFCausalLM(m["target"]), ModelDrafter(HFCausalLM(m["draft"])), ids, attention_mask=mask,
                         max_new_tokens=4,
                         tree=StaticTree.full([2, 2]), generator=g)


def _text_drafters(m, g):
    ids, mask = m["prompts"]
    sample = dict(sampling=SamplingConfig(do_sample=True), generator=g, max_new_tokens=4)
    t = m["target"]
    speculative_generate(t, EagleDrafter(m["head"], t), ids, attention_mask=mask, tree=DynamicTree(3, 2, 5), **sample)
    speculative_generate(t, "ngram", ids, attention_mask=mask, **sample)
    speculative_generate(t, TokenRecyclingDrafter(), ids, attention_mask=mask, tree=StaticTree.full([2, 2]), **sample)
    speculative_generate(t, SuffixDecodingDrafter(), ids, attention_mask=mask, **sample)
    speculative_generate(t, HybridDrafter(m["draft"]), ids, attention_mask=mask, **sample)
    speculative_generate(t, m["draft"], ids, attention_mask=mask, rule=Judge(m["judge"]), **sample)
    same = lambda prompt: prompt  # noqa: E731 - a guided target whose unconditional prompt is the prompt
    speculative_generate(GuidedTarget(t, 2.0, unconditional=same),
                         ModelDrafter(GuidedTarget(m["draft"], 2.0, unconditional=same)), ids, attention_mask=mask,
                         **sample)


def _text_session(m, g):
    ids, mask = m["prompts"]
    s = Session(m["target"], m["draft"], tree=3, generator=g, sampling=SamplingConfig(do_sample=True))
    s.append(ids[:1], mask[:1])
    s.generate(4)
    mark = s.checkpoint()
    s.score(torch.tensor([[5, 6]]))
    s.append(torch.tensor([[7, 8]]))
    s.rollback(mark)
    s.generate(3, stop=[[3]])


def _vision(m, g):
    for model, head, draft, inputs in m.values():
        sample = dict(sampling=SamplingConfig(do_sample=True), generator=g, max_new_tokens=4)
        speculative_generate(model, VisionEagleDrafter(head, model), tree=DynamicTree(3, 2, 5), **sample, **inputs)
        speculative_generate(model, draft, **sample, **inputs)


def _image(m, g):
    gpt, sample = m["gpt"], dict(sampling=SamplingConfig(do_sample=True), generator=g, guidance_scale=2.0)
    generate_ar(gpt, [0, 1], **(sample | dict(sampling=SamplingConfig(do_sample=True, top_k=20))))
    generate_images(gpt, [0, 1], **sample)  # no drafter: plain decoding through the loop (n-gram, no drafts)
    generate_images(gpt, [0, 1], drafter=m["draft"], tree=DynamicTree(3, 2, 5), **sample)
    generate_images(gpt, [0, 1], drafter=m["draft"], rule=Relaxed(m["table"], delta=0.2), tree=DynamicTree(3, 2, 5),
                    **sample)
    generate_images(gpt, [0, 1], drafter=m["draft"], rule=Relaxed(m["table"], delta=0.2), tree=3, **sample)
    generate_images(gpt, [2, 3], drafter=EagleDrafter(m["head"], gpt), **sample)
    ids, mask = m["janus_prompts"]
    speculative_generate(GuidedTarget(m["janus"], 2.0), m["janus_draft"], ids, attention_mask=mask,
                         max_new_tokens=NUM_IMAGE_TOKENS,
                         tree=3, sampling=SamplingConfig(do_sample=True), generator=g)


def _continuous(m, g):
    labels, spec = torch.tensor([0, 1]), dict(tree=2, prefill=0.25, generator=g)
    generate_continuous(m["target"], labels, generator=g)
    generate_continuous(m["target"], labels, m["draft"], **spec)
    generate_continuous(m["target"], labels, m["draft"], rule=TrajectoryRatio(relax=3.0, bonus=True), **spec)
    generate_continuous(m["target"], labels, m["eagle"], **spec)
    generate_continuous(m["target"], labels, m["eagle"], sampling=HeadSampling(guidance_scale=None), **spec)
    continuous_generate(GMMTarget(m["gmm"]), GMMDrafter(m["gmm_draft"]), torch.zeros(3, 1, 2), 4, k=3, generator=g)


def _ssm(m, g):
    ids = torch.tensor([[5, 17, 42, 9, 77], [0, 0, 3, 4, 5]])
    for model, draft in m:  # STree: tree drafts verified with tree scans
        speculative_generate(model, draft, ids, attention_mask=(ids > 0).long(), max_new_tokens=3,
                             tree=DynamicTree(2, 3, 6), generator=g, sampling=SamplingConfig(do_sample=True))


def _reasoning(m, g):
    """The step-level methods decode greedily; the writers they share also sample (from the generator)."""
    base, small, tok, prompt = m["base"], m["small"], m["tok"], list(range(40, 48))
    config = SpecReasonConfig(threshold=5.0, separator="a", max_step_tokens=3, token_budget=6, markers=(),
                              stop_on_repeat=False)
    SpecReason(small, base, tok, "likelihood", config, base_drafter=ModelDrafter(small), base_tree=3).run(prompt)
    SpecReason(small, base, tok, "prompt", config).run(prompt)
    SpeculativeThinking(small, base, tok, SpeculativeThinkingConfig(token_budget=6)).run(prompt)
    SpeculativeVerdict(m["experts"], m["verdict"], k=2).run("2 + 3?")
    for drafter in (None, ModelDrafter(small)):
        writer = Writer.open(base, drafter, 3, eos_token_id=2, sampling=SamplingConfig(do_sample=True), generator=g)
        writer.start(prompt)
        writer.write(3)


CASES = {"text-models": ("text", _text_model), "text-drafters": ("text", _text_drafters),
         "text-session": ("text", _text_session), "vision": ("vision", _vision), "image-ar": ("image", _image),
         "continuous": ("continuous", _continuous), "ssm": ("ssm", _ssm), "reasoning": ("reasoning", _reasoning)}
# sampling with the caller's generator (every draw must come from it), and with none (the global generator:
# the draws' other branch); the reasoning methods decode greedily, so one run covers them
RUNS = [(case, "generator") for case in CASES] + [(case, "none") for case in CASES if case != "reasoning"]


@pytest.mark.parametrize("case,generator", RUNS)
def test_generation_is_device_safe(request, case, generator):
    fixture, run = CASES[case]
    models = request.getfixturevalue(fixture)
    guard = _guarded(lambda g: run(models, g), torch.Generator().manual_seed(0) if generator == "generator" else None)
    assert guard.calls > 0  # the guard saw the project's calls
    assert guard.violations == [], f"{case}:\n{guard.report()}"
