"""Can an EAGLE-style draft make exact continuous speculative decoding pay? (`PatchEagle`, which predicts the
target's conditions from its features and samples with the target's own head.)

On a `PatchAR` pair folder (default: the shipped `mnist-patch-diffusion`) it measures, on this machine:
- per-token costs at batch 1, guided: the target's transformer (one token on the cache), a head sample
  (the whole trajectory), one `PatchEagle` step;
- the teacher-forced acceptance α = E[min(1, p(τ)/q(τ))] of the EAGLE draft on 100 held-out digits (true
  prefixes; `rollout`: the draft reads its own predicted features throughout) and, when the folder has a
  small `PatchAR` draft, that draft's;
- speed at batch 1, methods interleaved image by image: plain AR, the EAGLE draft at each `--k`, the small
  draft at k = 2 and 4 (exact rule throughout): images/s, speedup, acceptance, step split.

    python benchmarks/studies/continuous_eagle.py [--pair DIR] [--eagle DIR | --steps 6000 --eagle-layers 1] [--save-eagle DIR]
        [--k 2,3,4] [--timing-images 10] [--threads 2] [--json PATH]
    python benchmarks/studies/continuous_eagle.py --deepen DIR ...   # first build the deepened target of `deepen`
        (24 layers, lean head, 2,000 steps; ~30 min) into DIR and measure on it
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from multispec import zoo
from multispec.bench.machine import describe, machine_info, save_results
from multispec.image_ar.continuous.drafters import PatchEagle
from multispec.image_ar.continuous.eagle_train import PatchEagleRecipe, teacher_forced_acceptance, train_eagle
from multispec.image_ar.continuous.generate import generate_continuous
from multispec.image_ar.continuous.head_sampler import HeadSampling
from multispec.image_ar.continuous.zoo_pair import (CFG_SCALE, NAME, ModelRecipe, PatchARConfig, deepen, heldout_loss,
                                                     load_model, save_half, train_model)
from multispec.image_ar.data import load_digits_dataset
from multispec.image_ar.continuous.diffusion_head import Trajectory
from multispec.image_ar.continuous.head_sampler import HeadSampler

DEEP = dict(layers=24, head_kind="lean", head_width=256, head_blocks=2)


def build_deepened(folder: Path) -> dict:
    """The shipped target deepened to 24 layers with a lean head, trained 2,000 steps (lr 5e-4, seed 2)."""

    base = load_model(zoo.path(NAME) / "target")
    config = PatchARConfig(**{**asdict(base.config), **DEEP})
    images, labels = load_digits_dataset("mnist", "train")
    t0 = time.perf_counter()
    model, losses = train_model(config, images, labels, ModelRecipe(steps=2000, batch_size=32, lr=5e-4, seed=2),
                                desc="deepened target", init=deepen(base, config))
    save_half(model, folder / "target")
    test_images, test_labels = load_digits_dataset("mnist", "test")
    return {"config": asdict(config), "steps": 2000, "seconds": round(time.perf_counter() - t0),
            "heldout_loss": heldout_loss(load_model(folder / "target"), test_images, test_labels)}


@torch.no_grad()
def costs(target, eagle: PatchEagle, reps: int = 200) -> dict:
    """Milliseconds per token at batch 1 with guidance (two rows): transformer, head sample, EAGLE step."""
    sampler = HeadSampler(target, Trajectory.make(target.config.steps, target.config.stop), CFG_SCALE)
    labels = torch.tensor([3, target.null_class])
    cache = target.new_cache(2)
    z = target.transform(target.inputs(labels, None, 0), cache)
    cache.commit(1)
    x = torch.zeros(2, 1, target.config.token_dim)
    cond = sampler.conditions(z[:1, 0], z[1:, 0])
    ecache = eagle.new_cache(2)

    def timed(fn) -> float:
        for _ in range(10):
            fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return round((time.perf_counter() - t0) / reps * 1e3, 3)

    return {"transformer_ms": timed(lambda: target.transform(target.inputs(None, x, 1), cache)),
            "head_sample_ms": timed(lambda: sampler.sample(cond, sampler.noise(1, None))),
            "eagle_step_ms": timed(lambda: eagle(z, x, ecache))}


def speed(target, drafts: dict, images: int) -> dict:
    """name -> (draft, k) rows timed at batch 1, interleaved per image (after one warm-up each)."""
    rows = {name: {"seconds": 0.0, "accepted": 0, "drafted": 0, "fallbacks": 0, "steps": 0, "committed": 0,
                   "split": [0.0, 0.0, 0.0]} for name in drafts}

    def run(name, label, seed):
        draft, k = drafts[name]
        return generate_continuous(target, torch.tensor([label]), draft, tree=k,
                                   sampling=HeadSampling(guidance_scale=CFG_SCALE),
                                   generator=torch.Generator().manual_seed(seed))

    for name in drafts:
        run(name, 0, 10_000)
    for i in range(images):
        for name in drafts:
            out = run(name, i % 10, i)
            row = rows[name]
            row["seconds"] += out.seconds
            row["accepted"] += out.accepted
            row["drafted"] += out.drafted
            row["fallbacks"] += out.residual_fallbacks
            if out.stats is not None:
                row["steps"] += len(out.stats.steps)
                row["committed"] += out.stats.committed
                for j, key in enumerate(("draft_s", "verify_s", "commit_s")):
                    row["split"][j] += getattr(out.stats, key)
    base = rows["ar"]["seconds"]
    result = {}
    for name, row in rows.items():
        entry = {"images_per_s": round(images / row["seconds"], 3), "speedup_vs_ar": round(base / row["seconds"], 3)}
        if row["drafted"]:
            entry |= {"acceptance_rate": round(row["accepted"] / row["drafted"], 3),
                      "mean_accepted_length": round(row["committed"] / row["steps"], 3),
                      "residual_fallbacks": row["fallbacks"],
                      "step_split_ms": [round(v / row["steps"] * 1e3, 2) for v in row["split"]]}
        result[name] = entry
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default=None, help="a pair folder with target/ (and a small PatchAR draft/)")
    parser.add_argument("--deepen", default=None, help="build the deepened target into this folder first")
    parser.add_argument("--eagle", default=None, help="a trained PatchEagle folder (else one is trained)")
    parser.add_argument("--steps", type=int, default=6000, help="EAGLE training steps when --eagle is not given")
    parser.add_argument("--eagle-layers", type=int, default=1, help="layers of the trained EAGLE draft")
    parser.add_argument("--save-eagle", default=None)
    parser.add_argument("--k", default="2,3,4")
    parser.add_argument("--timing-images", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    result = {"machine": machine_info(), "guidance_scale": CFG_SCALE}
    if args.deepen:
        folder = Path(args.deepen)
        result["deepened_target"] = build_deepened(folder)
    else:
        folder = Path(args.pair) if args.pair else zoo.path(NAME)
    target = load_model(folder / "target")
    small = None
    draft_config = folder / "draft" / "config.json"
    if draft_config.exists() and "head_width" in json.loads(draft_config.read_text()):  # a PatchAR draft model
        small = load_model(folder / "draft")
    result["pair"] = str(folder) if args.pair or args.deepen else NAME
    result["target"] = asdict(target.config)
    if args.eagle:
        eagle = PatchEagle.from_pretrained(args.eagle).float().eval()
        result["eagle"] = {"from": args.eagle}
    else:
        images, labels = load_digits_dataset("mnist", "train")
        t0 = time.perf_counter()
        eagle, losses = train_eagle(target, images, labels, PatchEagleRecipe(steps=args.steps, lr=1e-3, seed=3),
                                    guidance_scale=CFG_SCALE, layers=args.eagle_layers)
        result["eagle"] = {"layers": args.eagle_layers, "steps": args.steps, "pool": 6144,
                           "seconds": round(time.perf_counter() - t0), "final_loss": round(sum(losses[-50:]) / 50, 5)}
        if args.save_eagle:
            eagle.half().save_pretrained(args.save_eagle)
            eagle = PatchEagle.from_pretrained(args.save_eagle).float().eval()
    test_images, test_labels = load_digits_dataset("mnist", "test")
    held = test_images[:100], test_labels[:100]
    result["costs"] = costs(target, eagle)
    result["alpha_eagle"] = round(teacher_forced_acceptance(target, eagle, *held, CFG_SCALE), 4)
    result["alpha_eagle_rollout"] = round(teacher_forced_acceptance(target, eagle, *held, CFG_SCALE, rollout=True), 4)
    rows = {"ar": (None, 4)}
    for k in (int(v) for v in args.k.split(",")):
        rows[f"eagle_k{k}"] = (eagle, k)
    if small is not None:
        rows |= {"small_draft_k2": (small, 2), "small_draft_k4": (small, 4)}
    result["timing_images"] = args.timing_images
    result["methods"] = speed(target, rows, args.timing_images)
    print(f"{result['pair']} ({describe(result['machine'])}): costs {result['costs']}; teacher-forced acceptance "
          f"of the EAGLE draft {result['alpha_eagle']} (rollout {result['alpha_eagle_rollout']})")
    for name, row in result["methods"].items():
        print(f"  {name}: {row}")
    save_results(result, args.json)


if __name__ == "__main__":
    main()
