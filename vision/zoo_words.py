"""The second zoo VLM pair, `vqa-words-llava`: answers the image decides, in word tokens, 256 image tokens.

Built for the ViSpec / SpecVLM comparison the first pair (`vqa-llava`) could not show: there a byte tokenizer
let the text decide most of what a drafter guesses. Same procedural data (`vqa_synth`), read through
`WordVQAProcessor` (a word, number or punctuation mark per token; 64x64 images in 4x4 patches, 256 image
tokens); a deep, narrow target (20 layers, hidden 128) so that one target forward costs well over 10x a
one-layer draft head's on a CPU, where a forward's cost follows its number of layers more than their width.

Training runs in resumable stages under one folder (each stage skipped when done, the long ones resuming
from their checkpoints): the vision tower (pretrained on scene labels), the target, the small assistant VLM,
the target's own answers, and the three drafters (plain EAGLE, ViSpec, SpecVLM) with the same data and
budget. `train_stages(folder, until="target")` stops after a stage, for measuring the target's image reliance
before any drafter is trained.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from multispec.plugin import ZooEntry, ZooPair

from .distill import DistillConfig
from .drafters import VisionEagleDrafter, VisionEagleHead
from .word_vqa import WordVQAProcessor
from .zoo_pair import DEFAULT_DRAFTER, finish_pair, pretrained_tower, target_answers
from .zoo_vlm import VLMRecipe, load_vlm, train_vlm

NAME = "vqa-words-llava"
TOWER_STEPS, TOWER_BATCH = 3000, 32
TARGET = VLMRecipe(layers=20, hidden=128, steps=2400, data_seed=300_000)
ASSISTANT = VLMRecipe(layers=2, hidden=128, steps=600, lr=2e-3, data_seed=300_000)
ANSWERS, DRAFT_STEPS = 4000, 1000  # the measured drafters (BENCHMARKS.md); 2,000 / 400 left EAGLE under-trained
STAGES = ("tower", "target", "assistant", "answers", "drafters")


def train_stages(folder: str | Path, *, until: str = "drafters", quick: bool = False) -> dict:
    """Train the pair's stages in order up to and including `until` (one of `STAGES`); returns the reports
    of the stages done. `quick`: tiny models in seconds (tests)."""
    if until not in STAGES:
        raise ValueError(f"until: expected one of {', '.join(STAGES)}, got {until!r}")
    folder = Path(folder)
    if (folder / "pair_report.json").exists():
        return json.loads((folder / "pair_report.json").read_text())
    processor = WordVQAProcessor()
    tiny = dict(steps=6, batch_size=4, warmup=2)
    target_recipe = replace(TARGET, layers=2, hidden=64, **tiny) if quick else TARGET
    assistant_recipe = replace(ASSISTANT, layers=1, hidden=64, **tiny) if quick else ASSISTANT
    answers, draft = (8, DistillConfig(steps=4, batch_size=4, warmup_steps=1)) if quick else (
        ANSWERS, DistillConfig(steps=DRAFT_STEPS))
    tower, tower_report = pretrained_tower(folder, 20 if quick else TOWER_STEPS, processor,
                                           batch_size=4 if quick else TOWER_BATCH)
    report = {"tower": tower_report}
    if until == "tower":
        return report
    report["target"] = train_vlm(folder / "target", target_recipe, tower, int8=True, processor=processor)
    if until == "target":
        return report
    report["assistant"] = train_vlm(folder / "assistant", assistant_recipe, tower, processor=processor)
    if until == "assistant":
        return report
    target = load_vlm(folder / "target")
    examples = target_answers(target, folder, answers, processor)
    if until == "answers":
        return report
    finish_pair(folder, target, examples, draft, report, processor)
    return report


def load_pair(folder: Path) -> ZooPair:
    if not (folder / "pair_report.json").exists():
        raise FileNotFoundError(f"{folder}: no trained pair; run `multispec zoo train {NAME}` (about 2.5 hours on 2 "
                                "CPU cores; `python -m multispec.vision.zoo_words DIR target` stops after the target)")
    target = load_vlm(folder / "target")
    return ZooPair(target, VisionEagleDrafter(VisionEagleHead.load(folder / DEFAULT_DRAFTER), target),
                   WordVQAProcessor(), NAME)


def zoo_entry() -> ZooEntry:
    return ZooEntry(NAME, f"Llava (SigLIP tower, 256 image tokens, {TARGET.layers}-layer word-level Llama, "
                    f"{WordVQAProcessor.vocab_size}-token vocabulary) trained on procedural chart/shape/table VQA + "
                    "EAGLE, ViSpec and SpecVLM drafters (multispec.vision)", None, load_pair,
                    lambda folder: train_stages(folder))


if __name__ == "__main__":  # python -m multispec.vision.zoo_words FOLDER [STAGE]: train (resumable) up to STAGE
    import sys

    print(json.dumps(train_stages(sys.argv[1], until=sys.argv[2] if len(sys.argv) > 2 else "drafters"), indent=2))
