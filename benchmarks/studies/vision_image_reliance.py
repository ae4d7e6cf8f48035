"""How much the zoo VLM and its shipped drafters depend on the image (the question behind the ViSpec /
SpecVLM comparison: a compressor can only help a drafter that needs the image).

    python benchmarks/studies/vision_image_reliance.py [--questions 16] [--json PATH]
    python benchmarks/studies/vision_image_reliance.py --processor words --pair DIR --target-only   # the word pair

Two measurements on the held-out bench questions, greedy, no timing:
- target: how often the answer changes when the question is asked about another image of the same kind
  (same chart type, same question text), the share of each answer before the first change, the share of
  the answers' tokens another image changes (outside the two answers' longest common subsequence), and the
  short-answer VQA accuracy with the right image against the swapped one;
- drafters: mean accepted length (chain k=4, k=8 and the default dynamic tree) of each shipped drafter
  shown the prompt's image, another image of the same kind (in distribution: the drop measures how much the
  drafter uses this image's content), and zeros (out of distribution). The target always sees the prompt's
  own image, so the output is unchanged; only the drafter's view differs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from multispec import Prompt, zoo
from multispec.bench.machine import machine_info
from multispec.targets import FeatureRequest, as_target
from multispec.vision.bench import bench_items
from multispec.vision.drafters import VisionEagleDrafter
from multispec.vision.evaluate import CHAIN_K, TREE, accepted_length
from multispec.vision.vqa_metrics import vqa_accuracy
from multispec.vision.answer_change import answer_change
from multispec.vision.vqa_synth import generate_vqa
from multispec.vision.zoo_pair import NAME, TEST_SEED, load_drafters
from multispec.vision.word_vqa import WordVQAProcessor
from multispec.vision.zoo_vlm import VQAProcessor, load_vlm


def image_key(pixel_values: torch.Tensor) -> int:
    return hash(pixel_values.cpu().numpy().tobytes())


class ImageSwappedDrafter(VisionEagleDrafter):
    """The same head, shown `substitutes[image_key(prompt's pixels)]` (another image's projected embeddings,
    or zeros) instead of the prompt's image; the target still sees the prompt's own image."""

    def __init__(self, head, target, substitutes: dict[int, torch.Tensor]):
        super().__init__(head, target)
        self.substitutes = substitutes

    def start(self, prompt, features=None):
        if features is not None and features.image_embeds is not None:
            sub = self.substitutes[image_key(prompt.inputs["pixel_values"])]
            features = replace(features, image_embeds=sub.to(features.image_embeds))
        super().start(prompt, features)


@torch.no_grad()
def answer(model, processor, inputs, n: int) -> list[int]:
    eos = processor.eos_token_id
    ids = model.generate(**inputs, max_new_tokens=n, do_sample=False, eos_token_id=eos,
                         pad_token_id=processor.pad_token_id)
    ids = ids[0, inputs["input_ids"].shape[1]:].tolist()
    return ids[:ids.index(eos)] if eos in ids else ids


def same_kind_partner(kinds: list[str]) -> list[int | None]:
    """For each item, the next item (cyclically) of the same kind, or None."""
    out = []
    for i, kind in enumerate(kinds):
        same = [j for j, k in enumerate(kinds) if k == kind]
        out.append(same[(same.index(i) + 1) % len(same)] if len(same) > 1 else None)
    return out


@torch.no_grad()
def image_embeds(model, inputs) -> torch.Tensor:

    return as_target(model).prefill(Prompt.build(**inputs), FeatureRequest(image_embeds=True)).features.image_embeds


def target_reliance(model, processor, items, partner: list[int | None], n: int) -> dict:
    """Answers to each question about its own image and about another image of the same kind."""
    differ, prefix, right, swapped, pairs = [], [], [], [], []
    for i, item in enumerate(items):
        if partner[i] is None:
            continue
        own = answer(model, processor, processor(item.image, item.question), n)
        alt = answer(model, processor, processor(items[partner[i]].image, item.question), n)
        same = next((j for j, (a, b) in enumerate(zip(own, alt)) if a != b), min(len(own), len(alt)))
        differ.append(own != alt)
        pairs.append((own, alt))
        prefix.append(same / max(1, len(own)))
        if item.short:
            right.append(vqa_accuracy(processor.decode(own).strip(), item.answers))
            swapped.append(vqa_accuracy(processor.decode(alt).strip(), item.answers))
    mean = lambda xs: round(sum(xs) / max(1, len(xs)), 3)  # noqa: E731
    return {"questions": len(differ), "answers_changed_by_another_image": mean(differ),
            "shared_prefix_fraction": mean(prefix),
            "answer_tokens": answer_change(pairs),  # token-weighted: LCS, first change
            "short_questions": len(right),
            "short_vqa_accuracy_own_image": mean(right), "short_vqa_accuracy_swapped_image": mean(swapped)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--target-questions", type=int, default=96,
                        help="questions for the target's measurement (more: short answers are cheap)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--pair", default=None, help="a retrained pair's folder (default: the shipped vqa-llava)")
    parser.add_argument("--processor", choices=["bytes", "words"], default="bytes",
                        help="the pair's tokens: bytes (vqa-llava) or words (vqa-words-llava, 256 image tokens)")
    parser.add_argument("--target-only", action="store_true",
                        help="the target's measurement alone (before any drafter is trained)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)


    pair = Path(args.pair) if args.pair else zoo.path(NAME)
    model = load_vlm(pair / "target")
    processor = VQAProcessor() if args.processor == "bytes" else WordVQAProcessor()
    eos, pad = processor.eos_token_id, processor.pad_token_id
    many = bench_items(args.target_questions)
    many_kinds = [s.kind for s in generate_vqa(args.target_questions, seed=TEST_SEED)]
    items = bench_items(args.questions)
    kinds = [s.kind for s in generate_vqa(args.questions, seed=TEST_SEED)]  # the same samples as bench_items
    partner = same_kind_partner(kinds)
    keep = [i for i in range(len(items)) if partner[i] is not None]
    prompts = [processor(items[i].image, items[i].question) for i in keep]
    own = [image_embeds(model, processor(item.image, item.question)) for item in items]
    keys = [image_key(p["pixel_values"]) for p in prompts]
    swaps = {"image_swapped": {k: own[partner[i]] for k, i in zip(keys, keep)},
             "image_zeroed": {k: torch.zeros_like(own[i]) for k, i in zip(keys, keep)}}
    trees = {"chain_k4": 4, f"chain_k{CHAIN_K}": CHAIN_K,
             f"dynamic_tree_{TREE.depth}_{TREE.topk}_{TREE.total}": TREE}
    rows = {}
    for name, drafter in tqdm({} if args.target_only else load_drafters(model, pair).items(), desc="drafters",
                              unit="drafter"):
        views = {name: drafter} | {f"{name}_{label}": ImageSwappedDrafter(drafter.head, model, subs)
                                    for label, subs in swaps.items()}
        for label, view in views.items():
            rows[label] = {t: accepted_length(model, view, prompts, args.max_new_tokens, tree, eos, pad)
                           for t, tree in trees.items()}
    result = {"machine": machine_info(), "pair": str(pair), "processor": args.processor, "questions": len(items),
              "max_new_tokens": args.max_new_tokens,
              "mean_accepted_length_definition": "tokens committed per target forward, including the bonus token",
              "questions_with_a_same_kind_partner": len(keep),
              "target": target_reliance(model, processor, many, same_kind_partner(many_kinds), args.max_new_tokens), "drafters": rows}
    print(json.dumps({k: result[k] for k in ("target", "drafters")}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
