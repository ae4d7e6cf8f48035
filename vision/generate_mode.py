"""`multispec generate --pair vqa-llava --image PATH --prompt QUESTION`: the zoo VLM answers a question about an
image with one of its three drafters (plain EAGLE, ViSpec, SpecVLM), streamed as verification commits tokens."""

from __future__ import annotations

import argparse
from pathlib import Path

from multispec import zoo
from multispec.plugin import (DEFAULT_MAX_NEW_TOKENS, GenerateMode, check_sampling, generate_one, prompt_texts,
                              tree_name, tree_option, write_json)

from .zoo_pair import DRAFTERS, NAME, load_drafters
from .zoo_vlm import EOS, PAD

DEFAULT_CHAIN_K = 8  # the demo's and eval vqa's chain on this pair


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--image", default=None, metavar="PATH", help="the image the question is about")
    group.add_argument("--vlm-drafter", default=None, choices=DRAFTERS,
                       help="the pair's drafter (default vispec): plain EAGLE, ViSpec or SpecVLM")


def _open_image(path: str | None):
    if path is None:
        raise ValueError(f"--image: {NAME} answers questions about an image; give --image PATH")
    from PIL import Image

    if not Path(path).is_file():
        raise FileNotFoundError(f"--image: {path} is not a file")
    try:
        return Image.open(path).convert("RGB")
    except OSError as err:  # PIL's UnidentifiedImageError included
        raise ValueError(f"--image: {path} is not an image ({err})") from None


def run(args: argparse.Namespace) -> int:
    questions = prompt_texts(args)
    args.max_new_tokens = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    image = _open_image(args.image)
    check_sampling(args)
    tree = tree_option(args.tree) or DEFAULT_CHAIN_K
    name = args.vlm_drafter or "vispec"
    pair = zoo.load(NAME)
    drafter = load_drafters(pair.target, modes=(name,))[name]
    processor = pair.tokenizer

    def decode(ids: list[int]) -> str:
        return processor.decode([t for t in ids if t != EOS])

    records = []
    for i, question in enumerate(questions):
        if len(questions) > 1:
            print(f"--- question {i + 1} of {len(questions)}")
        inputs = dict(processor(image, question))
        records.append(generate_one(pair.target, drafter, decode, inputs, question + "\n", args, tree, EOS, PAD))
    write_json(args, {"source": NAME, "image": args.image, "drafter": name, "tree": tree_name(tree),
                      "sample": args.sample, "records": records})
    return 0


MODE = GenerateMode("vision-language", (NAME,), {"image": "--image", "vlm_drafter": "--vlm-drafter"}, _add_arguments, run,
                    static_step=True)
