"""How much of an answer another image changes, token by token: the measures behind the image-reliance
studies (`benchmarks/studies/vision_answer_reliance.py` on the data, `benchmarks/studies/vision_image_reliance.py` on a model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence of two token sequences (dynamic programming over one row)."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def first_change(a: Sequence, b: Sequence) -> int:
    """Tokens of `a` before it first differs from `b` (all that fit when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def answer_change(pairs: Sequence[tuple[Sequence, Sequence]]) -> dict:
    """Over (answer, the answer with another image) token pairs, token-weighted: `changed`, the share of the
    answers' tokens outside the longest common subsequence (what a reader blind to the image cannot know), and
    `before_first_change`, the share before the two first differ (how far an image-blind chain gets at best)."""
    if not pairs:
        raise ValueError("pairs: nothing to measure")
    tokens = sum(len(a) for a, _ in pairs)
    changed = sum(len(a) - lcs_length(a, b) for a, b in pairs)
    before = sum(first_change(a, b) for a, b in pairs)
    return {"tokens_per_answer": round(tokens / len(pairs), 2), "changed": round(changed / max(1, tokens), 4),
            "before_first_change": round(before / max(1, tokens), 4)}


def text_change(pairs: Sequence[tuple[str, str]], encode: Callable[[str], list[int]]) -> dict:
    """`answer_change` of text pairs under a tokenizer's `encode`."""
    return answer_change([(encode(a), encode(b)) for a, b in pairs])
