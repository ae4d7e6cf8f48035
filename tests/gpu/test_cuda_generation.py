"""Every modality's generation with the model on CUDA, driven by a CPU generator, a CUDA generator or none,
with the prompts (ids, class labels, images) handed over on the CPU, as users hand them (the API moves them
to the model). Lossless paths (greedy) equal the model's own `generate` / plain AR decoding token for token;
sampled paths run, stay in the vocabulary, and a seeded generator reproduces its run; continuous paths give
finite outputs of the right shape. Tiny models: the file runs in well under two minutes on an H100.

The CPU twin is tests/test_device_safety.py (it finds the same bugs without a GPU). To debug this file
itself on a machine without one: `MULTISPEC_GPU_TEST_DEVICE=cpu python -m pytest --noconftest
tests/gpu/test_cuda_generation.py` (the "device" generator is then a CPU one)."""

from __future__ import annotations

import os

import pytest
import torch

from multispec import (DynamicTree, HybridDrafter, SamplingConfig, Session, StaticTree, StoppingConfig,
                       SuffixDecodingDrafter, TokenRecyclingDrafter, speculative_generate)
from multispec.continuous import continuous_generate
from multispec.drafters import ModelDrafter
from multispec.drafters.eagle import EagleDrafter
from multispec.gmm_ar import GaussianMixtureAR, GMMDrafter, GMMTarget
from multispec.image_ar import (HeadSampling, PatchAR, PatchARConfig, PatchEagle, PatchEagleConfig, Relaxed,
                                TrajectoryRatio,
                                generate_ar, generate_continuous, generate_images, latent_neighbours)
from multispec.image_ar.testing import NUM_IMAGE_TOKENS, janus_prompts, make_image_gpt, make_janus
from multispec.reasoning import (LikelihoodVerdict, SpecReason, SpecReasonConfig, SpeculativeThinking,
                                 SpeculativeThinkingConfig, SpeculativeVerdict, TextExpert, Triggers, Writer)
from multispec.ssm import testing as ssm_testing
from multispec.ssm.versions import SSM_TRANSFORMERS
from multispec.targets import GuidedTarget
from multispec.testing import make_text_models, greedy_rows_alone, make_perturbed_copy, make_target, ragged_prompts
from multispec.vision import VisionEagleDrafter
from multispec.vision.testing import forbid_special_tokens, make_vlm, row_of, tiny_head, vlm_prompts
from multispec.versions import DependencyVersionError, installed_version, satisfies
from multispec.zoo.bytes_lm import ByteTokenizer

DEVICE = torch.device(os.environ.get("MULTISPEC_GPU_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")

GENERATORS = ("cpu", "device", "none")


def _generator(kind: str, seed: int = 0) -> torch.Generator | None:
    if kind == "none":
        return None
    return torch.Generator(device="cpu" if kind == "cpu" else DEVICE).manual_seed(seed)


def _on(model):
    return model.to(DEVICE).eval()


@pytest.fixture(scope="module", autouse=True)
def exact_matmuls():
    """fp32 matrix products without TF32, so speculative and plain decoding see the same argmax."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# ---- text ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text():
    return {name: _on(model) for name, model in make_text_models().items()}


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_text_greedy_equals_generate(text, kind):
    target = text["target" if kind == "llama" else "gemma"]
    draft = text["draft" if kind == "llama" else "gemma_draft"]
    ids, mask = ragged_prompts(3)  # on the CPU
    want = greedy_rows_alone(target, ids.to(DEVICE), mask.to(DEVICE), 12).cpu()
    drafters = [(draft, 3), (draft, DynamicTree(3, 2, 6)), (draft, StaticTree.full([2, 2]))]
    if kind == "llama":  # an EAGLE head (untrained: few drafts accepted, but lossless all the same)
        drafters.append((EagleDrafter(text["head"], target), DynamicTree(3, 2, 6)))
    for drafter, tree in drafters:
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=12, tree=tree,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences[:, -12:].cpu(), want), (kind, type(drafter).__name__, tree)
    # prompts already on the model's device work the same
    out = speculative_generate(target, draft, ids.to(DEVICE), attention_mask=mask.to(DEVICE), max_new_tokens=12,
                               stopping=StoppingConfig.never())
    assert out.sequences.device.type == DEVICE.type and torch.equal(out.sequences[:, -12:].cpu(), want)


@pytest.mark.parametrize("generator", GENERATORS)
def test_text_sampling_with_every_drafter(text, generator):
    t, d = text["target"], text["draft"]
    ids, mask = ragged_prompts(2)
    # fresh drafters per run (Token Recycling and SuffixDecoding learn across generations)
    drafters = {"model": (lambda: d, DynamicTree(3, 2, 6)),
                "eagle": (lambda: EagleDrafter(text["head"], t), DynamicTree(3, 2, 6)), "ngram": (lambda: "ngram", 3),
                "recycling": (TokenRecyclingDrafter, StaticTree.full([2, 2])), "suffix": (SuffixDecodingDrafter, 3),
                "hybrid": (lambda: HybridDrafter(d), 3)}
    for name, (drafter, tree) in drafters.items():
        runs = []
        for _ in range(2 if generator != "none" else 1):
            out = speculative_generate(t, drafter(), ids, attention_mask=mask, max_new_tokens=6, tree=tree,
                                       generator=_generator(generator),
                                       sampling=SamplingConfig(do_sample=True, top_k=30, top_p=0.95),
                                       stopping=StoppingConfig.never())
            assert out.sequences.shape == (2, ids.shape[1] + 6), name
            assert int(out.sequences.max()) < 128, name
            runs.append(out.sequences.cpu())
        assert all(torch.equal(r, runs[0]) for r in runs), name  # a seeded generator reproduces the run
    out = speculative_generate(text["gemma"], text["gemma_draft"], ids, attention_mask=mask, max_new_tokens=6,
                               generator=_generator(generator),
                               sampling=SamplingConfig(do_sample=True))
    assert out.sequences.shape[0] == 2


@pytest.mark.parametrize("generator", GENERATORS)
def test_session_and_guidance(text, generator):
    t, d = text["target"], text["draft"]
    ids, mask = ragged_prompts(2)
    s = Session(t, d, tree=3, generator=_generator(generator), sampling=SamplingConfig(do_sample=True))
    s.append(ids[:1], mask[:1])
    s.generate(4)
    mark = s.checkpoint()
    assert s.score(torch.tensor([[5, 6]])).logprobs.shape == (1, 2)
    s.append(torch.tensor([[7, 8]]))
    s.rollback(mark)
    s.generate(3, stop=[[3]])
    same = lambda prompt: prompt  # noqa: E731
    out = speculative_generate(GuidedTarget(t, 2.0, unconditional=same),
                               ModelDrafter(GuidedTarget(d, 2.0, unconditional=same)), ids, attention_mask=mask,
                               max_new_tokens=5,
                               generator=_generator(generator), sampling=SamplingConfig(do_sample=True))
    assert out.sequences.shape == (2, ids.shape[1] + 5)


# ---- vision -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vision():
    out = {}
    for kind, mode in (("llava-clip", "specvlm"), ("qwen2-vl", "vispec"), ("paligemma", "eagle")):
        model = forbid_special_tokens(make_vlm(kind, seed=1))
        out[kind] = (_on(model), tiny_head(model, mode).to(DEVICE), _on(make_perturbed_copy(model, noise=0.05)))
    return out


@pytest.mark.parametrize("kind", ["llava-clip", "qwen2-vl", "paligemma"])
def test_vlm_greedy_equals_generate(vision, kind):
    model, head, draft = vision[kind]
    inputs = row_of(vlm_prompts(kind), 1)  # on the CPU
    with torch.no_grad():
        want = model.generate(**{k: v.to(DEVICE) for k, v in inputs.items()}, max_new_tokens=8, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, -8:].cpu()
    for drafter, tree in ((draft, 3), (VisionEagleDrafter(head, model), DynamicTree(3, 2, 6))):
        out = speculative_generate(model, drafter, max_new_tokens=8, tree=tree, **inputs,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences[0, -8:].cpu(), want), (kind, type(drafter).__name__)


@pytest.mark.parametrize("generator", GENERATORS)
def test_vlm_sampling(vision, generator):
    for kind, (model, head, draft) in vision.items():
        inputs = vlm_prompts(kind)
        for drafter in (draft, VisionEagleDrafter(head, model)):
            out = speculative_generate(model, drafter, max_new_tokens=5, sampling=SamplingConfig(do_sample=True),
                                       stopping=StoppingConfig.never(),
                                       generator=_generator(generator), **inputs)
            assert out.sequences.shape == (3, inputs["input_ids"].shape[1] + 5), kind


# ---- image AR (discrete) ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image():
    gpt = make_image_gpt(seed=1)
    table = latent_neighbours(torch.randn(gpt.config.codebook_size, 4, generator=torch.Generator().manual_seed(0)), 8)
    return dict(gpt=_on(gpt), draft=ModelDrafter(GuidedTarget(_on(make_perturbed_copy(gpt, noise=0.05)), 2.0)),
                table=table.to(DEVICE), janus=_on(make_janus(seed=1)))


def test_image_greedy_equals_plain_ar(image):
    gpt = image["gpt"]
    labels = [0, 3, 1]  # a list: the API builds the class tokens on the model's device
    want = generate_ar(gpt, labels, guidance_scale=2.5, sampling=SamplingConfig()).codes.cpu()
    plain = generate_images(gpt, labels, guidance_scale=2.5, sampling=SamplingConfig())  # no drafter: the n-gram loop
    assert torch.equal(plain.codes.cpu(), want)
    for rule in (None, Relaxed(image["table"], delta=0.0)):  # LANTERN at delta 0 is exact
        out = generate_images(gpt, torch.tensor(labels), drafter=image["draft"], rule=rule, tree=DynamicTree(3, 2, 5),
                              guidance_scale=2.5, sampling=SamplingConfig())
        assert torch.equal(out.codes.cpu(), want)


@pytest.mark.parametrize("generator", GENERATORS)
def test_image_sampling(image, generator):
    gpt, labels, n = image["gpt"], [0, 1, 2], image["gpt"].config.num_image_tokens
    runs = [generate_ar(gpt, labels, guidance_scale=2.0, sampling=SamplingConfig(do_sample=True, top_k=20),
                        generator=_generator(generator)),
            generate_images(gpt, labels, guidance_scale=2.0, generator=_generator(generator))]
    for rule, tree in ((None, DynamicTree(3, 2, 5)), (Relaxed(image["table"], delta=0.2), DynamicTree(3, 2, 5)),
                       (Relaxed(image["table"], delta=0.2), 3)):
        first = generate_images(gpt, labels, drafter=image["draft"], rule=rule, tree=tree, guidance_scale=2.0,
                                sampling=SamplingConfig(do_sample=True, top_k=40), generator=_generator(generator))
        runs.append(first)
        if generator != "none":  # seeded: the same images again
            again = generate_images(gpt, labels, drafter=image["draft"], rule=rule, tree=tree, guidance_scale=2.0,
                                    sampling=SamplingConfig(do_sample=True, top_k=40), generator=_generator(generator))
            assert torch.equal(first.codes.cpu(), again.codes.cpu())
    for out in runs:
        assert out.codes.shape == (3, n) and int(out.codes.max()) < gpt.config.codebook_size


def test_janus_greedy_equals_its_generate(image):
    janus = image["janus"]
    ids, mask = janus_prompts((6,))
    draft = ModelDrafter(GuidedTarget(_on(make_perturbed_copy(janus, noise=0.05)), 3.0))
    out = speculative_generate(GuidedTarget(janus, 3.0), draft, ids, attention_mask=mask,
                               max_new_tokens=NUM_IMAGE_TOKENS, tree=3)
    with torch.no_grad():
        want = janus.generate(ids.to(DEVICE), attention_mask=mask.to(DEVICE), generation_mode="image",
                              do_sample=False, guidance_scale=3.0)
    assert torch.equal(out.sequences[0, -NUM_IMAGE_TOKENS:].cpu(), want[0].cpu())
    for generator in GENERATORS:
        out = speculative_generate(GuidedTarget(janus, 3.0), draft, ids, attention_mask=mask,
                                   max_new_tokens=NUM_IMAGE_TOKENS, tree=3,
                                   sampling=SamplingConfig(do_sample=True), generator=_generator(generator))
        assert out.sequences.shape == (1, ids.shape[1] + NUM_IMAGE_TOKENS)


# ---- image AR (continuous tokens) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def continuous():
    torch.manual_seed(0)
    cfg = dict(image_size=4, patch=2, hidden=16, heads=2, head_width=16, head_blocks=1, steps=4, stop=50, num_classes=2)
    gmm = GaussianMixtureAR.random(seed=0)
    return dict(target=_on(PatchAR(PatchARConfig(layers=2, **cfg))), draft=_on(PatchAR(PatchARConfig(layers=1, **cfg))),
                eagle=_on(PatchEagle(PatchEagleConfig(hidden=16, heads=2, token_dim=4, tokens=4))),
                gmm=gmm.to(DEVICE), gmm_draft=gmm.perturbed(0.4).to(DEVICE))


@pytest.mark.parametrize("generator", GENERATORS)
def test_continuous_speculation(continuous, generator):
    target, labels = continuous["target"], torch.tensor([0, 1, 1])  # labels on the CPU
    c = target.config
    runs = {"plain": dict(draft=None), "exact": dict(draft=continuous["draft"]),
            "relaxed": dict(draft=continuous["draft"], rule=TrajectoryRatio(relax=3.0, bonus=True)),
            "eagle": dict(draft=continuous["eagle"]),
            "eagle-unguided": dict(draft=continuous["eagle"], sampling=HeadSampling(guidance_scale=None))}
    for name, kw in runs.items():
        out = generate_continuous(target, labels, tree=2, prefill=0.25, generator=_generator(generator), **kw)
        assert out.tokens.shape == (3, c.tokens, c.token_dim), name
        assert out.trajectories.shape == (3, c.tokens, c.steps, c.token_dim), name
        assert out.images.shape == (3, c.image_size, c.image_size), name
        for t in (out.tokens, out.trajectories, out.images):
            assert bool(torch.isfinite(t).all()), name
        if kw["draft"] is not None:
            assert out.drafted > 0, name
        if generator != "none":
            again = generate_continuous(target, labels, tree=2, prefill=0.25, generator=_generator(generator), **kw)
            assert torch.equal(out.tokens, again.tokens), name
    out = continuous_generate(GMMTarget(continuous["gmm"]), GMMDrafter(continuous["gmm_draft"]),
                              torch.zeros(3, 1, 2, device=DEVICE), 4, k=3, generator=_generator(generator))
    assert out.values.shape == (3, 5, 2) and bool(torch.isfinite(out.values).all())


# ---- state-space models (STree) -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ssm():
    testing = ssm_testing
    return {name: _on(make(seed=1)) for name, make in (("mamba2", testing.make_mamba2), ("mamba", testing.make_mamba),
                                                        ("bamba", testing.make_bamba), ("zamba2", testing.make_zamba2),
                                                        ("qwen3_next", testing.make_qwen3_next))}


@pytest.mark.parametrize("kind", ["mamba2", "mamba", "bamba", "zamba2", "qwen3_next"])
def test_ssm_greedy_equals_generate_and_samples(ssm, kind):
    model = ssm[kind]
    draft = _on(make_perturbed_copy(model, noise=0.05, seed=3))
    ids, mask = ragged_prompts(2, seed=7)
    if not satisfies(installed_version("transformers"), SSM_TRANSFORMERS.minimum):
        # a GPU image with an older transformers: the SSM path must refuse clearly, naming the version
        with pytest.raises(DependencyVersionError, match=f"transformers>={SSM_TRANSFORMERS.minimum}"):
            speculative_generate(model, draft, ids, attention_mask=mask, max_new_tokens=2, tree=3,
                                 stopping=StoppingConfig.never())
        return
    want = greedy_rows_alone(model, ids.to(DEVICE), mask.to(DEVICE), 10).cpu()
    for tree in (3, DynamicTree(2, 3, 6)):
        out = speculative_generate(model, draft, ids, attention_mask=mask, max_new_tokens=10, tree=tree,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences[:, -10:].cpu(), want), (kind, tree)
        assert out.stats.mean_accepted_length > 1.5, (kind, tree)  # a close draft: drafts were accepted
    for generator in GENERATORS:
        out = speculative_generate(model, draft, ids, attention_mask=mask, max_new_tokens=5, tree=DynamicTree(2, 3, 6),
                                   generator=_generator(generator), sampling=SamplingConfig(do_sample=True),
                                   stopping=StoppingConfig.never())
        assert out.sequences.shape == (2, ids.shape[1] + 5)


# ---- reasoning ----------------------------------------------------------------------------------------------


class _Tok(ByteTokenizer):
    eos_token_id = 2  # make_target's EOS


@pytest.fixture(scope="module")
def reasoning():
    return _on(make_target("llama", seed=11, vocab=256, layers=3)), _on(make_target("llama", seed=12, vocab=256, layers=1))


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=DEVICE)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=2)
    return out[0, len(prompt):].tolist()


def test_reasoning_methods(reasoning):
    base, small = reasoning
    tok, prompt, budget = _Tok(), list(range(40, 52)), 24
    ref = _greedy(base, prompt, budget)
    sep = max(set(t for t in ref if t < 128), key=ref.count)  # a separator the base writes
    config = SpecReasonConfig(threshold=10.0, separator=chr(sep), max_step_tokens=9, token_budget=budget, markers=(),
                              stop_on_repeat=False)
    for drafter in (None, ModelDrafter(small)):  # above 9 every step is the base's: its own greedy text
        out = SpecReason(small, base, tok, "likelihood", config, base_drafter=drafter, base_tree=3).run(prompt)
        assert out.tokens == ref[: len(out.tokens)] and len(out.tokens) >= budget - 1
    small_ref = _greedy(small, prompt, budget)
    small_sep = max(set(t for t in small_ref if t < 128), key=small_ref.count)
    thinking = SpeculativeThinkingConfig(separator=chr(small_sep), triggers=Triggers.never(), lookahead_tokens=5,
                                         token_budget=budget, markers=(), stop_on_repeat=False)
    out = SpeculativeThinking(small, base, tok, thinking).run(prompt)
    assert out.tokens == small_ref[: len(out.tokens)]
    experts = {"base": TextExpert(base, tok, max_new_tokens=6), "small": TextExpert(small, tok, max_new_tokens=6)}
    verdict = SpeculativeVerdict(experts, LikelihoodVerdict(experts["base"]), k=2).run("2 + 3?")
    assert set(verdict.chosen) == {"base", "small"}
    for generator in GENERATORS:  # the writers the methods share, sampling
        for drafter in (None, ModelDrafter(small)):
            writer = Writer.open(base, drafter, 3, eos_token_id=2, sampling=SamplingConfig(do_sample=True),
                                 generator=_generator(generator))
            writer.start(prompt)
            assert len(writer.write(4)) >= 1
