"""Run one prompt through plain decoding and several speculative methods, timed in the same request,
with the speculative steps traced for display. Shared by the demo tabs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from multispec import speculative_generate
from multispec.trace import StepRecorder, render_steps_html


@dataclass
class MethodResult:
    name: str
    token_ids: list[int]
    text: str
    tokens: int
    seconds: float
    mean_accepted_length: float | None
    trace_html: str

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def compare(model, tokenizer, prompt: str, methods: dict[str, tuple[object, object, object]],
            max_new_tokens: int = 64, plain: Callable | None = None) -> list[MethodResult]:
    """`methods`: name -> (target, drafter, tree) for `speculative_generate`. The first row is plain
    greedy decoding (`plain(ids, n)`, default the model's own `generate`); every row decodes greedily
    with no EOS stop, so outputs are comparable token for token."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt: expected a non-empty string")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected a positive int, got {max_new_tokens!r}")
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    if plain is None:
        def plain(x, n):
            return model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
    n0 = ids.shape[1]
    t0 = time.perf_counter()
    seq = plain(ids, max_new_tokens)
    new = seq[0, n0:].tolist()
    results = [MethodResult("plain", new, tokenizer.decode(new), len(new),
                            time.perf_counter() - t0, None, "")]
    for name, (target, drafter, tree) in methods.items():
        rec = StepRecorder()
        t0 = time.perf_counter()
        out = speculative_generate(target, drafter, ids, max_new_tokens=max_new_tokens, tree=tree,
                                   eos_token_id=[], pad_token_id=0, on_step=rec)
        dt = time.perf_counter() - t0
        html = render_steps_html(rec.row(0), decode=lambda t: tokenizer.decode([t]))
        new = out.sequences[0, n0:n0 + out.num_new_tokens[0]].tolist()
        results.append(MethodResult(name, new, tokenizer.decode(new), len(new), dt, out.stats.mean_accepted_length,
                                    html))
    return results


def summary_markdown(results: list[MethodResult]) -> str:
    """A table: tokens/s, speedup over the plain row, mean accepted length, same output as plain."""
    base = results[0]
    rows = ["| method | tok/s | vs plain | accepted length | same output as plain |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        mal = "-" if r.mean_accepted_length is None else f"{r.mean_accepted_length:.2f}"
        rows.append(f"| {r.name} | {r.tokens_per_s:.1f} | {r.tokens_per_s / base.tokens_per_s:.2f}x | {mal} | "
                    f"{'yes' if r.token_ids == base.token_ids else 'NO'} |")
    return "\n".join(rows)
