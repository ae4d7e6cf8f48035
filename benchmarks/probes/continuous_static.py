"""The continuous pair's fixed-shape step against its eager loop, speed only (batch 1, `mnist-patch-diffusion`):
plain AR, the exact chain on the eager loop and the same chain on the fixed-shape step, interleaved image by image
through the benchmark recorder (the speed phase of `multispec bench image-ar --method continuous`, whose quality
phase this leaves out: the two chains follow the same law, tested in tests/image_ar/test_continuous_static.py).

    python benchmarks/probes/continuous_static.py [--images 40] [--rounds 4] [--k 4] [--threads 2] [--json PATH]
"""

import argparse

import torch

from multispec.bench.machine import describe, save_results
from multispec.bench.recorder import results
from multispec.image_ar.harness import timed_speed
from multispec.image_ar.continuous.bench import methods
from multispec.image_ar.continuous.generate import generate_continuous
from multispec.image_ar.continuous.head_sampler import HeadSampling
from multispec.image_ar.continuous.zoo_pair import CFG_SCALE, NAME, load_pair


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=40)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    pair = load_pair()
    steps = pair.target.config.steps
    every = methods(pair, args.k, steps)
    specs = {name: every[name] for name in ("ar", f"spec_k{args.k}", f"spec_k{args.k}_static")}
    counts = {name: [0, 0] for name in specs}

    def observe(name, i, out):
        counts[name][0] += out.accepted
        counts[name][1] += out.drafted

    def generate(i, kw):
        kw = dict(kw)
        head = HeadSampling(steps=kw.pop("steps"), guidance_scale=CFG_SCALE)
        return generate_continuous(pair.target, torch.tensor([i % 10]), sampling=head,
                                   generator=torch.Generator().manual_seed(i), **kw)

    calls = {name: (lambda i, kw=kw: generate(i, kw)) for name, kw in specs.items()}
    table = timed_speed(calls, "ar", args.images, args.rounds, observe)
    for name, row in table["methods"].items():
        accepted, drafted = counts[name]
        row["acceptance_rate"] = round(accepted / drafted, 3) if drafted else None
    out = results("continuous-static", {"images": args.images, "rounds": args.rounds, "k": args.k,
                                        "guidance_scale": CFG_SCALE, "threads": torch.get_num_threads()},
                  {"sampling": table}, pair=NAME)
    print(f"{NAME} on {describe(out['machine'])}")
    for name, row in table["methods"].items():
        lo, hi = row["speedup_spread"]
        print(f"  {name}: {row['images_per_s']:.2f} images/s, {row['speedup']:.2f}x [{lo:.2f}-{hi:.2f}] vs ar, "
              f"acceptance {row['acceptance_rate']}, mean accepted length {row['mean_accepted_length']}")
    save_results(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
