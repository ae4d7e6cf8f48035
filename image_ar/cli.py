"""The image commands of the `multispec` CLI: `bench image-ar`, `eval image`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from multispec import SamplingConfig
from multispec.plugin import (BenchOptions, Shards, current_shards, machine_info, parse_tree, positive_int,
                              register_command, register_generate_mode, register_trainer)

from . import generate_mode, train_draft, zoo_pair
from .continuous import zoo_pair as continuous_pair
from .bench import NEIGHBOURS, run
from .continuous.bench import K
from .continuous.bench import run as run_continuous
from .continuous.generate import generate_continuous
from .continuous.head_sampler import HeadSampling
from .data import DATASETS, load_digits_dataset
from .generate import generate_images
from .harness import ImageCounts
from .metrics import SEED_RUNS, image_scores, inception_fid, seed_spread
from .relaxed import Relaxed


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", choices=["lantern", "continuous"], default="lantern",
                   help="lantern: mnist-vq-gpt (discrete VQ tokens); continuous: mnist-patch-diffusion (diffusion head)")
    p.add_argument("--quick", action="store_true", help="10 timed images and 100 for FID (instead of 40 and 1000)")
    p.add_argument("--guidance-scale", type=float, default=None, help="default: the zoo's 2.0")
    p.add_argument("--top-k", type=int, default=None, help="default: the zoo's 64")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--timing-images", type=int, default=None)
    p.add_argument("--fid-images", type=int, default=None)
    p.add_argument("--rounds", type=positive_int, default=None,
                   help="the timed images split into N rounds, each ratio from one round (default 4; --quick: 2)")
    p.add_argument("--chain-k", type=int, default=None, help="drafts per step (default: 6 for lantern, "
                   "the continuous benchmark's K)")
    p.add_argument("--tree", default=None, type=parse_tree, metavar="D/K/N",
                   help="dynamic tree (default 5/4/16; lantern)")
    p.add_argument("--steps", type=positive_int, default=None, help="diffusion grid points (continuous; default: the pair's)")
    p.add_argument("--prefill", type=float, default=0.1,
                   help="fraction of tokens the target writes before drafting starts (continuous)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--weights", default=None, help="a retrained pair's folder (default: the shipped one)")
    p.add_argument("--json", default=None, metavar="PATH")


def _bench(args: argparse.Namespace) -> int:
    counts = ImageCounts(args.timing_images, args.fid_images)
    if args.method == "continuous":
        if args.top_k is not None or args.tree is not None:
            raise ValueError("--top-k / --tree: discrete-token options; --method continuous has neither")
        run_continuous(BenchOptions.from_args(args), args.guidance_scale, args.steps, args.prefill, counts)
        return 0
    run(BenchOptions.from_args(args), args.method, args.guidance_scale, args.top_k, counts)
    return 0


FID_FEW = 1000  # below this many images FID is far above its large-sample value


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--images", default=None, metavar="NPZ",
                   help="score your images: an .npz with `images` [N, 28, 28] (uint8 0-255 or float 0-1) and "
                        "optionally `labels` [N]; default: generate with the zoo pair (--method)")
    p.add_argument("--method", default="lantern", choices=["ar", "exact", "lantern", "continuous", "continuous-ar"],
                   help="what to generate when --images is not given (ar / exact / lantern: mnist-vq-gpt; "
                        "continuous / continuous-ar: mnist-patch-diffusion speculative / plain)")
    p.add_argument("--delta", type=float, default=0.2, help="LANTERN's TVD budget (--method lantern)")
    p.add_argument("--num", type=int, default=500, help="images to generate (a multiple of 10: classes in turn)")
    p.add_argument("--reference", default="mnist", help="mnist | digits | an .npz like --images (real images)")
    p.add_argument("--features", choices=["classifier", "inception"], default="classifier",
                   help="FID features: the zoo's MNIST classifier, or Inception-v3 (needs torch-fidelity and "
                        "its weights on this machine)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=positive_int, default=SEED_RUNS,
                   help=f"generated images: score this many sets drawn under different seeds and report each score's "
                        f"mean and [min-max] (default {SEED_RUNS}; a difference between methods smaller than twice "
                        "that spread is noise)")
    p.add_argument("--json", default=None, metavar="PATH")


SEED_STRIDE = 1_000_000  # set s draws its batch b with seed --seed + s * SEED_STRIDE + b


def _npz_images(path: str, name: str):
    if not Path(path).exists():
        raise FileNotFoundError(f"{name}: {path} does not exist")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{name}: {path} is not an .npz archive of arrays ({err})") from None
    if not hasattr(data, "files"):
        raise ValueError(f"{name}: {path} holds a single array, not an .npz archive with `images`")
    if "images" not in data:
        raise ValueError(f"{name}: {path} has no `images` array (found: {', '.join(data.files)})")
    images = torch.from_numpy(np.asarray(data["images"]))
    if images.dim() == 3:
        images = images[:, None]
    if images.dim() != 4 or images.shape[1] != 1 or images.shape[-2:] != (28, 28):
        raise ValueError(f"{name}: expected images [N, 28, 28] or [N, 1, 28, 28], got {tuple(images.shape)}")
    images = images.float() / 255.0 if not images.is_floating_point() else images.float()
    labels = torch.from_numpy(np.asarray(data["labels"])).long() if "labels" in data else None
    return images, labels


def _batches(args: argparse.Namespace, generate, shards: Shards, seed: int) -> list[dict]:
    """`--num` digits as batches of the ten classes, batch b drawn with seed `seed + b` (so a batch is the same
    whichever process draws it): this process's share, then every process's batches in order."""
    starts = list(range(0, args.num, 10))
    mine = {b: generate(torch.Generator().manual_seed(seed + b))
            for b in tqdm(shards.take(starts), desc=f"images, seed {seed}", unit="batch of 10", disable=not shards.main)}
    drawn = {b: part for parts in shards.gather(mine) for b, part in parts.items()}
    return [drawn[b] for b in starts]


def _generate_continuous(args: argparse.Namespace, shards: Shards, seed: int):
    """`--num` digits from mnist-patch-diffusion (classes in turn, batches of 10), with speed figures."""
    pair = continuous_pair.load_pair()
    draft = pair.draft if args.method == "continuous" else None

    def batch(generator) -> dict:
        out = generate_continuous(pair.target, torch.arange(10), draft, tree=K,
                                  sampling=HeadSampling(guidance_scale=continuous_pair.CFG_SCALE), generator=generator)
        return {"images": out.images[:, None], "seconds": out.seconds, "accepted": out.accepted,
                "drafted": out.drafted, "fallbacks": out.residual_fallbacks}

    parts = _batches(args, batch, shards, seed)
    secs = sum(p["seconds"] for p in parts)
    speed = {"method": args.method, "seconds": round(secs, 2), "images_per_s": round(args.num / secs, 2)}
    if draft is not None:
        speed |= {"acceptance_rate": round(sum(p["accepted"] for p in parts) / sum(p["drafted"] for p in parts), 4),
                  "residual_fallbacks": sum(p["fallbacks"] for p in parts)}
    return torch.cat([p["images"] for p in parts]), torch.arange(10).repeat(args.num // 10), speed


def _generate_discrete(args: argparse.Namespace, pair, shards: Shards, seed: int):
    """`--num` digits from mnist-vq-gpt by plain AR, exact speculation or LANTERN, with speed figures."""
    kw = {}
    if args.method != "ar":
        # a 6-token chain, as the benchmark's main rows
        kw = dict(drafter=zoo_pair.image_drafter(pair, "eagle"), tree=6)
    if args.method == "lantern":
        kw["rule"] = Relaxed.from_codebook(pair.vqvae.codebook_latents(), NEIGHBOURS, delta=args.delta)

    def batch(generator) -> dict:
        out = generate_images(pair.target, list(range(10)), guidance_scale=zoo_pair.CFG_SCALE,
                              sampling=SamplingConfig(do_sample=True, top_k=zoo_pair.TOP_K), vqvae=pair.vqvae,
                              generator=generator, **kw)
        return {"images": out.images, "seconds": out.seconds, "max_tvd": out.max_tvd}

    parts = _batches(args, batch, shards, seed)
    secs = sum(p["seconds"] for p in parts)
    speed = {"method": args.method, "seconds": round(secs, 2), "images_per_s": round(args.num / secs, 2),
             "max_tvd": round(max(p["max_tvd"] for p in parts), 4)}
    return torch.cat([p["images"] for p in parts]), torch.arange(10).repeat(args.num // 10), speed


def _pooled(runs: list[dict]) -> dict:
    """One report from scored sets of images: each score's mean (with `spread` per score when there are
    several sets), the speed over all sets."""
    out = dict(runs[0])
    if len(runs) == 1:
        return out
    spread = seed_spread(runs)
    out |= {key: s["mean"] for key, s in spread.items()}
    if "seconds" in out:
        secs = sum(r["seconds"] for r in runs)
        out |= {"seconds": round(secs, 2), "images_per_s": round(sum(r["images"] for r in runs) / secs, 2)}
    if "max_tvd" in out:
        out["max_tvd"] = max(r["max_tvd"] for r in runs)
    return out | {"spread": spread, "runs": runs}


def _eval(args: argparse.Namespace) -> int:
    # the inputs first: a bad file or number fails before any model loads
    if args.reference in DATASETS:
        reference, _ = load_digits_dataset(args.reference, "test")
    else:
        reference, _ = _npz_images(args.reference, "--reference")
    if args.images:
        given = _npz_images(args.images, "--images")
    elif args.num < 10 or args.num % 10:
        raise ValueError(f"--num: expected a positive multiple of 10, got {args.num}")
    pair = zoo_pair.load_pair()
    shards = current_shards()  # under accelerate launch / torchrun: this process draws its share of the batches
    runs = []
    for s in range(1 if args.images else args.seeds):  # a user's file is one set: no seeds to vary
        seed = args.seed + s * SEED_STRIDE
        if args.images:
            (images, labels), speed = given, {}
        elif args.method.startswith("continuous"):
            images, labels, speed = _generate_continuous(args, shards, seed)
        else:
            images, labels, speed = _generate_discrete(args, pair, shards, seed)
        if not shards.main:  # rank 0 scores and reports
            continue
        scores = image_scores(images, reference, pair.classifier, labels).as_dict()
        if args.features == "inception":
            scores["fid"] = inception_fid(images, reference)
        runs.append(speed | scores | {"fid_features": args.features, "images": len(images)}
                    | ({} if args.images else {"seed": seed}))
    if not shards.main:
        return 0
    result = _pooled(runs)
    spread = result.get("spread", {})
    for key, value in result.items():
        if key in ("spread", "runs"):
            continue
        if key in spread:
            print(f"{key:18s} {value:.4f} [{spread[key]['min']:.4f}-{spread[key]['max']:.4f}] over {len(runs)} seeds")
        else:
            print(f"{key:18s} {value:.4f}" if isinstance(value, float) else f"{key:18s} {value}")
    if spread:
        print(f"a difference from another method's scores means something only beyond twice the [min-max] spread "
              f"(fid: {2 * spread['fid']['spread']:.2f}; class_accuracy: "
              f"{2 * spread.get('class_accuracy', {}).get('spread', float('nan')):.4f})")
    if runs[0]["images"] < FID_FEW:
        print(f"note: FID from {runs[0]['images']} images is biased upward (it shrinks as the sample grows); compare "
              f"only runs of the same size, and use class accuracy for quality")
    if args.json:  # with the machine and commit, like every benchmark's file
        Path(args.json).write_text(json.dumps(result | {"machine": machine_info()}, indent=2))
    return 0


def register() -> None:
    register_generate_mode(generate_mode.MODE)
    register_trainer(train_draft.TRAINER)
    register_command("bench", "image-ar", "LANTERN (discrete) or continuous speculative decoding vs plain AR on the "
                     "zoo image models",
                     _add_bench, _bench)
    register_command("eval", "image", "FID / precision / recall / class accuracy of generated digits", _add_eval, _eval)
