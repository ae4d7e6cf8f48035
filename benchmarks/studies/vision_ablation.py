"""Ablations of the VLM drafters on the zoo VLM (same training data, steps and batch size for every row):
compressor choice (the SpecVLM drafter with its gate forced to one branch at inference), number of ViSpec
queries, with and without the global image vector, with and without online distillation (teacher
distributions on the target's own answers vs. hard labels on the data's reference answers).

    python benchmarks/studies/vision_ablation.py --out DIR [--pair DIR] [--steps 400] [--answers 2000] [--json PATH]
        [--variants LIST] [--skip-pair]

The training-budget sweep retrains the pair's own three recipes with fewer steps, e.g. `--steps 100
--variants eagle_retrained,vispec_retrained,specvlm_retrained --skip-pair`: the papers' gain over plain
EAGLE might live where the draft's training is scarce.

The pair's own drafters (`eagle`, `vispec`, `specvlm`: the shipped `vqa-llava`, or a retrained one with
--pair) are the main rows; the other variants are trained into --out with the same recipe (and reused when
already there). Mean accepted length is deterministic (greedy), so this measures it on the held-out bench
questions without timing; speeds are `multispec bench vision`'s job.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path

import torch
from tqdm.auto import tqdm

from multispec import zoo
from multispec.bench.machine import machine_info
from multispec.vision.bench import bench_items
from multispec.vision.distill import DistillConfig
from multispec.vision.drafters import VisionEagleDrafter, VisionEagleHead
from multispec.vision.evaluate import CHAIN_K, TREE, accepted_length, gate_choices
from multispec.vision.vqa_synth import generate_vqa
from multispec.vision.zoo_pair import (ANSWERS, DRAFT_STEPS, DRAFTERS, NAME, TRAIN_SEED, drafter_config,
                                       generate_answers, train_drafter)
from multispec.vision.zoo_vlm import EOS, PAD, VQAProcessor, load_vlm

VARIANTS = {  # name -> (drafter config overrides, online distillation); the pair's drafters are not retrained
    "vispec_q5": (dict(mode="vispec", num_queries=5), True),
    "vispec_q17": (dict(mode="vispec", num_queries=17), True),
    "vispec_no_global": (dict(mode="vispec", global_vector=False), True),
    "vispec_offline": (dict(mode="vispec"), False),
    "eagle_offline": (dict(mode="eagle"), False),
    # the pair's three drafters' own recipes, retrained (with --steps below the pair's: the training-budget sweep)
    "eagle_retrained": (dict(mode="eagle"), True),
    "vispec_retrained": (dict(mode="vispec"), True),
    "specvlm_retrained": (dict(mode="specvlm"), True),
}
ABLATION = ("vispec_q5", "vispec_q17", "vispec_no_global", "vispec_offline", "eagle_offline")  # the default run


def forced(folder: Path, k: int) -> VisionEagleHead:
    """The SpecVLM head with its gate forced to branch `k` at inference."""
    head = VisionEagleHead.load(folder)
    with torch.no_grad():
        head.compressor.gate.weight.zero_()
        head.compressor.gate.bias.fill_(-1e4)
        head.compressor.gate.bias[k] = 0.0
    return head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where the extra variants are trained")
    parser.add_argument("--pair", default=None, help="a retrained vqa-llava folder (default: the shipped one)")
    parser.add_argument("--steps", type=int, default=DRAFT_STEPS)
    parser.add_argument("--answers", type=int, default=ANSWERS)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--variants", default=",".join(ABLATION), help=f"any of {list(VARIANTS)}")
    parser.add_argument("--skip-pair", action="store_true", help="measure only the variants, not the pair's drafters")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = Path(args.pair) if args.pair else zoo.path(NAME)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_vlm(pair / "target")
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; choose from {list(VARIANTS)}")
    reports = {}
    if variants:
        samples = generate_vqa(args.answers, seed=TRAIN_SEED + 1)  # the pair's drafters' training questions
        cache = out / "target_answers.pkl"
        if cache.exists():
            answered = pickle.loads(cache.read_bytes())
        else:
            answered = generate_answers(model, samples)
            cache.write_bytes(pickle.dumps(answered))
        for name in variants:
            overrides, online = VARIANTS[name]
            data = answered if online else samples  # offline: the data's reference answers, hard labels
            reports[name] = train_drafter(model, data, out / name, drafter_config(**overrides),
                                          DistillConfig(steps=args.steps, online=online))
    processor = VQAProcessor()
    prompts = [processor(item.image, item.question) for item in bench_items(args.questions)]
    trees = {"chain_k4": 4, f"chain_k{CHAIN_K}": CHAIN_K, f"dynamic_tree_{TREE.depth}_{TREE.topk}_{TREE.total}": TREE}

    def lengths(head: VisionEagleHead) -> dict[str, float]:
        drafter = VisionEagleDrafter(head, model)
        return {label: accepted_length(model, drafter, prompts, args.max_new_tokens, tree, EOS, PAD)
                for label, tree in trees.items()}

    folders = {} if args.skip_pair else {name: pair / name for name in DRAFTERS}
    folders |= {name: out / name for name in variants}
    rows = {}
    for name, folder in tqdm(folders.items(), desc="ablation", unit="drafter"):
        head = VisionEagleHead.load(folder)
        rows[name] = lengths(head)
        if head.vision.mode == "specvlm":
            rows[name]["gate_choices"] = gate_choices(model, VisionEagleDrafter(head, model), prompts)
        if head.vision.mode == "specvlm" and name in DRAFTERS:  # forced branches: the pair's drafter only
            for k, branch in enumerate(head.vision.branches):
                rows[f"specvlm_forced_{branch}"] = lengths(forced(folder, k))
    result = {"machine": machine_info(), "pair": str(pair), "steps": args.steps, "answers": args.answers,
              "questions": len(prompts), "max_new_tokens": args.max_new_tokens,
              "mean_accepted_length_definition": "tokens committed per target forward, including the bonus token",
              "training": reports, "rows": rows, "drafters_compared": list(DRAFTERS)}
    print(json.dumps(rows, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
