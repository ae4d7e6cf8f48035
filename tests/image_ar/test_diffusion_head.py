"""The diffusion head's pieces: the hand-written reverse step is `diffusers`' DDPMScheduler.step (cosine
betas, clip_sample=False) at temperature 1; the temperature scales only the noise; batched means along a
trajectory equal the ones met while sampling it; the trajectory log-density is the sum of its Gaussians;
the patch transformer's cache (scored without committing, then committed) gives the full forward's
outputs; patchify / unpatchify invert each other."""

import pytest
import torch

from multispec.image_ar.continuous.diffusion_head import Trajectory, schedule_scheduler
from multispec.image_ar.continuous.head_sampler import HeadSampler
from multispec.image_ar.continuous.patch_ar import PatchAR, PatchARConfig, patchify, unpatchify


def tiny(layers=2, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(image_size=4, patch=2, hidden=32, heads=2, head_width=32, head_blocks=2, steps=6, stop=40) | kw
    m = PatchAR(PatchARConfig(layers=layers, **cfg))
    with torch.no_grad():  # the zero-initialised adaLN and output layers made random, so ε depends on x, t, z
        for lin in ((m.head.ada, m.head.out) if cfg.get("head_kind", "adaln") == "adaln" else (m.head.out,)):
            lin.weight.normal_(0, 0.5 / lin.weight.shape[1] ** 0.5)
    return m.eval()


HEADS = pytest.mark.parametrize("head_kind", ["adaln", "lean"])


@pytest.mark.parametrize("steps,stop", [(6, 40), (10, 0), (3, 200)])
def test_step_is_diffusers_ddpm_step(steps, stop):
    traj = Trajectory.make(steps, stop)
    scheduler = schedule_scheduler()
    scheduler.set_timesteps(timesteps=traj.timesteps.tolist())
    g = torch.Generator().manual_seed(0)
    x, eps = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    for i in range(steps - 1):
        want = scheduler.step(eps, int(traj.timesteps[i]), x, generator=torch.Generator().manual_seed(i)).prev_sample
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(i))
        got = traj.mean(x, eps, i) + traj.std[i] * noise
        assert torch.allclose(got, want, atol=1e-5), i
    # the deterministic last step is the scheduler's too: x̂0
    last = scheduler.step(eps, int(traj.timesteps[-1]), x).prev_sample
    assert torch.allclose(traj.x0(x, eps, steps - 1), last, atol=1e-5)


def test_temperature_scales_only_the_noise():
    traj = Trajectory.make(6, 40)
    hot = traj.with_temperature(1.5)
    assert torch.allclose(hot.transition_std(), 1.5 * traj.transition_std())
    x, eps = torch.randn(3, 4), torch.randn(3, 4)
    assert torch.equal(hot.mean(x, eps, 2), traj.mean(x, eps, 2))


@pytest.mark.parametrize("kw,match", [(dict(steps=1, stop=0), "steps"), (dict(steps=5, stop=900), "stop"),
                                      (dict(steps=5, stop=10, temperature=0.0), "temperature")])
def test_bad_grids_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        Trajectory.make(**kw)


@HEADS
@pytest.mark.parametrize("guidance", [None, 2.5])
def test_batched_means_and_log_density(guidance, head_kind):
    model = tiny(head_kind=head_kind)
    sampler = HeadSampler(model, Trajectory.make(6, 40, temperature=0.9), guidance)
    z = torch.randn(2, 4, 32)
    cond = sampler.conditions(z[0], z[1])
    states, means = sampler.sample(cond, sampler.noise(4, torch.Generator().manual_seed(1)))
    again, readout = sampler.means(cond, states)
    assert torch.allclose(again, means, atol=1e-5)
    assert torch.allclose(readout, sampler.readout(cond, states[:, -1]), atol=1e-5)
    std = sampler.std[None, :, None]
    want = (torch.distributions.Normal(0.0, 1.0).log_prob(states[:, 0]).sum(-1)
            + torch.distributions.Normal(means, std).log_prob(states[:, 1:]).sum((1, 2)))
    assert torch.allclose(sampler.log_density(states, means), want, atol=1e-4)


@HEADS
def test_guidance_combines_the_halves(head_kind):
    model = tiny(head_kind=head_kind)
    traj = Trajectory.make(6, 40)
    guided, plain = HeadSampler(model, traj, 3.0), HeadSampler(model, traj, None)
    zc, zu = torch.randn(3, 32), torch.randn(3, 32)
    x = torch.randn(3, 4)
    e_c = plain.eps(plain.conditions(zc, None), x, 1)
    e_u = plain.eps(plain.conditions(zu, None), x, 1)
    assert torch.allclose(guided.eps(guided.conditions(zc, zu), x, 1), e_u + 3.0 * (e_c - e_u), atol=1e-5)


@HEADS
def test_sampler_noise_prediction_is_the_heads_forward(head_kind):
    """`HeadSampler` runs the head through precomputed time features and condition projections; the
    noise prediction is the module's own forward."""
    model = tiny(head_kind=head_kind)
    sampler = HeadSampler(model, Trajectory.make(6, 40), None)
    z, x = torch.randn(5, 32), torch.randn(5, 4)
    steps = torch.tensor([0, 1, 2, 4, 5])
    want = model.head(x, sampler.trajectory.timesteps[steps], z)
    assert torch.allclose(sampler.eps(sampler.conditions(z, None), x, steps), want, atol=1e-5)


def test_unknown_head_kind_is_named():
    with pytest.raises(ValueError, match="head_kind"):
        PatchAR(PatchARConfig(head_kind="unet"))


def test_deepening_keeps_the_conditions():
    """`deepen` spreads a model's layers over a deeper one whose other layers start as the identity: the
    transformer's outputs are unchanged (the head is new)."""
    from multispec.image_ar.continuous.zoo_pair import deepen

    base = tiny(layers=3)
    deep = deepen(base, PatchARConfig(**{**base.config.__dict__, "layers": 7, "head_kind": "lean"})).eval()
    labels, tokens = torch.tensor([1, 4]), torch.randn(2, 3, 4)
    want = base.transform(base.inputs(labels, tokens, 0))
    assert torch.allclose(deep.transform(deep.inputs(labels, tokens, 0)), want, atol=1e-5)
    assert sum(not bool(deep.fc2[j].weight.any()) for j in range(7)) == 4  # the new layers
    with pytest.raises(ValueError, match="config"):
        deepen(base, PatchARConfig(**{**base.config.__dict__, "layers": 2}))


def test_cache_scoring_equals_the_full_forward():
    model = tiny(layers=3)
    labels = torch.tensor([1, 4])
    tokens = torch.randn(2, 3, 4)
    full = model.transform(model.inputs(labels, tokens, 0))  # [2, 4, H]
    cache = model.new_cache(2)
    z0 = model.transform(model.inputs(labels, None, 0), cache)
    cache.commit(1)
    scored = model.transform(model.inputs(None, tokens, 1), cache)  # written, not committed
    assert torch.allclose(torch.cat([z0, scored], 1), full, atol=1e-5)
    cache.commit(1)  # keep one token; the rest rolled back by length alone
    z2 = model.transform(model.inputs(None, tokens[:, 1:2], 2), cache)
    assert torch.allclose(z2[:, 0], full[:, 2], atol=1e-5)
    one_at_a_time = model.transform(model.inputs(None, tokens[:, 2:3], 3), cache, offset=1)
    assert torch.allclose(one_at_a_time[:, 0], full[:, 3], atol=1e-5)


def test_patchify_roundtrip_and_order():
    images = torch.arange(2 * 28 * 28, dtype=torch.float32).view(2, 28, 28)
    tokens = patchify(images, 4)
    assert tokens.shape == (2, 49, 16)
    assert torch.equal(tokens[0, 1], images[0, :4, 4:8].reshape(-1))  # raster order: the second patch is to the right
    assert torch.equal(unpatchify(tokens, 4), images)


def test_config_errors_and_hub_roundtrip(tmp_path):
    with pytest.raises(ValueError, match="patch"):
        PatchAR(PatchARConfig(patch=5))
    model = tiny()
    model.save_pretrained(tmp_path)
    again = PatchAR.from_pretrained(tmp_path)
    assert again.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
