"""The class-conditional image GPT through the core, on tiny random models: greedy speculative output with
guidance equals the independent plain AR loop (`generate_ar`), sampled first tokens follow the guided,
top-k-filtered law (negative control: the unguided law), LANTERN with delta = 0 is Exact token for
token on whole images and with delta > 0 accepts more while reporting TVD <= delta; the pieces save and
load with `from_pretrained`."""

import pytest
import torch

from multispec import DynamicTree, EngineConfig, StaticTree, StoppingConfig, speculative_generate
from multispec.drafters import ModelDrafter
from multispec.image_ar import (VQVAE, ClassConditionalGPT, ImageGPTTarget, Relaxed, generate_ar, generate_images,
                                latent_neighbours)
from multispec.image_ar.testing import make_image_gpt, make_janus
from multispec.sampling import SamplingConfig
from multispec.targets import GuidedTarget, as_target
from multispec.targets.static import generic_static_unsupported
from multispec.testing import chi_square_pvalue, make_perturbed_copy

SCALE = 2.5
LABELS = [0, 3, 1]


@pytest.fixture(scope="module")
def gpt():
    return make_image_gpt(seed=1)


def _draft(model, noise=0.05, scale=SCALE):
    return ModelDrafter(GuidedTarget(make_perturbed_copy(model, noise=noise), scale))


@pytest.mark.parametrize("tree", [None, 3, StaticTree([[0], [1], [0, 0], [0, 0, 0]]), DynamicTree(3, 2, 5)])
def test_greedy_guided_speculation_equals_plain_ar(gpt, tree):
    assert isinstance(as_target(gpt), ImageGPTTarget)
    want = generate_ar(gpt, LABELS, guidance_scale=SCALE, sampling=SamplingConfig())
    got = generate_images(gpt, LABELS, drafter=_draft(gpt), tree=tree, guidance_scale=SCALE, sampling=SamplingConfig())
    assert torch.equal(got.codes, want.codes)
    assert got.stats.mean_accepted_length >= 1.5, got.stats
    assert got.accepted.shape == got.codes.shape and bool(got.accepted.any())
    # no drafter: one token per step
    plain = generate_images(gpt, LABELS, guidance_scale=SCALE, sampling=SamplingConfig())
    assert torch.equal(plain.codes, want.codes) and plain.stats.mean_accepted_length == 1.0


N = 4000


def _first_token_law(model, label, scale, sampling):
    prompt = model.class_tokens([label])
    with torch.no_grad():
        cond = model(input_ids=prompt).logits[0, -1]
        uncond = model(input_ids=model.unconditional_tokens(prompt)).logits[0, -1]
    return sampling.probs(uncond + scale * (cond - uncond)).double()


@pytest.mark.slow
def test_sampled_first_token_follows_the_guided_top_k_law():
    """Power (`detectable_deviation(4000, p, 24)`, level 1e-3, 90%): a 0.10 token moved by 3.8 points. The
    negative control (the unguided law under the same top-k) differs by TV 0.2 and fails."""
    model = make_image_gpt(seed=2, head_scale=6.0)
    sampling = SamplingConfig(do_sample=True, top_k=24)
    out = generate_images(model, [2] * N, drafter=_draft(model, noise=0.3), tree=2, guidance_scale=SCALE,
                          sampling=SamplingConfig(do_sample=True, top_k=24), generator=torch.Generator().manual_seed(0))
    first = out.codes[:, 0]
    assert out.stats.steps[0].accepted > N // 10
    assert chi_square_pvalue(first, _first_token_law(model, 2, SCALE, sampling)) > 1e-3
    assert chi_square_pvalue(first, _first_token_law(model, 2, 1.0, sampling)) < 1e-6


def test_lantern_zero_delta_is_exact_and_positive_delta_accepts_more(gpt):
    table = latent_neighbours(torch.randn(gpt.config.codebook_size, 4, generator=torch.Generator().manual_seed(0)), 8)
    kw = dict(drafter=_draft(gpt, noise=0.2), tree=DynamicTree(3, 3, 6), guidance_scale=SCALE,
              sampling=SamplingConfig(do_sample=True, top_k=40))
    labels = [0, 1, 2, 3] * 4
    exact = generate_images(gpt, labels, generator=torch.Generator().manual_seed(3), **kw)
    zero = generate_images(gpt, labels, rule=Relaxed(table, delta=0.0), generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(zero.codes, exact.codes) and zero.max_tvd == 0.0
    relaxed = generate_images(gpt, labels, rule=Relaxed(table, delta=0.3), generator=torch.Generator().manual_seed(3), **kw)
    assert 0.0 < relaxed.max_tvd <= 0.3 + 1e-6
    assert relaxed.stats.mean_accepted_length > exact.stats.mean_accepted_length


def test_save_and_load_roundtrip(tmp_path, gpt):
    gpt.save_pretrained(tmp_path / "gpt")
    again = ClassConditionalGPT.from_pretrained(tmp_path / "gpt").eval()
    ids = torch.cat([gpt.class_tokens([1]), torch.randint(0, gpt.config.codebook_size, (1, 5))], dim=1)
    with torch.no_grad():
        assert torch.allclose(again(input_ids=ids).logits, gpt(input_ids=ids).logits)
    assert again.lm_head.weight.shape[0] == gpt.config.codebook_size  # codes only: no class token is emitted
    vq = VQVAE(codebook_size=32, embed_dim=4, channels=16).eval()
    vq.save_pretrained(tmp_path / "vq")
    vq2 = VQVAE.from_pretrained(tmp_path / "vq").eval()
    images = torch.rand(2, 1, 28, 28)
    assert torch.equal(vq2.encode(images), vq.encode(images))
    assert vq2.decode(vq.encode(images)).shape == (2, 1, 28, 28)


def test_bad_inputs_are_named(gpt):
    with pytest.raises(ValueError, match="labels"):
        gpt.class_tokens([0, 9])
    with pytest.raises(ValueError, match="labels"):
        generate_images(gpt, [])
    with pytest.raises(TypeError, match="target"):
        generate_images(torch.nn.Linear(2, 2), [0])
    vq = VQVAE(codebook_size=32, embed_dim=4, channels=16)
    with pytest.raises(ValueError, match="images"):
        vq.encode(torch.rand(2, 3, 28, 28))
    with pytest.raises(ValueError, match="codes"):
        vq.decode(torch.full((1, 49), 40))


def test_static_step_with_guidance_equals_plain_guided_ar():
    """`step="static"` through `GuidedTarget`: the guided model's fixed-shape engine (the image adapter with
    the lean static step mixed in) runs both halves; guided greedy codes equal plain guided AR, drafts accepted.
    (Janus on the static step: tests/image_ar/test_janus.py.)"""
    gpt = make_image_gpt(seed=2)
    labels = torch.tensor([0, 1, 3])
    want = generate_ar(gpt, labels, guidance_scale=2.0, sampling=SamplingConfig()).codes
    ids = gpt.class_tokens(labels)
    draft = ModelDrafter(GuidedTarget(make_perturbed_copy(gpt, noise=0.05), 2.0))
    out = speculative_generate(GuidedTarget(gpt, 2.0), draft, ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=gpt.config.num_image_tokens, tree=3, stopping=StoppingConfig.never(),
                               engine=EngineConfig(step="static"))
    assert torch.equal(out.sequences[:, ids.shape[1]:], want)
    assert out.stats.mean_accepted_length > 1.5
    (engine,) = gpt._multispec_static_engines.values()
    assert type(engine).__name__ == "StaticImageGPTTarget" and engine.static_calls > 0
    assert generic_static_unsupported(make_janus()) is None
