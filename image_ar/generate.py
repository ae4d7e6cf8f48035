"""Class-conditional image generation, plain and speculative, with the same sampling everywhere.

    from multispec.image_ar import generate_images, load_image_pair, image_drafter, Relaxed
    pair = load_image_pair()                                   # the zoo's mnist-vq-gpt
    rule = Relaxed.from_codebook(pair.vqvae.codebook_latents(), k=20, delta=0.2)
    out = generate_images(pair.target, [3, 7], drafter=image_drafter(pair, "eagle"), rule=rule,
                          guidance_scale=2.0, sampling=SamplingConfig(do_sample=True, top_k=64),
                          tree=DynamicTree(4, 4, 16), vqvae=pair.vqvae, generator=torch.Generator().manual_seed(0))
    out.images, out.codes, out.stats.mean_accepted_length, out.max_tvd

`generate_ar` is the plain reference loop (the model's own `transformers` forward with a KV cache, the
conditional and unconditional halves in one batch), written independently of the speculative core so
the losslessness tests compare two different implementations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from multispec import EngineConfig, GuidedTarget, NGramDrafter, speculative_generate
from multispec.plugin import SamplingConfig, SpeculativeStats, checked, classifier_free_guidance

from .gpt import ClassConditionalGPT

# image generators sample: the default of `generate_images` and `generate_ar` (greedy: `SamplingConfig()`)
IMAGE_SAMPLING = SamplingConfig(do_sample=True, temperature=1.0)


@dataclass
class ImageGenerationOutput:
    """`codes` [N, grid^2] in raster order; `images` [N, 1, H, W] when a tokenizer was given;
    `accepted[n, i]` True where token i was a draft the target accepted (False: the target's own
    correction or bonus token); `max_tvd`: the largest per-token TVD a relaxed rule reported (0 for
    lossless rules); `stats`: the speculative run's counters (None for `generate_ar`)."""

    codes: torch.Tensor
    images: torch.Tensor | None
    accepted: torch.Tensor | None
    max_tvd: float
    seconds: float
    stats: SpeculativeStats | None = None


def _labels(labels, model) -> torch.Tensor:
    """Class ids [N] on `model`'s device (the API boundary: prompts are built where the model runs)."""
    t = torch.as_tensor(labels, dtype=torch.long, device=model.device)
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"labels: expected a non-empty list of class ids, got {labels!r}")
    return t


def _decoded(vqvae, codes: torch.Tensor) -> torch.Tensor | None:
    return None if vqvae is None else vqvae.decode(codes)


class _Trace:
    """on_step: per row, which emitted tokens were accepted drafts, and the largest reported TVD."""

    def __init__(self, b: int):
        self.flags: list[list[bool]] = [[] for _ in range(b)]
        self.max_tvd = 0.0

    def __call__(self, draft, verdict, rows) -> None:
        counts = verdict.num_accepted.tolist()
        tvd = getattr(verdict, "tvd", None)
        if tvd is not None and tvd.numel():
            self.max_tvd = max(self.max_tvd, float(tvd.max()))
        for i, row in enumerate(rows):
            self.flags[row] += [True] * counts[i] + [False]


def generate_images(target, labels, *, drafter=None, rule=None, tree=None, guidance_scale: float | None = None,
                    sampling: SamplingConfig | None = None, generator: torch.Generator | None = None, vqvae=None,
                    engine: EngineConfig | None = None) -> ImageGenerationOutput:
    """Generate one image per class label with `target` (a `ClassConditionalGPT`, or a Janus-style target
    adapter whose prompts are class tokens). `drafter=None` decodes plainly through the same adapter (one
    token per target forward); otherwise speculative decoding with `rule` (None: Exact when sampling,
    Greedy otherwise; a `Relaxed` for LANTERN) over `tree` (None: a 4-token chain). Guidance and `sampling`
    (default `IMAGE_SAMPLING`: sampled at temperature 1) apply identically to target and draft. `engine`:
    `EngineConfig` ("static" step: the fixed-shape step, guidance included; `progress`: a bar)."""
    if not isinstance(target, ClassConditionalGPT):
        raise TypeError(f"target: expected a ClassConditionalGPT, got {type(target).__name__}")
    labels = _labels(labels, target)
    prompt = target.class_tokens(labels)
    n = target.config.num_image_tokens
    plain = drafter is None
    trace = _Trace(len(labels))
    start = time.perf_counter()
    sampling = checked(sampling, SamplingConfig, "sampling") if sampling is not None else IMAGE_SAMPLING
    guided = target if guidance_scale is None else GuidedTarget(target, guidance_scale)
    out = speculative_generate(guided, NGramDrafter() if plain else drafter, prompt,
                               attention_mask=torch.ones_like(prompt),
                               max_new_tokens=n, tree=0 if plain else tree, rule=rule, sampling=sampling,
                               engine=replace(checked(engine, EngineConfig, "engine"), on_step=trace),
                               generator=generator)
    seconds = time.perf_counter() - start
    codes = out.sequences[:, prompt.shape[1]:]
    if codes.shape[1] != n:
        raise RuntimeError(f"generated {codes.shape[1]} tokens per image, expected {n}")
    accepted = torch.tensor([f[:n] for f in trace.flags], dtype=torch.bool, device=codes.device)
    return ImageGenerationOutput(codes, _decoded(vqvae, codes), accepted, trace.max_tvd, seconds, out.stats)


@torch.no_grad()
def generate_ar(model: ClassConditionalGPT, labels, *, guidance_scale: float | None = None,
                sampling: SamplingConfig | None = None, generator: torch.Generator | None = None,
                vqvae=None) -> ImageGenerationOutput:
    """Plain AR sampling with the model's own forward (see the module docstring); `sampling` as in
    `generate_images`."""
    from transformers import DynamicCache

    if not isinstance(model, ClassConditionalGPT):
        raise TypeError(f"model: expected a ClassConditionalGPT, got {type(model).__name__}")
    labels = _labels(labels, model)
    b = len(labels)
    sampling = checked(sampling, SamplingConfig, "sampling") if sampling is not None else IMAGE_SAMPLING
    ids = model.class_tokens(labels)
    if guidance_scale is not None:
        ids = torch.cat([ids, model.unconditional_tokens(ids)])
    start = time.perf_counter()
    cache = DynamicCache()
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
    codes = []
    for _ in range(model.config.num_image_tokens):
        if guidance_scale is not None:
            logits = classifier_free_guidance(logits[:b], logits[b:], guidance_scale)
        token, _ = sampling.pick(logits, generator)
        codes.append(token)
        feed = token if guidance_scale is None else torch.cat([token, token])
        logits = model(input_ids=feed[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
    codes = torch.stack(codes, dim=1)
    return ImageGenerationOutput(codes, _decoded(vqvae, codes), None, 0.0, time.perf_counter() - start)
