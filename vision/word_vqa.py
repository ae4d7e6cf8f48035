"""A word-level processor for the procedural VQA data, with 256 image tokens per image.

The byte-level zoo VLM (`zoo_vlm.VQAProcessor`) spends most of an answer's tokens on letters the text already
decides ("o" of "orange" decides "range"), so the image decides few of the tokens a drafter must guess, and a
drafter that ignores the image loses little (BENCHMARKS.md, "Image reliance"). Here every word, number and
punctuation mark of the generator's language is one token: the colours, counts, values and shapes a drafter
must read off the image are a large share of an answer's tokens. The vision tower reads 64x64 images in 4x4
patches: 256 image tokens, the count where the papers' drafters start to drown in image tokens.

Prompt: BOS, the image's 256 tokens, then "Q : <question> A :"; the answer's words follow, then EOS.
"""

from __future__ import annotations

import re

from .vqa_synth import COLOURS, SHAPES
from .zoo_vlm import VQAProcessor

_TOKEN = re.compile(r"\d+|[A-Za-z]+|[^\sA-Za-z\d]")
_NO_SPACE_BEFORE = frozenset(".,:;?!")

# The generator's language (`vqa_synth`): every word its questions and answers use, the numbers 0-99 (values,
# counts, sums) and its punctuation. A test scans generated samples for words outside it.
_WORDS = sorted({
    *COLOURS, *SHAPES, *(s + "s" for s in SHAPES),
    "A", "Describe", "Does", "Explain", "How", "It", "Row", "So", "Step", "The", "There", "What", "Which", "Q",
    "a", "an", "and", "are", "at", "bar", "bars", "by", "chart", "colour", "columns", "count", "counts", "does",
    "down", "end", "flat", "go", "have", "highest", "how", "image", "in", "is", "largest", "line", "many",
    "not", "number", "of", "or", "peaks", "point", "points", "row", "rows", "shape", "shapes", "step", "sum",
    "table", "tallest", "the", "there", "up", "value", "where", "which", "with",
})
_SYMBOLS = [".", ",", ":", "?", "+", "="]
SPECIALS = ["<pad>", "<bos>", "<eos>", "<image>", "<unk>"]
VOCABULARY = SPECIALS + _SYMBOLS + [str(n) for n in range(100)] + _WORDS


class WordVQAProcessor(VQAProcessor):
    """Words, numbers and punctuation as tokens (a fixed vocabulary of the generator's language; anything else
    is `<unk>`); 64x64 images in 4x4 patches, 256 image tokens. Decoding joins tokens with spaces and none
    before punctuation, which restores the generator's texts exactly."""

    vocab = tuple(VOCABULARY)
    vocab_size = len(VOCABULARY)
    pad_token_id, bos_token_id, eos_token_id, image_token_id, unk_token_id = range(5)
    patch_size = 4
    answer_prefix = ""  # words need no separator

    def __init__(self):
        self.ids = {w: i for i, w in enumerate(self.vocab)}

    def tokens(self, text: str) -> list[str]:
        return _TOKEN.findall(text)

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(t, self.unk_token_id) for t in self.tokens(text)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        out = []
        for i in map(int, ids):
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"ids: {i} is outside the {self.vocab_size}-token vocabulary")
            if skip_special_tokens and i < len(SPECIALS) and i != self.unk_token_id:
                continue
            word = self.vocab[i]
            out.append(word if not out or word in _NO_SPACE_BEFORE else " " + word)
        return "".join(out)

    def prompt_ids(self, question: str) -> list[int]:
        return [self.bos_token_id] + [self.image_token_id] * self.num_image_tokens + self.encode(f"Q: {question} A:")
