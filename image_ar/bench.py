"""`multispec bench image-ar --method lantern`: plain AR, exact speculative decoding (chain and dynamic
tree) and LANTERN / LANTERN++ on the zoo's `mnist-vq-gpt`, at the papers' sampling setting (temperature
1, top-k, classifier-free guidance).

Two phases, so speed and quality are each measured where they are meaningful:
- speed, at batch 1 (the papers' latency setting), through the one benchmark recorder
  (`multispec.bench.recorder`): a warm-up on the first timed image, then the methods interleaved image by
  image, the timed images split into rounds; per method `images_per_s`, `speedup` against plain AR through
  the same target adapter (`ar`; `ar_hf` is the model's own `transformers` forward in a plain loop, for
  reference) as the median of the per-round ratios with their [min, max] spread, `tokens_per_s`,
  `mean_accepted_length` (tokens per target forward, the bonus token included) and the step split;
- quality, at batch 10 (one image per class per batch; not timed): under each row's `quality`, `fid` (on
  the zoo classifier's features, against the 1,000 held-out MNIST digits), precision / recall, class
  accuracy, the IS-style class confidence and `fid_vs_ar`; `max_tvd` is the largest per-token TVD the rule
  reported over both phases.
A greedy check confirms the exact rule reproduces plain greedy AR token for token (`greedy_identical`).
"""

from __future__ import annotations

import torch

from multispec import DynamicTree, SamplingConfig, StaticTree
from multispec.plugin import BenchOptions, describe, results, save_results

from .generate import generate_ar, generate_images
from .harness import ImageCounts, measure, noise_line, quality_cell, quality_of, rounds_note, speedup_cell
from .relaxed import Relaxed
from .zoo_pair import CFG_SCALE, TOP_K, image_drafter, load_pair

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


# what the columns of `markdown` mean, printed under the table
LEGEND = ("mean acc. len: image codes committed per target forward (the correction included); class acc: the "
          "classifier's accuracy on the generated digits (the headline quality figure); FID: against the reference "
          "digits in the classifier's feature space, FID vs AR: the row's FID over plain AR's on the same seeds; * a "
          "difference from plain AR beyond twice its spread over seeds (the line above the table); max TVD: the "
          "largest probability mass a relaxed rule moved at one code (0: lossless)")


def run(options: BenchOptions = BenchOptions(), method: str = "lantern", guidance_scale: float | None = None,
        top_k: int | None = None, counts: ImageCounts = ImageCounts()) -> dict:
    """`bench image-ar`'s discrete rows on `mnist-vq-gpt` (`options.weights`: a retrained folder of it). Defaults:
    the zoo's guidance scale and top-k, temperature 1.0, chain length 6, a 5/4/16 dynamic tree; `counts` and
    rounds as `multispec.image_ar.harness` says."""
    if method != "lantern":
        raise ValueError(f"--method: {method!r} is not built yet (available: lantern)")
    options.apply_threads()
    pair = load_pair(options.weights)
    scale = CFG_SCALE if guidance_scale is None else guidance_scale
    top_k = TOP_K if top_k is None else top_k
    temperature, chain_k = options.temperature or 1.0, options.chain_k or 6
    tree = options.tree or DynamicTree(depth=5, topk=4, total=16)
    specs = methods(pair, tree, chain_k)
    sampling = dict(guidance_scale=scale, sampling=SamplingConfig(do_sample=True, top_k=top_k, temperature=temperature))

    def generate(name, labels, generator):
        kw = specs[name]
        if kw is None:
            return generate_ar(pair.target, labels, generator=generator, **sampling)
        return generate_images(pair.target, labels, generator=generator, **kw, **sampling)

    # greedy: the exact rule reproduces plain greedy AR
    greedy_labels = list(range(10))
    want = generate_ar(pair.target, greedy_labels, guidance_scale=scale, sampling=SamplingConfig()).codes
    greedy_identical = all(torch.equal(generate_images(pair.target, greedy_labels, sampling=SamplingConfig(),
                                                       guidance_scale=scale, **specs[m]).codes, want)
                           for m in ("ar", f"exact_chain_k{chain_k}", "exact_tree", f"draft_model_exact_chain_k{chain_k}"))

    tokens, max_tvd = dict.fromkeys(specs, 0), dict.fromkeys(specs, 0.0)

    def observe(name, i, out):
        tokens[name] += out.codes.numel()
        max_tvd[name] = max(max_tvd[name], out.max_tvd)

    def images(name, out):
        max_tvd[name] = max(max_tvd[name], out.max_tvd)
        return pair.vqvae.decode(out.codes)

    roles = {name: "control" if name == "ar_hf" else "speculative" for name in specs}
    run = measure(generate, images, pair.classifier, options, counts, roles,
                  scored=[m for m in specs if specs[m] is not None], observe=observe)
    _fill_rows(run.table["methods"], tokens, max_tvd, run.scores, run.spread, chain_k)
    settings = {"guidance_scale": scale, "top_k": top_k, "temperature": temperature, "tree": repr(tree),
                "chain_k": chain_k, "neighbours_k": NEIGHBOURS} | run.settings
    out = results("image-ar", settings, {"sampling": run.table}, method=method, pair="mnist-vq-gpt",
                  greedy_identical=greedy_identical, ar_quality_over_seeds=run.shown)
    print(markdown(out))
    return save_results(out, options.json_path)


def _fill_rows(rows: dict, tokens: dict, max_tvd: dict, scores: dict, spread: dict, chain_k: int) -> None:
    """The recorder's rows plus this bench's figures: token rate, largest TVD, quality, LANTERN's gain in
    accepted length over the exact rows."""
    for name, row in rows.items():
        row |= {"tokens": tokens[name], "tokens_per_s": round(tokens[name] / row["seconds"], 2),
                "max_tvd": round(max_tvd[name], 4)}
        if name in scores:
            row["quality"] = quality_of(scores[name], scores["ar"], spread)
    exact_chain = rows[f"exact_chain_k{chain_k}"]["mean_accepted_length"]
    exact_best = max(rows[m]["mean_accepted_length"] for m in (f"exact_chain_k{chain_k}", "exact_tree", "exact_static"))
    for name, row in rows.items():
        if "lantern" in name and row["mean_accepted_length"]:
            row["accepted_length_vs_exact_chain"] = round(row["mean_accepted_length"] / exact_chain, 3)
            row["accepted_length_vs_best_exact"] = round(row["mean_accepted_length"] / exact_best, 3)


def markdown(results: dict) -> str:
    table = results["tables"]["sampling"]
    lines = [f"image-ar / {results['method']} on {results['pair']} ({describe(results['machine'])})",
             f"settings: {results['settings']}", f"greedy_identical: {results['greedy_identical']}",
             noise_line(results["ar_quality_over_seeds"]), "",
             "| method | images/s | tokens/s | vs AR [spread] | mean acc. len | class acc | FID | FID vs AR | max TVD |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in table["methods"].items():
        q = r.get("quality", {})
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        rel = f"{q['fid_vs_ar']:.2f}" if q else "-"
        lines.append(f"| {name} | {r['images_per_s']:.2f} | {r['tokens_per_s']:.0f} | {speedup_cell(r)} | {mal} "
                     f"| {quality_cell(q, 'class_accuracy', '.3f')} | {quality_cell(q, 'fid', '.1f')} | {rel} "
                     f"| {r['max_tvd']:.3f} |")
    lines += ["", rounds_note(table), LEGEND]
    return "\n".join(lines)
