"""The Triton trajectory log-ratio kernel (interpreted on the CPU) equals its PyTorch reference on random
inputs of awkward sizes (steps x dim not a block multiple, several blocks per trajectory, one trajectory),
and the reference equals the difference of the two Gaussian log-densities computed independently."""

import os

import pytest
import torch

from multispec.image_ar.continuous.trajectory_kernel import trajectory_log_ratio, trajectory_log_ratio_ref

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU needs TRITON_INTERPRET=1 (set by tests/conftest.py)")


def _inputs(n, s, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, s, d, generator=g)
    mp = x + 0.3 * torch.randn(n, s, d, generator=g)
    mq = x + 0.3 * torch.randn(n, s, d, generator=g)
    std = torch.rand(s, generator=g) * 0.9 + 0.05
    return x, mp, mq, std


@needs_interpreter
@pytest.mark.parametrize("n,s,d,block", [(1, 1, 1, None), (7, 5, 16, None), (3, 9, 37, 64), (20, 4, 3, 16),
                                         (2, 99, 16, 128)])
def test_kernel_equals_reference(n, s, d, block):
    x, mp, mq, std = _inputs(n, s, d, seed=n + s + d)
    want = trajectory_log_ratio_ref(x, mp, mq, std)
    got = trajectory_log_ratio(x, mp, mq, std, backend="triton", block=block)
    assert got.shape == (n,)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)


def test_reference_is_the_gaussian_log_density_difference():
    x, mp, mq, std = _inputs(5, 4, 3, seed=0)
    normal = lambda mean: torch.distributions.Normal(mean, std[None, :, None]).log_prob(x).sum((1, 2))  # noqa: E731
    assert torch.allclose(trajectory_log_ratio_ref(x, mp, mq, std), normal(mp) - normal(mq), atol=1e-4)
    assert torch.allclose(trajectory_log_ratio_ref(x, mp, mp, std), torch.zeros(5))


def test_bad_inputs_name_the_argument():
    x, mp, mq, std = _inputs(2, 3, 4, seed=1)
    with pytest.raises(ValueError, match="mean_q"):
        trajectory_log_ratio(x, mp, mq[:, :2], std)
    with pytest.raises(ValueError, match="std"):
        trajectory_log_ratio(x, mp, mq, torch.zeros(3))
    with pytest.raises(TypeError, match="next_states"):
        trajectory_log_ratio(x.long(), mp, mq, std)
    if os.environ.get("TRITON_INTERPRET") == "1":
        with pytest.raises(ValueError, match="block"):
            trajectory_log_ratio(x, mp, mq, std, backend="triton", block=24)
