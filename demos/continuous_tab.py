"""Continuous-token tab: pick a digit class; the zoo's diffusion-head AR model (`mnist-patch-diffusion`)
generates it plainly, with continuous speculative decoding (exact) and with the target's head on fewer
diffusion steps, timed in the same request; under each speculative image, its 7x7 patch grid coloured by
who wrote each patch: grey the target's pre-fill, green an accepted draft, blue the target's correction
or bonus draw."""

from __future__ import annotations

import functools

import torch

from multispec.image_ar import HeadSampling, generate_continuous, load_continuous_pair

from .compare import build_image_outputs, shown

COLOURS = {"prefill": "#ddd", "draft": "#c8f7c5", "target": "#cfe3ff"}


@functools.cache
def _pair():
    return load_continuous_pair()


def origin_grid(origins: list[str], grid: int = 7) -> str:
    cells = []
    for r in range(grid):
        row = "".join(f'<td style="background:{COLOURS[origins[r * grid + c]]};width:14px;height:14px"></td>'
                      for c in range(grid))
        cells.append(f"<tr>{row}</tr>")
    return '<table style="border-collapse:collapse">' + "".join(cells) + "</table>"


def _picture(image: torch.Tensor, scale: int = 8):
    from PIL import Image

    pixels = (image.clamp(0, 1) * 255).byte().numpy()
    return Image.fromarray(pixels, mode="L").resize((28 * scale, 28 * scale), Image.NEAREST)


def run(label: int, seed: int = 0, k: int = 4, guidance_scale: float = 2.0, fewer_steps: int = 5):
    """Returns (summary markdown, [(image, caption)], origin grid HTML)."""
    if isinstance(label, bool) or not isinstance(label, (int, float)) or not 0 <= int(label) <= 9:
        raise ValueError(f"label: expected a digit class 0-9, got {label!r}")
    if not 1 <= int(k) <= 16:
        raise ValueError(f"k: expected 1-16 drafts per step, got {k!r}")
    pair = _pair()
    steps = pair.target.config.steps
    if not 2 <= int(fewer_steps) <= steps:
        raise ValueError(f"fewer_steps: expected 2-{steps} grid points, got {fewer_steps!r}")
    methods = {"plain AR": dict(), f"speculative (k={int(k)}, exact)": dict(draft=pair.draft, tree=int(k)),
               f"plain AR, {int(fewer_steps)} diffusion steps": dict(steps=int(fewer_steps))}
    rows = ["| method | time | vs plain | drafts accepted | residual fallbacks |", "| --- | --- | --- | --- | --- |"]
    gallery, grid, plain_s = [], "", None
    for name, kw in methods.items():
        kw = dict(kw)
        head = HeadSampling(steps=kw.pop("steps", None), guidance_scale=float(guidance_scale))
        out = generate_continuous(pair.target, torch.tensor([int(label)]), sampling=head,
                                  generator=torch.Generator().manual_seed(int(seed)), **kw)
        plain_s = plain_s or out.seconds
        rate = f"{out.accepted}/{out.drafted} ({out.acceptance_rate:.0%})" if out.drafted else "-"
        rows.append(f"| {name} | {out.seconds * 1e3:.0f} ms | {plain_s / out.seconds:.2f}x | {rate} | "
                    f"{out.residual_fallbacks if out.drafted else '-'} |")
        gallery.append((_picture(out.images[0]), name))
        if out.drafted:
            grid = f"<div><b>{name}</b>: who wrote each patch{origin_grid(out.origins())}</div>"
    return "\n".join(rows), gallery, grid


def build() -> None:
    import gradio as gr

    gr.Markdown("Generate a digit with the zoo's continuous-token model: a 14-layer causal transformer over 4x4 "
                "pixel patches whose every patch is sampled by a small diffusion head (DDPM, cosine schedule). "
                "Speculative decoding drafts patches with a 1-layer model and accepts each by the density ratio of "
                "its whole denoising trajectory under the two heads: the output keeps the target's distribution. "
                "Grey patches: the target's pre-fill; green: accepted drafts; blue: the target's corrections.")
    with gr.Row():
        label = gr.Slider(0, 9, value=3, step=1, label="digit class")
        seed = gr.Number(0, label="seed", precision=0)
        k = gr.Slider(1, 8, value=4, step=1, label="drafts per step (k)")
        scale = gr.Slider(1.0, 4.0, value=2.0, step=0.25, label="guidance scale")
    go, table, gallery, grid = build_image_outputs(
        "continuous",
        "*vs plain*: plain AR's time over the row's; *drafts accepted*: patches taken from the draft; *residual "
        "fallbacks*: rejected patches redrawn by the target. Each patch costs a full diffusion sampling loop in both "
        "heads, so a rejected draft is expensive; the fewer-steps row is the quality/speed trade-off speculation "
        "avoids.",
        "plain AR | speculative | fewer diffusion steps",
        "**the speculative run's patches** (grey: prefill, green: accepted drafts, blue: the target's)")
    go.click(shown(generate_digit), [label, seed, k, scale], [table, gallery, grid], api_name="continuous")


def generate_digit(digit_class: float, seed: float, drafts_per_step: float, guidance_scale: float):
    """The button's endpoint (`/continuous`): slider values arrive as floats."""
    return run(int(digit_class), int(seed), int(drafts_per_step), float(guidance_scale))
