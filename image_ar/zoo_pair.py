"""The zoo's class-conditional visual AR pair, `mnist-vq-gpt`, trained here on real MNIST.

Pieces (each in its own folder, each loadable with `from_pretrained`-style calls; the int8 target with
`multispec.zoo.int8.load_int8` or `load_gpt`):
- `vqvae/`: the tokenizer (`VQVAE`: 28x28 -> 7x7 codes from a 512-entry codebook);
- `target/`: a 12-layer `ClassConditionalGPT` (hidden 256; one class token, 49 codes in raster order,
  10% null class in training for classifier-free guidance), stored in int8 (`multispec.zoo.int8`: the zoo's
  budget); the EAGLE head is distilled from the trained target before that rounding (a run resumed after the
  target stage distills from the int8 one);
- `draft/`: a 2-layer `ClassConditionalGPT` of the same tokenization (the independent small AR drafter);
- `eagle/`: an `EagleHead` over the target's features, trained to predict the target's *guided*
  distribution at `CFG_SCALE` from the conditional features alone (so drafting needs no unconditional
  half);
- `classifier/`: the `DigitClassifier` whose features the image metrics use.

`multispec zoo train mnist-vq-gpt` reproduces them (fixed seeds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from multispec import zoo
from multispec.plugin import (EagleConfig, EagleDrafter, EagleHead, EagleTrainConfig, EagleTrainer, GuidedTarget,
                              INT8_FILE, ModelDrafter, ZooEntry, ZooPair, adamw_cosine, load_int8, save_int8,
                              train_steps)

from .classifier import DigitClassifier, accuracy, train_classifier
from .data import load_digits_dataset, shifted
from .gpt import ClassConditionalGPT, gpt_config
from .hub_load import from_folder
from .targets import ImageGPTTarget
from .vqvae import VQVAE, train_vqvae

NAME = "mnist-vq-gpt"
CFG_SCALE = 2.0  # the guidance the EAGLE head is distilled at and the benchmark samples with
TOP_K = 64  # the benchmark's top-k (the papers sample at temperature 1 with top-k)
TARGET = dict(layers=12, hidden=256, heads=8, kv_heads=4, intermediate=768)
DRAFT = dict(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=384)
COPIES = 10  # shifted copies of each training image, tokenized once
SEED = 0


@dataclass
class ImagePair:
    """Everything the image benchmarks and demos need."""

    vqvae: "object"
    target: "object"  # ClassConditionalGPT
    draft_model: "object"  # the small ClassConditionalGPT
    eagle_head: "object"  # EagleHead
    classifier: "object"  # DigitClassifier
    folder: Path


def tokenize(vqvae, images: torch.Tensor, labels: torch.Tensor, copies: int, seed: int,
             batch: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [N * copies, 49] and labels of `copies` versions of each image (the first unshifted, the rest
    shifted by up to 2 pixels)."""
    g = torch.Generator().manual_seed(seed)
    out_codes, out_labels = [], []
    for c in range(copies):
        for i in range(0, len(images), batch):
            x = images[i:i + batch]
            x = x if c == 0 else shifted(x, 2, g)
            out_codes.append(vqvae.encode(x).flatten(1))
            out_labels.append(labels[i:i + batch])
    return torch.cat(out_codes), torch.cat(out_labels)


def train_gpt(config, codes: torch.Tensor, labels: torch.Tensor, *, steps: int, batch_size: int, lr: float,
              seed: int, desc: str, progress: bool = True):
    """Train a `ClassConditionalGPT` from `config` on (labels, codes); returns (model, losses)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = ClassConditionalGPT(config)
    opt, sched = adamw_cosine(model, lr, steps, weight_decay=0.05)

    def step_loss(_: int) -> torch.Tensor:
        idx = torch.randint(0, len(codes), (batch_size,), generator=g)
        return model.image_loss(labels[idx], codes[idx], generator=g)

    model.train()
    losses = train_steps(model, None, steps, (opt, sched), desc, loss=step_loss, progress=progress)
    return model.eval(), losses


@torch.no_grad()
def heldout_loss(model, codes: torch.Tensor, labels: torch.Tensor, batch: int = 250) -> float:
    total = 0.0
    for i in range(0, len(codes), batch):
        total += float(model.image_loss(labels[i:i + batch], codes[i:i + batch], class_dropout=0.0)) * len(codes[i:i + batch])
    return total / len(codes)


def guided_eagle_trainer(target, head, scale: float, config):
    """An `EagleTrainer` whose teacher is the target's guided distribution u + s (c - u): the features it
    extracts are the conditional and unconditional runs side by side ([..., 2H]); the head reads the
    conditional half (what it is given while drafting) and learns the guided next-token law."""
    class GuidedEagleTrainer(EagleTrainer):
        @torch.no_grad()
        def target_features(self, ids):
            decoder = self.target.get_decoder()
            cond = decoder(input_ids=ids).last_hidden_state
            uncond = decoder(input_ids=self.target.unconditional_tokens(ids)).last_hidden_state
            return torch.cat([cond, uncond], dim=-1)

        def losses(self, ids, feats, noise=None):
            h = feats.shape[-1] // 2
            self._uncond_next = feats[:, 1:, h:].float()
            return super().losses(ids, feats[..., :h], noise)

        def teacher_logits(self, next_features):
            cond = self.target_logits(next_features)
            uncond = self.target_logits(self._uncond_next[:, : next_features.shape[1]])
            return uncond + scale * (cond - uncond)

    return GuidedEagleTrainer(target, head, config)


def train_pair(folder: Path, *, quick: bool = False) -> dict:
    """Train every piece into `folder` (see the module docstring); `quick` shrinks every stage to a smoke
    run (the tests use it). Stages recorded in an existing `report.json` are loaded, not retrained (resume
    an interrupted run; delete the folder to start over)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = load_digits_dataset("mnist", "train")
    test_images, test_labels = load_digits_dataset("mnist", "test")
    report: dict = {}
    if (folder / "report.json").exists():  # resume: stages already trained are kept
        report = json.loads((folder / "report.json").read_text())
    if "vqvae" in report and (folder / "vqvae").exists():
        vq = from_folder(VQVAE, folder / "vqvae").eval()
    else:
        vq, report["vqvae"] = train_vqvae(images, steps=60 if quick else 2000, seed=SEED)
        vq.save_pretrained(folder / "vqvae")
    if "classifier" in report and (folder / "classifier").exists():
        classifier = from_folder(DigitClassifier, folder / "classifier").eval()
    else:
        classifier = train_classifier(images, labels, steps=60 if quick else 1500, seed=SEED)
        classifier.save_pretrained(folder / "classifier")
        report["classifier"] = {"test_accuracy": accuracy(classifier, test_images, test_labels)}
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    codes, code_labels = tokenize(vq, images, labels, 2 if quick else COPIES, SEED)
    test_codes = vq.encode(test_images).flatten(1)
    report["data"] = {"sequences": len(codes), "tokens_per_image": codes.shape[1],
                      "codes_used": int(torch.unique(codes).numel())}
    small = dict(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128)
    for part, shape, steps, batch, lr in (("draft", DRAFT, 1500, 64, 2e-3), ("target", TARGET, 1400, 48, 1e-3)):
        shape = small if quick else shape
        if part in report and (folder / part).exists():
            model = load_gpt(folder / part)
            continue
        config = gpt_config(shape["layers"], shape["hidden"], shape["heads"], shape["kv_heads"],
                            shape["intermediate"], codebook_size=vq.codebook_size)
        model, losses = train_gpt(config, codes, code_labels, steps=20 if quick else steps, batch_size=batch,
                                  lr=lr, seed=SEED, desc=part)
        if part == "target":  # int8 on disk (the zoo's budget: the target is the pair's largest piece)
            save_int8(model, folder / part)
        else:
            model.to(torch.float16).save_pretrained(folder / part)  # fp16 on disk, fp32 to run
            model.float()
        report[part] = {"params": sum(p.numel() for p in model.parameters()), "final_loss": sum(losses[-50:]) / len(losses[-50:]),
                        "heldout_loss": heldout_loss(model, test_codes, test_labels)}
        (folder / "report.json").write_text(json.dumps(report, indent=2))
    target = model
    h = target.config.hidden_size
    head_config = EagleConfig(hidden_size=h, draft_vocab_size=vq.codebook_size, target_vocab_size=vq.codebook_size,
                              intermediate_size=target.config.intermediate_size,
                              num_attention_heads=target.config.num_attention_heads,
                              num_key_value_heads=target.config.num_key_value_heads,
                              max_position_embeddings=target.config.max_position_embeddings)
    torch.manual_seed(SEED)
    head = EagleHead(head_config)
    n_seq = 200 if quick else 8000
    seqs = torch.cat([target.class_tokens(code_labels[:n_seq]), codes[:n_seq]], dim=1)
    train_config = EagleTrainConfig(seq_len=seqs.shape[1], batch_size=32, epochs=1 if quick else 3, lr=1e-3,
                                    warmup_steps=30, feature_weight=1.0, ce_weight=0.5, feature_batch=250, seed=SEED)
    history = guided_eagle_trainer(target, head, CFG_SCALE, train_config).fit(list(seqs))
    head.save(folder / "eagle")
    report["eagle"] = {"cfg_scale": CFG_SCALE, "history": history}
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    return report


def image_drafter(pair: ImagePair, kind: str = "eagle", guidance_scale: float | None = CFG_SCALE):
    """The pair's drafters: "eagle" (the EAGLE head over the target's features; it was distilled at
    `CFG_SCALE`, so it drafts the guided law without an unconditional half) or "draft" (the independent
    2-layer AR model, run with the same guidance as the target: both halves, as the target)."""
    if kind == "eagle":
        return EagleDrafter(pair.eagle_head, pair.target)
    if kind == "draft":
        engine = ImageGPTTarget(pair.draft_model, name="draft_model")
        return ModelDrafter(engine if guidance_scale is None else GuidedTarget(engine, guidance_scale))
    raise ValueError(f"kind: expected 'eagle' or 'draft', got {kind!r}")


def load_gpt(folder: Path) -> ClassConditionalGPT:
    """A stored `ClassConditionalGPT` in fp32: int8 (`multispec.zoo.int8`) or `save_pretrained`'s fp16/fp32."""
    if (folder / INT8_FILE).exists():
        return load_int8(ClassConditionalGPT, folder)
    return ClassConditionalGPT.from_pretrained(folder, dtype=torch.float32).eval()


def load_pair(folder: Path | None = None) -> ImagePair:
    """The trained pieces from `folder` (default: the shipped zoo weights)."""
    folder = Path(folder) if folder is not None else zoo.path(NAME)
    if not (folder / "target" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train {NAME}`")
    load = lambda cls, sub: from_folder(cls, folder / sub).eval()  # noqa: E731
    target, draft = load_gpt(folder / "target"), load_gpt(folder / "draft")
    return ImagePair(load(VQVAE, "vqvae"), target, draft, EagleHead.load(folder / "eagle"),
                     load(DigitClassifier, "classifier"), folder)


def _zoo_load(folder: Path):
    pair = load_pair(folder)
    return ZooPair(pair.target, image_drafter(pair, "eagle"), pair.vqvae, NAME)


def zoo_entry():
    return ZooEntry(NAME, "class-conditional MNIST: VQ-VAE (7x7 codes of 512) + 12-layer LlamaGen-style GPT, an EAGLE "
                    "head distilled at guidance 2 and a 2-layer AR draft (multispec.image_ar; LANTERN)", None,
                    _zoo_load, lambda folder: train_pair(folder))
