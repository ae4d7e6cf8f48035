import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from multispec.sampling import SamplingConfig, classifier_free_guidance, nan_safe_argmax


def test_matches_transformers_warpers():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    for temp, k, p in [(0.7, 10, 0.9), (1.3, None, 0.5), (1.0, 3, None), (0.5, 1, 0.99)]:
        ours = SamplingConfig(do_sample=True, temperature=temp, top_k=k, top_p=p).process(logits)
        ref = TemperatureLogitsWarper(temp)(None, logits.clone())
        if k is not None:
            ref = TopKLogitsWarper(k)(None, ref)
        if p is not None:
            ref = TopPLogitsWarper(p)(None, ref)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
        assert torch.allclose(ours[~torch.isinf(ours)], ref[~torch.isinf(ref)])


def test_greedy_ignores_temperature_and_filters():
    logits = torch.randn(2, 9)
    assert torch.equal(SamplingConfig(do_sample=False, temperature=0.1, top_k=2).process(logits), logits)


def test_hooks_and_cfg():
    cond, uncond = torch.randn(3, 8), torch.randn(3, 8)
    assert torch.allclose(classifier_free_guidance(cond, uncond, 1.0), cond)
    hook = lambda x: x * 2  # noqa: E731
    out = SamplingConfig(hooks=(hook,)).process(cond)
    assert torch.allclose(out, cond * 2)


def test_nan_safe_argmax():
    x = torch.tensor([[float("nan"), 1.0, 3.0], [float("nan")] * 3])
    assert nan_safe_argmax(x).tolist() == [2, 0]
