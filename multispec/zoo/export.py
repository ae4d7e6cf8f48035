"""`multispec zoo export NAME DIR`: a zoo pair's target and drafters as checkpoint folders that `--target` /
`--draft` and `transformers`' Auto classes load, each with its tokenizer.

    DIR/target/    the target (`AutoModelForCausalLM`, weights as the zoo loads them: int8 ones dequantized)
    DIR/eagle/     its EAGLE head (`--draft eagle:DIR/eagle`), where the pair has one
    DIR/draft/     its small draft model (`--draft DIR/draft`), where the pair has one

The byte-level pairs' tokenizer (UTF-8 bytes as ids 0..255) is written as a `tokenizers` byte-level tokenizer
with no merges, so `AutoTokenizer` gives the same ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from ..drafters.eagle import EagleDrafter
from .bytes_lm import ByteTokenizer

BYTE_CHARS_FIRST = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
    list(range(ord("®"), ord("ÿ") + 1))


def _byte_chars() -> dict[int, str]:
    """The byte-level pre-tokenizer's printable stand-in for each byte (GPT-2's table)."""
    bs, cs, extra = list(BYTE_CHARS_FIRST), list(BYTE_CHARS_FIRST), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer():
    """A `transformers` tokenizer whose ids are the UTF-8 bytes (0..255), as the zoo's `ByteTokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = _byte_chars()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def exportable_tokenizer(tokenizer):
    """The pair's tokenizer as `AutoTokenizer` loads it: the byte tokenizer for byte-level pairs, a `transformers`
    tokenizer as it is; None for anything else (an image tokenizer, a processor of the zoo's own)."""
    if isinstance(tokenizer, ByteTokenizer):
        return byte_tokenizer()
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    return None


def auto_loadable(model) -> bool:
    """Whether `AutoModelForCausalLM` maps the model's config class to the model's own class."""
    if not isinstance(model, PreTrainedModel):
        return False
    try:
        return AutoModelForCausalLM._model_mapping[type(model.config)] is type(model)
    except KeyError:
        return False


def export_pair(pair, folder: str | Path) -> dict:
    """Write `pair` (a `ZooPair`) into `folder` (see the module docstring); returns what was written."""
    folder = Path(folder)
    target = pair.target
    if not auto_loadable(target):
        raise ValueError(f"NAME: {pair.name}'s target ({type(target).__name__}) is not a causal LM the Auto classes "
                         "load; export serves the text pairs")
    tokenizer = exportable_tokenizer(pair.tokenizer)
    if tokenizer is None:
        raise ValueError(f"NAME: {pair.name}'s tokenizer ({type(pair.tokenizer).__name__}) cannot be written as a "
                         "transformers tokenizer")
    written = {"target": _save_model(target, tokenizer, folder / "target")}
    if isinstance(pair.drafter, EagleDrafter) and type(pair.drafter).__name__ == "EagleDrafter":
        pair.drafter.head.save(folder / "eagle", dtype=torch.float32)
        written["eagle"] = str(folder / "eagle")
    if auto_loadable(pair.draft_model):
        written["draft"] = _save_model(pair.draft_model, tokenizer, folder / "draft")
    (folder / "export.json").write_text(json.dumps({"pair": pair.name, **written}, indent=2) + "\n")
    return written


def _save_model(model: PreTrainedModel, tokenizer, folder: Path) -> str:
    model.save_pretrained(folder)  # in the dtype the zoo loads it in (int8 weights dequantized)
    tokenizer.save_pretrained(folder)
    return str(folder)


__all__ = ["auto_loadable", "byte_tokenizer", "export_pair", "exportable_tokenizer"]
