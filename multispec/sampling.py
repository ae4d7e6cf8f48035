"""Sampling transforms shared by targets and drafters.

Speculative sampling is only lossless when the draft distribution q and the target distribution p are
both produced by *the same* transform of their logits, so every caller goes through `SamplingConfig`.
The order (guidance, temperature, top-k, top-p) and the tie semantics follow `transformers`' warpers,
so `do_sample=True` here samples what `generate(do_sample=True, ...)` samples with the same settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .host import require

LogitsHook = Callable[[torch.Tensor], torch.Tensor]


def classifier_free_guidance(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Guided logits `uncond + scale * (cond - uncond)` (scale 1 returns `cond`)."""
    if cond.shape != uncond.shape:
        raise ValueError(f"uncond: shape {tuple(uncond.shape)} does not match cond {tuple(cond.shape)}")
    return uncond + scale * (cond - uncond)


@dataclass(frozen=True)
class SamplingConfig:
    """How next-token distributions are derived from logits.

    `top_k=None` and `top_p=None` disable those filters (unlike `transformers.GenerationConfig`, whose
    default `top_k` is 50). `hooks` run first, in order, on the raw logits: classifier-free guidance and
    other logits processors go there, and they apply to draft and target alike.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    hooks: tuple[LogitsHook, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, bool):
            raise TypeError(f"do_sample: expected a bool, got {type(self.do_sample).__name__}")
        if self.do_sample and not (self.temperature > 0):
            raise ValueError(f"temperature: must be > 0 when do_sample=True, got {self.temperature}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k: expected a positive int or None, got {self.top_k!r}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p: expected a float in (0, 1] or None, got {self.top_p!r}")

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """Float32 logits after hooks, temperature, top-k and top-p (filtered entries are -inf)."""
        out = logits.float()
        for hook in self.hooks:
            out = hook(out)
        if not self.do_sample:
            return out
        if self.temperature != 1.0:
            out = out / self.temperature
        if self.top_k is not None and self.top_k < out.shape[-1]:
            kth = torch.topk(out, self.top_k, dim=-1).values[..., -1:]
            out = out.masked_fill(out < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            sorted_logits, order = torch.sort(out, dim=-1, descending=False)
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            drop_sorted = cumulative <= (1.0 - self.top_p)
            drop_sorted[..., -1] = False  # always keep the most likely token
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            out = out.masked_fill(drop, float("-inf"))
        return out

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Float32 next-token distribution (softmax of `process`)."""
        return torch.softmax(self.process(logits), dim=-1)

    def pick(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Choose one token per row: argmax when greedy, else a sample. Returns (tokens, probs or None)."""
        if not self.do_sample:
            return nan_safe_argmax(self.process(logits)), None
        p = self.probs(logits)
        return sample_from(p, generator), p


def uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """U[0, 1) draws from `generator`, made on the generator's own device and returned on `device` (a CPU
    generator drives a CUDA model, as `generate` allows)."""
    if generator is None:
        return torch.rand(shape, device=device)
    return torch.rand(shape, generator=generator, device=generator.device).to(device)


def normal(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | str,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) draws from `generator` (on its device), returned on `device`."""
    where = device if generator is None else generator.device
    return torch.randn(shape, generator=generator, device=where, dtype=dtype).to(device)


def exponential(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """Exp(1) draws from `generator` (on its device), returned on `device`."""
    where = device if generator is None else generator.device
    return torch.empty(shape, device=where).exponential_(generator=generator).to(device)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One sample per row of `probs` [..., V] (the exponential race argmax p / E, E ~ Exp(1), which draws
    v with probability p_v / sum p, as the verification kernels do)."""
    score = probs / exponential(probs.shape, generator, probs.device)
    return torch.where(probs > 0, score, -1.0).argmax(dim=-1)


def check_logits_finite(logits: torch.Tensor, who: str) -> None:
    """Raise a ValueError naming `who` (e.g. "target (LlamaForCausalLM)") when its logits hold NaN or +inf,
    or a row that is -inf everywhere (no token possible). Greedy argmax and sampling would otherwise turn
    them into arbitrary tokens silently. One reduction (a row's max is NaN if it holds a NaN, +inf if it
    holds +inf, -inf if every entry is -inf); inside a step on CUDA its flag joins the step's one host read
    (`multispec.host`)."""
    require(torch.isfinite(logits.amax(dim=-1)).all(), lambda: _unusable(logits, who))


def _unusable(logits: torch.Tensor, who: str) -> ValueError:
    nan, pos_inf = int(torch.isnan(logits).sum()), int(torch.isposinf(logits).sum())
    dead = int((logits == float("-inf")).all(dim=-1).sum())
    return ValueError(
        f"{who}: the model returned unusable logits ({nan} NaN, {pos_inf} +inf entries, {dead} rows that are "
        f"-inf everywhere, of {logits.numel()} entries in shape {tuple(logits.shape)}); check its weights and "
        "dtype (fp16 overflow?) and its inputs")


def nan_safe_argmax(x: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dim where NaN counts as -inf (torch.argmax would return the NaN's index)."""
    return torch.nan_to_num(x.float(), nan=float("-inf")).argmax(dim=-1)
