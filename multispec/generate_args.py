"""`multispec generate`: text in, text out, speculatively, with the speed and accepted length at the end.

    multispec generate --pair stdlib-bytes --prompt "def " --max-new-tokens 32 --compare
    multispec generate --target PATH [--draft PATH|ngram|suffix|eagle:PATH] --prompts FILE --json out.json

A zoo pair brings its target, drafter, tokenizer and chosen draft shape; a checkpoint folder (`--target`)
is loaded with `transformers`' Auto classes and its own tokenizer, drafted by prompt lookup unless `--draft`
names a draft model folder, `suffix` (SuffixDecoding over the prompts), or an EAGLE head folder
(`eagle:PATH`: multispec's own layout, EAGLE-3 as vLLM and SGLang serve it, or the EAGLE-1/2 reference
layout). Tokens print as each verification commits them (`--no-stream`: at the end); `--compare`
times the target's own `generate` against speculation on the same prompt, both warmed up, in `--rounds`
rounds that alternate which goes first, and prints the median speedup, its spread, whether the outputs agree
and a note when the timings are noisy (rounds more than 20% apart, or a busy machine).
Every option is checked before a model loads; errors name the option.

Pairs of the other modalities take their own options (listed under their headings in --help): a VLM pair
answers --prompt about --image, an image AR pair draws --class digits into PNGs, the reasoning pair solves
--prompt with --method. Each modality package registers its mode here (`register_generate_mode`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from .cli_types import positive_int
from .steps import STEPS

DESCRIPTION = __doc__


@dataclass(frozen=True)
class GenerateMode:
    """How `multispec generate` serves one modality's zoo pairs: its own options (added under a heading by
    `add_arguments`; `options` maps each one's dest to its flag: they default to None and are refused with any
    other pair) and `run(args)`; `static_step`: whether its generation honours `--step` (per pair, its own checks refuse the others)."""

    name: str
    pairs: tuple[str, ...]
    options: dict[str, str]
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    run: Callable[[argparse.Namespace], int]
    static_step: bool = False


GENERATE_MODES: dict[str, GenerateMode] = {}
DEFAULT_MAX_NEW_TOKENS = 64


def register_generate_mode(mode: GenerateMode) -> None:
    """Called from a modality's `cli.register()` (the `multispec.commands` entry point), before the CLI builds its
    parser."""
    GENERATE_MODES[mode.name] = mode


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--pair", help="a zoo pair (multispec zoo list), e.g. stdlib-bytes")
    source.add_argument("--target", metavar="PATH", help="a causal LM checkpoint folder with its tokenizer")
    p.add_argument("--draft", default=None, metavar="PATH|ngram|suffix|eagle:PATH",
                   help="with --target: a draft model folder (same tokenizer), ngram (prompt lookup, the default), "
                        "suffix (SuffixDecoding) or eagle:PATH (an EAGLE head trained for the target)")
    text = p.add_mutually_exclusive_group()
    text.add_argument("--prompt", help="the text to continue (a VLM pair: the question; reasoning: the problem)")
    text.add_argument("--prompts", metavar="FILE", help="a text file, one prompt per line (\\n escapes allowed)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="tokens to generate per prompt (default 64; the reasoning pair: 320)")
    p.add_argument("--tree", default=None, metavar="K|D/K/N",
                   help="a chain of K drafts, or a dynamic tree DEPTH/TOPK/TOTAL (default: the pair's, else 4)")
    p.add_argument("--step", choices=STEPS, default="eager",
                   help="eager (default), static (fixed shapes, CUDA graphs on a GPU) or compiled (also torch.compile)")
    p.add_argument("--sample", action="store_true", help="sample (exact speculative sampling) instead of greedy")
    p.add_argument("--temperature", type=float, default=1.0, help="with --sample")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed (with --sample, and for the image pairs)")
    p.add_argument("--compare", action="store_true",
                   help="also time the target's own generate against speculation, warmed up, in alternating rounds")
    p.add_argument("--rounds", type=positive_int, default=5,
                   help="with --compare: timed rounds of each (default %(default)s; the median is reported)")
    p.add_argument("--no-stream", action="store_true", help="print each text at the end, not as it is committed")
    p.add_argument("--json", default=None, metavar="PATH", help="write texts and figures as JSON")
    for mode in GENERATE_MODES.values():
        mode.add_arguments(p.add_argument_group(f"{mode.name} pairs ({', '.join(mode.pairs)})"))


__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DESCRIPTION", "GENERATE_MODES", "GenerateMode", "add_arguments",
           "register_generate_mode"]
