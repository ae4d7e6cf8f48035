"""The zoo VLM: a `transformers` `LlavaForConditionalGeneration` (SigLIP tower, 64 image tokens, a Llama text
model over bytes) trained here on the procedural VQA generator. Loadable with `from_pretrained` like any
Llava checkpoint; `VQAProcessor` plays the role of the model's processor (bytes need no tokenizer files).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
from PIL import Image

from multispec.zoo.training import train_steps

from .vqa_synth import VQASample, generate_vqa

IMAGE_SIZE, PATCH = 64, 8
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # 64
BOS, EOS, IMAGE, PAD = 256, 257, 258, 259
VOCAB = 260


class VQAProcessor:
    """Bytes as token ids 0..255 plus BOS/EOS/image/pad; prompt = BOS, the image's 64 tokens, then
    "Q: <question>\\nA:" (the answer follows after a space)."""

    vocab_size = VOCAB
    bos_token_id, eos_token_id, image_token_id, pad_token_id = BOS, EOS, IMAGE, PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def prompt_ids(self, question: str) -> list[int]:
        return [BOS] + [IMAGE] * NUM_IMAGE_TOKENS + self.encode(f"Q: {question}\nA:")

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """[3, 64, 64] in [-1, 1]; any mode or size is converted (RGB, bilinear resize)."""
        if not isinstance(image, Image.Image):
            raise TypeError(f"image: expected a PIL.Image, got {type(image).__name__}")
        image = image.convert("RGB")
        if image.size != (IMAGE_SIZE, IMAGE_SIZE):
            image = image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
        x = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(IMAGE_SIZE, IMAGE_SIZE, 3)
        return x.permute(2, 0, 1).float() / 127.5 - 1.0

    def __call__(self, images: Image.Image | list[Image.Image], questions: str | list[str]) -> dict[str, torch.Tensor]:
        """A left-padded batch: input_ids, attention_mask, pixel_values (one image per question)."""
        images = [images] if isinstance(images, Image.Image) else list(images)
        questions = [questions] if isinstance(questions, str) else list(questions)
        if len(images) != len(questions):
            raise ValueError(f"images: {len(images)} images for {len(questions)} questions (one each)")
        rows = [self.prompt_ids(q) for q in questions]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, width - len(row):] = torch.tensor(row)
            mask[r, width - len(row):] = 1
        return dict(input_ids=ids, attention_mask=mask, pixel_values=torch.stack([self.pixels(i) for i in images]))


def vlm_config(layers: int = 6, hidden: int = 256):
    """SigLIP (no CLS token: strategy "full") 64x64 images in 8x8 patches -> 64 tokens; Llama text model."""
    from transformers import LlamaConfig, LlavaConfig, SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                image_size=IMAGE_SIZE, patch_size=PATCH, num_channels=3)
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 5 // 2,
                       num_hidden_layers=layers, num_attention_heads=hidden // 64,
                       num_key_value_heads=min(2, hidden // 64),
                       max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS,
                       pad_token_id=PAD)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE,
                       vision_feature_select_strategy="full", vision_feature_layer=-1, projector_hidden_act="gelu",
                       tie_word_embeddings=False)


def training_batch(samples: list[VQASample], processor: VQAProcessor) -> dict[str, torch.Tensor]:
    """Right-padded prompt + answer + EOS; labels only on the answer (and EOS)."""
    rows, labels = [], []
    for s in samples:
        prompt = processor.prompt_ids(s.question)
        answer = processor.encode(" " + s.answer) + [EOS]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    lab = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for r, (row, lr) in enumerate(zip(rows, labels)):
        ids[r, :len(row)], lab[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), torch.tensor(lr), 1
    return dict(input_ids=ids, attention_mask=mask, labels=lab,
                pixel_values=torch.stack([processor.pixels(s.image) for s in samples]))


def train_vlm(out_dir: str | Path, steps: int = 1500, batch_size: int = 16, lr: float = 2e-3, samples: int = 12000,
              seed: int = 0, layers: int = 6, hidden: int = 256) -> dict:
    """Train the zoo VLM from scratch (fixed seed) on `samples` procedural VQA samples and save it as a
    Llava checkpoint (fp16) with a training report."""
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(seed)
    rng = random.Random(seed)
    start = time.time()
    data = generate_vqa(samples, seed=seed + 1000)  # the evaluation sets use other seeds
    processor = VQAProcessor()
    model = LlavaForConditionalGeneration(vlm_config(layers, hidden))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.05)
    warm = 50
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else
                                              0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm))))
    losses = train_steps(model, lambda _step: training_batch(rng.sample(data, batch_size), processor), steps, opt,
                         sched, "zoo VLM")
    model.eval()
    out_dir = Path(out_dir)
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = EOS
    model.to(torch.float16).save_pretrained(out_dir)
    report = {"steps": steps, "batch_size": batch_size, "samples": samples, "final_loss": sum(losses[-50:]) / 50,
              "loss_curve": [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 4) for i in range(0, steps, 50)],
              "seconds": round(time.time() - start)}
    (out_dir / "training_report.json").write_text(json.dumps(report, indent=2))
    return report


def load_vlm(folder: str | Path, dtype: torch.dtype = torch.float32):
    from transformers import LlavaForConditionalGeneration

    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained VLM; run `multispec zoo train vqa-llava`")
    return LlavaForConditionalGeneration.from_pretrained(folder, dtype=dtype).eval()
