"""How much of an answer the image decides, measured on the data before any model is trained (the first step of
the word-level VLM pair: a drafter can only gain from the image where the image decides the tokens it guesses).

    python benchmarks/vision_answer_reliance.py [--samples 2000] [--json PATH]

For each question of the procedural VQA data (`multispec.vision.vqa_synth`), another image of the same kind
asked the same question gives another reference answer. Per tokenizer (bytes: the `vqa-llava` pair; words:
`WordVQAProcessor`), over the answers' tokens:
- changed: the share of tokens outside the longest common subsequence of the two answers (what an image-blind
  predictor that knows the question and the answer so far cannot know);
- before the first change: the share of an answer's tokens before the two answers first differ (how far an
  image-blind chain gets, at best, before it must guess an image-decided token).
An oracle bound, not a model's behaviour: the trained target's reliance is measured on the model
(`vision_image_reliance.py`).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from multispec.bench.machine import machine_info
from multispec.vision.vqa_synth import generate_vqa
from multispec.vision.word_vqa import WordVQAProcessor
from multispec.vision.zoo_vlm import VQAProcessor


def lcs_length(a: list, b: list) -> int:
    """Length of the longest common subsequence (dynamic programming over one row)."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def first_change(a: list, b: list) -> int:
    """Tokens of `a` before it first differs from `b` (len(a) when `a` is a prefix of `b`)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def reliance(pairs: list[tuple[str, str]], encode) -> dict:
    """changed / before-first-change shares over (answer, the other image's answer) pairs, token-weighted."""
    tokens = changed = before = 0
    for a, b in pairs:
        ta, tb = encode(a), encode(b)
        tokens += len(ta)
        changed += len(ta) - lcs_length(ta, tb)
        before += first_change(ta, tb)
    return {"tokens_per_answer": round(tokens / len(pairs), 2), "changed": round(changed / tokens, 4),
            "before_first_change": round(before / tokens, 4)}


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
        row = {"pairs": len(ps), "bytes": reliance(ps, byte.encode), "words": reliance(ps, word.encode)}
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
