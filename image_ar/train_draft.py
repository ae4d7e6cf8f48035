"""`multispec train draft` for an image generator: a Janus target (text prompts: `janus_draft`), or a
class-conditional image GPT (`ClassConditionalGPT`, LlamaGen's layout), whose data are class labels: the
target draws the training images itself (sampled, guided at `--guidance-scale`: the scale the head will draft
under), and an EAGLE head is distilled on the target's guided next-token law at that scale
(`zoo_pair.guided_eagle_trainer`: the head reads the conditional half's features, as it does while drafting).
One image per class is held out: `report.json` gives the accepted length of guided greedy generation on those
classes, before and after training.

    multispec train draft --target MY_GPT --data labels.txt --out DIR --kind eagle --guidance-scale 2
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig

from multispec import SamplingConfig
from multispec.plugin import (DraftKind, EagleConfig, EagleDrafter, EagleHead, EagleTrainConfig, TargetTrainer,
                              TrainLoop, current_shards, item_generator, loop_config, loop_report, positive_int,
                              write_report)

from . import janus_draft
from .generate import generate_ar, generate_images
from .gpt import ClassConditionalGPT
from .janus_draft import is_janus
from .zoo_pair import CFG_SCALE, guided_eagle_trainer

# its options (dest -> flag), refused for other targets
TRAIN_OPTIONS = {"guidance_scale": "--guidance-scale", "images_per_class": "--images-per-class"}


def add_arguments(p) -> None:
    p.add_argument("--guidance-scale", type=float, default=None,
                   help=f"the classifier-free guidance the head drafts under (default {CFG_SCALE})")
    p.add_argument("--images-per-class", type=positive_int, default=None,
                   help="images the target draws per label (an image GPT) or prompt (Janus) of --data to train on "
                        "(default 64)")


def is_image_gpt(config) -> bool:
    return getattr(config, "codebook_size", None) is not None and getattr(config, "grid_size", None) is not None


def is_image_generator(config) -> bool:
    return is_image_gpt(config) or is_janus(config)


def read_labels(path: str | Path, num_classes: int) -> list[int]:
    """Class labels from a text file (integers separated by spaces, commas or lines) or a JSON list."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data: {path} is not a file")
    text = path.read_text()
    try:
        labels = json.loads(text) if text.lstrip().startswith("[") else [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--data: {path} must hold class labels (integers), for an image GPT target") from None
    bad = [x for x in labels if not isinstance(x, int) or not 0 <= x < num_classes]
    if not labels or bad:
        raise ValueError(f"--data: expected class labels in [0, {num_classes}), got {bad[:5] or 'none'}")
    return labels


class ImageEagleKind(DraftKind):
    """An EAGLE head distilled on the target's guided law, on sequences [class token, begin-image, codes]."""

    name = "eagle"

    def __init__(self, target: ClassConditionalGPT, sequences: torch.Tensor, scale: float, seed: int):
        c = target.config
        config = EagleConfig(hidden_size=c.hidden_size, draft_vocab_size=c.codebook_size,
                             target_vocab_size=c.codebook_size, intermediate_size=c.intermediate_size,
                             num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                             max_position_embeddings=c.max_position_embeddings)
        torch.manual_seed(seed)
        self.target, self.ids, self.seed = target, sequences, seed
        self.module = self.head = EagleHead(config).to(next(target.parameters()).device)
        self.trainer = guided_eagle_trainer(target, self.head, scale, EagleTrainConfig(ce_weight=0.5))
        self.features = self.trainer.extract(list(sequences))

    def losses(self, items: Sequence[int], step: int) -> dict:
        ids, feats = self.ids[list(items)], self.features[list(items)]
        s, h = ids.shape[1] - 1, feats.shape[-1] // 2
        noise = torch.stack([torch.randn(s, h, generator=item_generator(self.seed, step, i)) for i in items])
        parts = self.trainer.losses(ids, feats, noise=noise)
        return {"total": parts["total"], "acc": parts["acc"], "tokens": ids.numel()}

    def save(self, folder) -> None:
        self.head.save(folder)

    def drafter(self) -> EagleDrafter:
        return EagleDrafter(self.head.eval(), self.target)


def accepted(target, drafter, labels: list[int], scale: float) -> float:
    """Tokens committed per target forward, guided greedy generation of one image per label, chains of 4."""
    out = generate_images(target, labels, drafter=drafter, tree=4, guidance_scale=scale, sampling=SamplingConfig())
    return round(out.stats.mean_accepted_length, 4)


def run(args: argparse.Namespace) -> int:
    scale = args.guidance_scale if args.guidance_scale is not None else CFG_SCALE
    if is_janus(AutoConfig.from_pretrained(args.target)):
        return janus_draft.run(args, scale, args.images_per_class or 64)
    shards = current_shards()
    target = ClassConditionalGPT.from_pretrained(args.target).eval()
    device = args.device or (str(shards.device) if shards.world > 1 else None)
    if device is not None:
        target.to(device)
    labels = read_labels(args.data, target.config.num_classes)
    per_class = args.images_per_class or 64
    drawn = torch.tensor([x for x in labels for _ in range(per_class)], device=next(target.parameters()).device)
    codes = generate_ar(target, drawn, guidance_scale=scale, generator=torch.Generator().manual_seed(args.seed)).codes
    sequences = torch.cat([target.class_tokens(drawn), codes], dim=1)
    kind = ImageEagleKind(target, sequences, scale, args.seed)
    held = sorted(set(labels))
    untrained = accepted(target, kind.drafter(), held, scale) if shards.main else None
    loop = loop_config(args)
    trainer = TrainLoop(kind.module, kind.losses, len(sequences), loop, args.out, shards, desc="train eagle (image)")
    history = trainer.run()
    report = loop_report(args, trainer, history, guidance_scale=scale, images=len(sequences),
                         untrained_accepted_length=untrained)
    if shards.main:
        if trainer.finished:
            kind.save(args.out)
            report["accepted_length"] = accepted(target, kind.drafter(), held, scale)
            report["eval"] = {"classes": held, "chain_k": 4, "guided": scale, "greedy": True}
        write_report(args.out, report)
    return 0


TRAINER = TargetTrainer("image generator", is_image_generator, ("eagle",), TRAIN_OPTIONS, add_arguments, run)

__all__ = ["ImageEagleKind", "TRAINER", "accepted", "is_image_generator", "is_image_gpt", "read_labels", "run"]
