"""Image tab: pick a digit class; plain AR, exact speculative decoding and LANTERN generate it side by side
with the zoo's class-conditional image GPT (same seed, guidance and top-k), timed in the request; under
each image, its 7x7 token grid coloured by how each code came: green an accepted draft, blue the
target's own (correction or bonus) token."""

from __future__ import annotations

import functools

import torch

from multispec import SamplingConfig
from multispec.image_ar import Relaxed, generate_images, image_drafter, load_image_pair

from .compare import build_image_outputs, shown


@functools.cache
def _pair():
    pair = load_image_pair()
    table = Relaxed.from_codebook(pair.vqvae.codebook_latents(), 50, delta=0.0).neighbours
    return pair, table


def token_grid(codes: torch.Tensor, accepted: torch.Tensor | None, grid: int = 7) -> str:
    """One image's codes as an HTML grid: accepted drafts green, the target's own tokens blue."""
    cells = []
    for r in range(grid):
        row = []
        for c in range(grid):
            i = r * grid + c
            colour = "#eee" if accepted is None else ("#c8f7c5" if bool(accepted[i]) else "#cfe3ff")
            row.append(f'<td style="background:{colour};padding:2px 4px">{int(codes[i])}</td>')
        cells.append("<tr>" + "".join(row) + "</tr>")
    return '<table style="font-family:monospace;font-size:11px;border-collapse:collapse">' + "".join(cells) + "</table>"


def _picture(image: torch.Tensor, scale: int = 8):
    from PIL import Image

    pixels = (image[0].clamp(0, 1) * 255).byte().numpy()
    return Image.fromarray(pixels, mode="L").resize((28 * scale, 28 * scale), Image.NEAREST)


def run(label: int, seed: int = 0, delta: float = 0.2, guidance_scale: float = 2.0, top_k: int = 64):
    """Returns (summary markdown, [(image, caption)], token grids HTML)."""
    if isinstance(label, bool) or not isinstance(label, (int, float)) or not 0 <= int(label) <= 9:
        raise ValueError(f"label: expected a digit class 0-9, got {label!r}")
    if not 0 <= float(delta) <= 1:
        raise ValueError(f"delta: expected a number in [0, 1], got {delta!r}")
    pair, table = _pair()
    eagle = image_drafter(pair, "eagle")
    methods = {"plain AR": dict(drafter=None), "exact (EAGLE chain k=6)": dict(drafter=eagle, tree=6),
               f"LANTERN delta={float(delta):g} (chain k=6)": dict(drafter=eagle, tree=6,
                                                                   rule=Relaxed(table, delta=float(delta)))}
    rows = ["| method | time | vs plain | mean accepted length | max TVD |", "| --- | --- | --- | --- | --- |"]
    gallery, grids, plain_s = [], [], None
    for name, kw in methods.items():
        out = generate_images(pair.target, [int(label)], guidance_scale=float(guidance_scale),
                              sampling=SamplingConfig(do_sample=True, top_k=int(top_k)),
                              vqvae=pair.vqvae, generator=torch.Generator().manual_seed(int(seed)), **kw)
        plain_s = plain_s or out.seconds
        rows.append(f"| {name} | {out.seconds * 1e3:.0f} ms | {plain_s / out.seconds:.2f}x | "
                    f"{out.stats.mean_accepted_length:.2f} | {out.max_tvd:.3f} |")
        gallery.append((_picture(out.images[0]), name))
        grids.append(f"<div style='display:inline-block;margin:6px'><b>{name}</b>"
                     f"{token_grid(out.codes[0], None if kw['drafter'] is None else out.accepted[0])}</div>")
    return "\n".join(rows), gallery, "".join(grids)


def build() -> None:
    import gradio as gr

    gr.Markdown("Generate a digit with the zoo's class-conditional image GPT (a VQ-VAE tokenizer and a 12-layer "
                "LlamaGen-style GPT trained here on MNIST; temperature 1, top-k, classifier-free guidance). Exact "
                "speculative decoding keeps the target's distribution; LANTERN accepts a draft when the target's "
                "mass over its latent neighbourhood supports it, moving at most delta of probability per token. "
                "Green codes: accepted drafts; blue: the target's own.")
    with gr.Row():
        label = gr.Slider(0, 9, value=3, step=1, label="digit class")
        seed = gr.Number(0, label="seed", precision=0)
        delta = gr.Slider(0.0, 0.6, value=0.2, step=0.05, label="LANTERN delta (TVD budget)")
        scale = gr.Slider(1.0, 4.0, value=2.0, step=0.25, label="guidance scale")
    go, table, gallery, grids = build_image_outputs(
        "image",
        "*vs plain*: plain AR's time over the row's; *mean accepted length*: codes committed per target forward; "
        "*max TVD*: the largest probability mass LANTERN moved at one code (exact: 0). Exact speculation can be "
        "slower than plain here: on a CPU a draft step costs a sizeable part of a target step and sampled image "
        "codes are hard to guess, so few drafts are accepted; LANTERN accepts more.",
        "plain AR | exact | LANTERN",
        "**the speculative runs' code grids** (green: accepted drafts, blue: the target's own codes)")
    go.click(shown(generate_digit), [label, seed, delta, scale], [table, gallery, grids], api_name="image")


def generate_digit(digit_class: float, seed: float, delta: float, guidance_scale: float):
    """The button's endpoint (`/image`): slider values arrive as floats."""
    return run(int(digit_class), int(seed), float(delta), float(guidance_scale))
