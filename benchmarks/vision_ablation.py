"""Ablations of the VLM drafters on the zoo VLM (same training data, steps and batch size for every row):
compressor choice (the SpecVLM drafter with its gate forced to one branch at inference), number of ViSpec
queries, with and without the global image vector, with and without online distillation (teacher
distributions on the target's own answers vs. hard labels on the data's reference answers).

    python benchmarks/vision_ablation.py --target DIR --out DIR [--steps 400] [--answers 2000] [--json PATH]

Mean accepted length is deterministic (greedy), so this measures it on the held-out bench questions without
timing; speeds are `multispec bench vision`'s job. Drafters already trained in --out are reused.
"""

from __future__ import annotations

import argparse
import json
import pickle
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from multispec import DynamicTree, Prompt, speculative_generate
from multispec.bench.machine import machine_info
from multispec.targets import as_target
from multispec.vision.distill import DistillConfig
from multispec.vision.drafter import VisionEagleDrafter, VisionEagleHead
from multispec.vision.vqa_synth import generate_vqa
from multispec.vision.bench import bench_items
from multispec.vision.zoo_pair import DRAFTERS, TRAIN_SEED, drafter_config, generate_answers, train_drafter
from multispec.vision.zoo_vlm import EOS, PAD, VQAProcessor, load_vlm

VARIANTS = {  # name -> (drafter config overrides, online distillation)
    "eagle": (dict(mode="eagle"), True),
    "vispec": (dict(mode="vispec"), True),
    "specvlm": (dict(mode="specvlm"), True),
    "vispec_q5": (dict(mode="vispec", num_queries=5), True),
    "vispec_no_global": (dict(mode="vispec", global_vector=False), True),
    "vispec_offline": (dict(mode="vispec"), False),
}


def accepted_lengths(model, drafter, items, n: int, trees) -> dict[str, float]:
    processor = VQAProcessor()
    out = {}
    for label, tree in trees.items():
        committed = forwards = 0
        for item in items:
            inputs = processor(item.image, item.question)
            res = speculative_generate(model, drafter, max_new_tokens=n, tree=tree, eos_token_id=EOS,
                                       pad_token_id=PAD, **inputs)
            committed += res.stats.committed
            forwards += sum(s.rows for s in res.stats.steps)
        out[label] = round(committed / forwards, 3)
    return out


@torch.no_grad()
def gate_choices(model, head, items) -> dict[str, int]:
    """How often the SpecVLM gate picks each branch on `items`."""
    drafter = VisionEagleDrafter(head, model)
    target = as_target(model)
    picks = []
    for item in items:
        prompt = Prompt.build(**VQAProcessor()(item.image, item.question))
        drafter.start(prompt, target.prefill(prompt, drafter.feature_request).features)
        picks.append(head.vision.branches[int(drafter.last_choice[0].argmax())])
    return {b: picks.count(b) for b in head.vision.branches if picks.count(b)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--answers", type=int, default=2000)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_vlm(args.target)
    samples = generate_vqa(args.answers, seed=TRAIN_SEED + 1)
    cache = out / "target_answers.pkl"
    if cache.exists():
        answered = pickle.loads(cache.read_bytes())
    else:
        answered = generate_answers(model, samples)
        cache.write_bytes(pickle.dumps(answered))
    base = DistillConfig(steps=args.steps)
    reports = {}
    for name in args.variants.split(","):
        overrides, online = VARIANTS[name]
        folder = out / name
        if not (folder / "eagle.safetensors").exists():
            data = answered if online else samples  # offline: the data's reference answers, hard labels
            reports[name] = train_drafter(model, data, folder, drafter_config(**overrides),
                                          replace(base, online=online))
    items = bench_items(args.questions)
    trees = {"chain_k4": 4, "dynamic_tree": DynamicTree(depth=4, topk=4, total=15)}
    rows = {}
    for name in tqdm(args.variants.split(","), desc="ablation", unit="drafter"):
        head = VisionEagleHead.load(out / name)
        rows[name] = accepted_lengths(model, VisionEagleDrafter(head, model), items, args.max_new_tokens, trees)
        if head.vision.mode == "specvlm":
            rows[name]["gate_choices"] = gate_choices(model, head, items)
            for k, branch in enumerate(head.vision.branches):  # the gate forced to one branch at inference
                forced = VisionEagleHead.load(out / name)
                with torch.no_grad():
                    forced.compressor.gate.weight.zero_()
                    forced.compressor.gate.bias.fill_(-1e4)
                    forced.compressor.gate.bias[k] = 0.0
                rows[f"specvlm_forced_{branch}"] = accepted_lengths(model, VisionEagleDrafter(forced, model), items,
                                                                    args.max_new_tokens, trees)
    result = {"machine": machine_info(), "target": args.target, "steps": args.steps, "answers": args.answers,
              "questions": len(items), "max_new_tokens": args.max_new_tokens,
              "mean_accepted_length_definition": "tokens committed per target forward, including the bonus token",
              "training": reports, "rows": rows, "drafters_compared": list(DRAFTERS)}
    print(json.dumps(rows, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
