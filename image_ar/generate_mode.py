"""`multispec generate --pair mnist-vq-gpt|mnist-patch-diffusion --class 3,7 --out DIR`: class-conditional digits
from the zoo's image AR pairs, drawn speculatively (exact, or LANTERN with `--delta` on the VQ pair) and written
as PNGs; `--compare` draws the same classes plainly with the same seed beside them."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from multispec import EngineConfig, SamplingConfig
from multispec.plugin import GenerateMode, comparison_line, comparison_record, timed_rounds, tree_option, write_json

from .bench import NEIGHBOURS
from .continuous.generate import generate_continuous
from .continuous.head_sampler import HeadSampling
from .continuous.zoo_pair import NAME as CONTINUOUS
from .continuous.zoo_pair import load_pair as load_continuous_pair
from .generate import generate_images
from .relaxed import Relaxed
from .zoo_pair import CFG_SCALE, NAME, TOP_K, image_drafter
from .zoo_pair import load_pair as load_image_pair

DEFAULT_OUT = "multispec_images"
DEFAULT_K = {NAME: 6, CONTINUOUS: 4}  # the demo's chains on these pairs


def _classes(text: str) -> list[int]:
    try:
        classes = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected digit classes 0-9 separated by commas, e.g. 3,7; got {text!r}")
    if not classes or not all(0 <= c <= 9 for c in classes):
        raise argparse.ArgumentTypeError(f"expected digit classes 0-9 separated by commas, e.g. 3,7; got {text!r}")
    return classes


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--class", dest="digit_classes", type=_classes, default=None, metavar="C[,C...]",
                       help="the digits to draw, one image each, e.g. 3,7")
    group.add_argument("--out", default=None, metavar="DIR", help=f"where the PNGs go (default ./{DEFAULT_OUT})")
    group.add_argument("--delta", type=float, default=None,
                       help=f"{NAME}: LANTERN's relaxed acceptance with this total-variation budget per code "
                            "(0-1; default: exact, the target's own distribution)")


def _check(args: argparse.Namespace) -> tuple[list[int], int, Path]:
    if args.digit_classes is None:
        raise ValueError(f"--class: {args.pair} draws digits; give the classes, e.g. --class 3,7")
    if args.delta is not None:
        if args.pair != NAME:
            raise ValueError(f"--delta: LANTERN's budget applies to {NAME}'s codes, not {args.pair}")
        if not 0 <= args.delta <= 1:
            raise ValueError(f"--delta: expected a total-variation budget in [0, 1], got {args.delta}")
    if args.prompt is not None or args.prompts is not None:
        raise ValueError("--prompt: the image pairs take --class, not text")
    if args.sample or args.temperature != 1.0:
        raise ValueError("--sample: the image pairs always sample (temperature 1, as the papers); drop "
                         "--sample/--temperature")
    tree = tree_option(args.tree)
    if tree is not None and not isinstance(tree, int):
        raise ValueError(f"--tree: the image pairs draft chains; give a chain length K, got {args.tree!r}")
    out = Path(args.out or DEFAULT_OUT)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a folder")
    return args.digit_classes, tree or DEFAULT_K[args.pair], out


def _save(image: torch.Tensor, path: Path, scale: int = 8) -> None:
    from PIL import Image

    pixels = (image.reshape(28, 28).clamp(0, 1) * 255).byte().cpu().numpy()
    Image.fromarray(pixels, mode="L").resize((28 * scale, 28 * scale), Image.NEAREST).save(path)


def _draw(args: argparse.Namespace, classes: list[int], k: int):
    """(speculative output, a call that draws it again, a call that draws plain AR, what the speculative run
    is)."""
    def gen():
        return torch.Generator().manual_seed(args.seed)

    if args.pair == CONTINUOUS:
        pair = load_continuous_pair()
        labels = torch.tensor(classes)

        def speculative():
            return generate_continuous(pair.target, labels, pair.draft, tree=k,
                                       sampling=HeadSampling(guidance_scale=CFG_SCALE),
                                       engine=EngineConfig(step=args.step), generator=gen())

        def plain():
            return generate_continuous(pair.target, labels, sampling=HeadSampling(guidance_scale=CFG_SCALE),
                                       generator=gen())

        where = "" if args.step == "eager" else f", {args.step} step"
        return speculative(), speculative, plain, f"continuous speculative decoding, chain k={k} (exact{where})"
    pair = load_image_pair()
    rule, what = None, f"EAGLE chain k={k}, exact"
    if args.delta is not None:
        rule = Relaxed.from_codebook(pair.vqvae.codebook_latents(), NEIGHBOURS, delta=args.delta)
        what = f"EAGLE chain k={k}, LANTERN delta={args.delta:g}"
    common = dict(guidance_scale=CFG_SCALE, sampling=SamplingConfig(do_sample=True, top_k=TOP_K), vqvae=pair.vqvae)

    def speculative():
        return generate_images(pair.target, classes, drafter=image_drafter(pair, "eagle"), rule=rule, tree=k,
                               generator=gen(), engine=EngineConfig(step=args.step), **common)

    def plain():
        return generate_images(pair.target, classes, generator=gen(), **common)

    return speculative(), speculative, plain, what


def run(args: argparse.Namespace) -> int:
    classes, k, out_dir = _check(args)
    spec, again, draw_plain, what = _draw(args, classes, k)
    timed = timed_rounds(again, draw_plain, args.rounds, units=lambda out: len(classes)) if args.compare else None
    plain = timed["plain_output"] if timed else None
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for i, c in enumerate(classes):
        path = out_dir / f"{args.pair}_{i}_class{c}.png"
        _save(spec.images[i], path)
        files.append(str(path))
        if plain is not None:
            _save(plain.images[i], out_dir / f"{args.pair}_{i}_class{c}_plain.png")
    record = {"source": args.pair, "method": what, "classes": classes, "seed": args.seed, "files": files,
              "seconds": round(spec.seconds, 4)}
    if args.pair == CONTINUOUS:
        record |= {"drafted": spec.drafted, "accepted": spec.accepted,
                   "acceptance_rate": round(spec.accepted / max(spec.drafted, 1), 3)}
        figure = f"{spec.accepted} of {spec.drafted} drafted patches accepted"
    else:
        record["mean_accepted_length"] = round(spec.stats.mean_accepted_length, 3)
        record["max_tvd"] = round(float(spec.max_tvd), 4)
        figure = f"mean accepted length {record['mean_accepted_length']:.2f} codes per target forward"
    images = f"{len(classes)} image" + ("s" if len(classes) != 1 else "")
    line = f"[{images} in {spec.seconds:.2f} s ({what}); {figure}; written to {out_dir}/]"
    if timed is not None:
        record.update(comparison_record(timed))
        line += "\n" + comparison_line("speculative", timed, "images", "plain AR") + "\n[plain AR, same seed: *_plain.png beside them]"
    print(line)
    write_json(args, record)
    return 0


MODE = GenerateMode("image AR", (NAME, CONTINUOUS), {"digit_classes": "--class", "out": "--out", "delta": "--delta"},
                    _add_arguments, run, static_step=True)
