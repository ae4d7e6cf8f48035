"""How much of an answer the image decides, measured on the data before any model is trained (the first step of
the word-level VLM pair: a drafter can only gain from the image where the image decides the tokens it guesses).

    python benchmarks/studies/vision_answer_reliance.py [--samples 2000] [--json PATH]

For each question of the procedural VQA data (`multispec.vision.vqa_synth`), another image of the same kind
asked the same question gives another reference answer. Per tokenizer (bytes: the `vqa-llava` pair; words:
`WordVQAProcessor`), over the answers' tokens (`multispec.vision.answer_change`): the share outside the two
answers' longest common subsequence (what a reader blind to the image cannot know) and the share before they
first differ (how far an image-blind chain gets at best).
An oracle bound, not a model's behaviour: the trained target's reliance is measured on the model
(`vision_image_reliance.py`).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from multispec.bench.machine import machine_info
from multispec.vision.answer_change import text_change
from multispec.vision.vqa_synth import generate_vqa
from multispec.vision.word_vqa import WordVQAProcessor
from multispec.vision.zoo_vlm import VQAProcessor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    pool = generate_vqa(args.samples * 3, seed=args.seed, long_fraction=0.5)
    by_question = defaultdict(list)
    for s in pool:
        by_question[s.kind, s.question].append(s)
    pairs = defaultdict(list)  # style -> (answer, another image's answer to the same question)
    for group in by_question.values():
        for s, other in zip(group, group[1:]):
            pairs[s.style].append((s.answer, other.answer))
    byte, word = VQAProcessor(), WordVQAProcessor()
    out = {"machine": machine_info(), "settings": vars(args), "styles": {}}
    print(f"{'style':10} {'pairs':>6} | {'bytes/answer':>12} {'changed':>8} {'before':>7} | "
          f"{'words/answer':>12} {'changed':>8} {'before':>7}")
    for style in sorted(pairs):
        ps = pairs[style][:args.samples]
        row = {"pairs": len(ps), "bytes": text_change(ps, byte.encode), "words": text_change(ps, word.encode)}
        out["styles"][style] = row
        b, w = row["bytes"], row["words"]
        print(f"{style:10} {len(ps):>6} | {b['tokens_per_answer']:>12} {b['changed']:>8.1%} "
              f"{b['before_first_change']:>7.1%} | {w['tokens_per_answer']:>12} {w['changed']:>8.1%} "
              f"{w['before_first_change']:>7.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
