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

from multispec import EngineConfig
from multispec.plugin import BenchOptions, describe, results, save_results

from ..harness import ImageCounts, measure, noise_line, quality_cell, quality_of, rounds_note, speedup_cell
from .generate import generate_continuous
from .head_sampler import HeadSampling
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
    """name -> keyword arguments of `generate_continuous` (besides target, labels, sampling, generator), with the
    row's grid points under "steps" (they go into its `HeadSampling`)."""
    out = {"ar": dict(steps=steps)}
    for s in PEER_STEPS:
        if s < steps:
            out[f"ar_steps{s}"] = dict(steps=s)
    out[f"spec_k{k}"] = dict(draft=pair.draft, tree=k, steps=steps)
    # the same chain on the fixed-shape step (`static.py`): every residual try at once, made for a GPU's graphs
    out[f"spec_k{k}_static"] = dict(draft=pair.draft, tree=k, steps=steps, engine=EngineConfig(step="static"))
    out[f"spec_k{k // 2}"] = dict(draft=pair.draft, tree=k // 2, steps=steps)
    for r, rk in RELAX:
        rk = rk or k  # None: the exact rows' k
        out[f"spec_k{rk}_relax{r:g}"] = dict(draft=pair.draft, tree=rk, steps=steps, rule=TrajectoryRatio(relax=r))
    out["draft_alone"] = dict(steps=steps, _model="draft")
    return out


def run(options: BenchOptions = BenchOptions(), guidance_scale: float | None = None, steps: int | None = None,
        prefill: float = 0.1, counts: ImageCounts = ImageCounts()) -> dict:
    """`bench image-ar --method continuous` on `mnist-patch-diffusion` (`options.weights`: a retrained folder of it).
    Defaults: the zoo's guidance scale, the target's denoising steps, temperature 1.0, `K` drafts per step;
    `prefill`: the share of patches generated plainly before speculation starts; `counts` and rounds as
    `multispec.image_ar.harness` says."""
    options.apply_threads()
    pair = load_pair(options.weights)
    scale = CFG_SCALE if guidance_scale is None else guidance_scale
    steps = steps or pair.target.config.steps
    temperature, k = options.temperature or 1.0, options.chain_k or K
    specs = methods(pair, k, steps)

    def generate(name, labels, generator):
        kw = dict(specs[name])
        model = pair.draft if kw.pop("_model", None) == "draft" else pair.target
        head = HeadSampling(steps=kw.pop("steps"), temperature=temperature, guidance_scale=scale)
        return generate_continuous(model, torch.tensor(labels), sampling=head, prefill=prefill, generator=generator,
                                   **kw)

    counted = {name: {"accepted": 0, "drafted": 0, "fallbacks": 0, "tv": []} for name in specs}

    def observe(name, i, out):
        c = counted[name]
        c["accepted"], c["drafted"] = c["accepted"] + out.accepted, c["drafted"] + out.drafted
        c["fallbacks"] += out.residual_fallbacks
        c["tv"].append(out.tv_per_token)

    def images(name, out):
        counted[name]["fallbacks"] += out.residual_fallbacks
        return out.images[:, None]

    run = measure(generate, images, pair.classifier, options, counts, dict.fromkeys(specs, "speculative"),
                  scored=list(specs), observe=observe)
    table, scores, spread = run.table, run.scores, run.spread
    rows = table["methods"]
    for name, row in rows.items():
        c = counted[name]
        row |= {"acceptance_rate": round(c["accepted"] / c["drafted"], 3) if c["drafted"] else None,
                "residual_fallbacks": c["fallbacks"], "tv_per_token": round(sum(c["tv"]) / len(c["tv"]), 4),
                "quality": quality_of(scores[name], scores["ar"], spread)}
    # the peer read beside the speculative row: the fewer-steps target closest to it in speed
    spec = rows[f"spec_k{k}"]["speedup"]
    peers = [name for name in rows if name.startswith("ar_steps")]
    peer = min(peers, key=lambda n: abs(rows[n]["speedup"] - spec)) if peers else None
    settings = {"guidance_scale": scale, "temperature": temperature, "steps": steps, "k": k, "prefill": prefill,
                "stop": pair.target.config.stop} | run.settings
    out = results("image-ar", settings, {"sampling": table}, method="continuous", pair=NAME,
                  ar_quality_over_seeds=run.shown, peer_at_equal_time=peer)
    print(markdown(out))
    return save_results(out, options.json_path)


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
