"""The zoo's VLM entry `vqa-llava`: the zoo VLM (`zoo_vlm`) and three drafters trained for it with the same
data and budget (plain EAGLE, ViSpec, SpecVLM), on answers the target generated itself.

    from multispec import zoo
    pair = zoo.load("vqa-llava")                       # target, plain-EAGLE drafter, processor
    drafters = load_drafters(pair.target)              # {"eagle": ..., "vispec": ..., "specvlm": ...}
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from multispec import zoo
from multispec.plugin import EagleConfig, ZooEntry, ZooPair

from .distill import DistillConfig, VisionDistiller
from .drafters import VisionDraftConfig, VisionEagleDrafter, VisionEagleHead
from .tower import pretrain_tower
from .vqa_synth import VQASample, generate_vqa
from .zoo_vlm import (IMAGE, NUM_IMAGE_TOKENS, VOCAB, VLMRecipe, VQAProcessor, load_vlm, train_vlm,
                      training_batch, vlm_config)

NAME = "vqa-llava"
DRAFTERS = ("eagle", "vispec", "specvlm")
DEFAULT_DRAFTER = "eagle"  # the fastest of the three on this pair (BENCHMARKS.md)
TRAIN_SEED, TEST_SEED = 1000, 7  # generator seeds: training data and the shipped evaluation set
VALIDATION_SEED = 11  # the questions a bench chooses its settings on (chain length, tree), never the test ones


def head_for(model, vision: VisionDraftConfig) -> VisionEagleHead:
    """A fresh one-layer head sized for `model` (full draft vocabulary: the byte vocabulary is tiny)."""
    text = model.config.get_text_config()
    config = EagleConfig(hidden_size=text.hidden_size, draft_vocab_size=text.vocab_size,
                         target_vocab_size=text.vocab_size, intermediate_size=text.hidden_size * 5 // 2,
                         num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads,
                         rope_theta=getattr(text, "rope_theta", None) or 10000.0)
    return VisionEagleHead(config, vision)


def drafter_config(mode: str, image_token_id: int = IMAGE, **overrides) -> VisionDraftConfig:
    return VisionDraftConfig(mode=mode, image_token_id=image_token_id, **overrides)


@torch.no_grad()
def generate_answers(model, samples: list[VQASample], max_new_tokens: int = 200,
                     batch_size: int = 32, processor: VQAProcessor | None = None) -> list[VQASample]:
    """The samples with each answer replaced by the target's own greedy answer."""
    processor = processor or VQAProcessor()
    eos = processor.eos_token_id
    out = []
    for i in tqdm(range(0, len(samples), batch_size), desc="target answers", unit="batch"):
        chunk = samples[i:i + batch_size]
        inputs = processor([s.image for s in chunk], [s.question for s in chunk])
        seqs = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                              pad_token_id=processor.pad_token_id)[:, inputs["input_ids"].shape[1]:]
        for s, ids in zip(chunk, seqs):
            ids = ids.tolist()
            ids = ids[:ids.index(eos)] if eos in ids else ids
            out.append(replace(s, answer=processor.decode(ids).strip()))
    return out


def collate(samples: list[VQASample], processor: VQAProcessor | None = None
            ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    batch = training_batch(samples, processor or VQAProcessor())
    labels = batch.pop("labels")
    return batch, labels


def load_drafters(target, folder: str | Path | None = None,
                  modes: tuple[str, ...] = DRAFTERS) -> dict[str, VisionEagleDrafter]:
    folder = Path(folder) if folder is not None else zoo.path(NAME)
    return {m: VisionEagleDrafter(VisionEagleHead.load(folder / m), target) for m in modes}


def load_assistant(folder: str | Path | None = None):
    """The small Llava (2 layers, hidden 128, same vocabulary and image tokens) trained on the same data:
    the draft model for `transformers`' assisted generation and for `ModelDrafter`."""
    folder = Path(folder) if folder is not None else zoo.path(NAME)
    return load_vlm(folder / "assistant")


def load_pair(folder: Path):
    target = load_vlm(folder / "target")
    drafter = VisionEagleDrafter(VisionEagleHead.load(folder / DEFAULT_DRAFTER), target)
    return ZooPair(target, drafter, VQAProcessor(), NAME)


def train_drafter(target, examples: list[VQASample], out_dir: str | Path, vision: VisionDraftConfig,
                  config: DistillConfig, seed: int = 0, processor: VQAProcessor | None = None) -> dict:
    torch.manual_seed(seed)
    head = head_for(target, vision)
    start = time.time()
    history = VisionDistiller(target, head, config).fit(examples, lambda s: collate(s, processor), out_dir,
                                                        desc=f"{vision.mode} draft")
    last = history[-50:]
    return {"vision": asdict(vision), "seconds": round(time.time() - start),
            "acc_last50": round(sum(h["acc"] for h in last) / len(last), 4)}


TOWER_STEPS = 3000
TARGET = VLMRecipe(layers=16, hidden=256, steps=3000)
ASSISTANT = VLMRecipe(layers=2, hidden=128, steps=600, lr=2e-3)
ANSWERS, DRAFT_STEPS = 2000, 400


def pretrained_tower(folder: Path, steps: int, processor: VQAProcessor | None = None,
                     batch_size: int = 64) -> tuple[dict[str, torch.Tensor], dict]:
    """The vision tower for `processor`'s images and patches, pretrained on scene labels
    (`multispec.vision.tower`), kept in `folder/tower.pt` until the pair is done (a resumed run reuses it)."""
    from transformers import SiglipVisionModel

    processor = processor or VQAProcessor()
    path = folder / "tower.pt"
    if path.exists():
        saved = torch.load(path, weights_only=False)
        if saved["report"]["steps"] == steps:
            return saved["state"], saved["report"]
    tower = SiglipVisionModel(vlm_config(processor=processor).vision_config)
    report = pretrain_tower(tower, processor.pixels, steps=steps, batch_size=batch_size)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state": tower.state_dict(), "report": report}, path)
    return tower.state_dict(), report


def target_answers(target, folder: Path, count: int, processor: VQAProcessor | None = None) -> list[VQASample]:
    """The target's own greedy answers to `count` training questions (cached in `folder/answers.json`)."""
    samples = generate_vqa(count, seed=TRAIN_SEED + 1)
    cache = folder / "answers.json"
    if cache.exists():
        answers = json.loads(cache.read_text())
        if len(answers) == count:
            return [replace(s, answer=a) for s, a in zip(samples, answers)]
    out = generate_answers(target, samples, processor=processor)
    cache.write_text(json.dumps([s.answer for s in out]))
    return out


def train_pair(folder: Path, *, quick: bool = False) -> dict:
    """Pretrain the vision tower, train the VLM (int8 storage) and the small assistant VLM on it, generate
    the target's answers to the training questions, and train the three drafters on them with the same
    steps and batch size. Each stage resumes (or is skipped when done); `quick` trains tiny models in
    seconds (tests)."""
    folder = Path(folder)
    if (folder / "pair_report.json").exists():  # finished
        return json.loads((folder / "pair_report.json").read_text())
    tiny = dict(steps=6, batch_size=4, warmup=2)
    target_recipe = replace(TARGET, layers=2, hidden=64, **tiny) if quick else TARGET
    assistant_recipe = replace(ASSISTANT, layers=1, hidden=64, **tiny) if quick else ASSISTANT
    answers, draft = (8, DistillConfig(steps=4, batch_size=4, warmup_steps=1)) if quick else (
        ANSWERS, DistillConfig(steps=DRAFT_STEPS))
    tower, report = pretrained_tower(folder, 20 if quick else TOWER_STEPS)
    report = {"tower": report,
              "target": train_vlm(folder / "target", target_recipe, tower, int8=True),
              "assistant": train_vlm(folder / "assistant", assistant_recipe, tower)}
    target = load_vlm(folder / "target")
    finish_pair(folder, target, target_answers(target, folder, answers), draft, report)
    return json.loads((folder / "pair_report.json").read_text())


def finish_pair(folder: Path, target, examples: list[VQASample], draft: DistillConfig, report: dict,
                processor: VQAProcessor | None = None) -> dict:
    """A pair's last stage: the three drafters trained on the target's answers with the same data and budget,
    stored in int8, the pair's report written and the resume files removed."""
    processor = processor or VQAProcessor()
    for mode in DRAFTERS:
        report[mode] = train_drafter(target, examples, folder / mode,
                                     drafter_config(mode, image_token_id=processor.image_token_id), draft,
                                     processor=processor)
    for mode in DRAFTERS:  # int8 storage (the zoo's 100 MB); the dequantized heads are the shipped ones
        VisionEagleHead.load(folder / mode).save(folder / mode, int8=True)
    report["drafter_storage"] = ("int8 (multispec.int8: per-row scales), stored after training; the dequantized "
                                 "heads are the shipped ones and every figure is measured on them")
    (folder / "pair_report.json").write_text(json.dumps(report, indent=2))
    for scratch in ("tower.pt", "answers.json", *(f"{mode}/checkpoint.pt" for mode in DRAFTERS)):
        (folder / scratch).unlink(missing_ok=True)  # resume state, not part of the pair
    return report


def zoo_entry():
    return ZooEntry(NAME, f"Llava (SigLIP tower, {NUM_IMAGE_TOKENS} image tokens, {TARGET.layers}-layer byte-level "
                    f"Llama, {VOCAB}-token vocabulary) trained on procedural chart/shape/table VQA + EAGLE, ViSpec "
                    "and SpecVLM drafters (multispec.vision)", None, load_pair, train_pair)
