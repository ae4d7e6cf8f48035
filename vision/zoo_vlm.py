"""The zoo VLM: a `transformers` `LlavaForConditionalGeneration` (SigLIP tower, 64 image tokens, a Llama text
model over bytes) trained here on the procedural VQA generator. Loadable with `from_pretrained` like any
Llava checkpoint; `VQAProcessor` plays the role of the model's processor (bytes need no tokenizer files).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from PIL import Image

from multispec.plugin import Checkpoint, INT8_FILE, load_int8, save_int8, train_steps

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
    image_size, patch_size = IMAGE_SIZE, PATCH  # the vision tower's input and patches: (64 / 8)^2 image tokens
    answer_prefix = " "  # what separates "A:" from the answer in the training rows (bytes: a space)

    @property
    def num_image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def prompt_ids(self, question: str) -> list[int]:
        return [self.bos_token_id] + [self.image_token_id] * self.num_image_tokens + self.encode(f"Q: {question}\nA:")

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """[3, size, size] in [-1, 1]; any mode or size is converted (RGB, bilinear resize)."""
        if not isinstance(image, Image.Image):
            raise TypeError(f"image: expected a PIL.Image, got {type(image).__name__}")
        image = image.convert("RGB")
        size = self.image_size
        if image.size != (size, size):
            image = image.resize((size, size), Image.BILINEAR)
        x = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(size, size, 3)
        return x.permute(2, 0, 1).float() / 127.5 - 1.0

    def __call__(self, images: Image.Image | list[Image.Image], questions: str | list[str]) -> dict[str, torch.Tensor]:
        """A left-padded batch: input_ids, attention_mask, pixel_values (one image per question)."""
        images = [images] if isinstance(images, Image.Image) else list(images)
        questions = [questions] if isinstance(questions, str) else list(questions)
        if len(images) != len(questions):
            raise ValueError(f"images: {len(images)} images for {len(questions)} questions (one each)")
        rows = [self.prompt_ids(q) for q in questions]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, width - len(row):] = torch.tensor(row)
            mask[r, width - len(row):] = 1
        return dict(input_ids=ids, attention_mask=mask, pixel_values=torch.stack([self.pixels(i) for i in images]))


def vlm_config(layers: int = 6, hidden: int = 256, processor: VQAProcessor | None = None):
    """SigLIP (no CLS token: strategy "full") over the processor's images and patches (the byte processor's
    64x64 images in 8x8 patches -> 64 tokens); a Llama text model over its vocabulary."""
    from transformers import LlamaConfig, LlavaConfig, SiglipVisionConfig

    p = processor or VQAProcessor()
    vision = SiglipVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                image_size=p.image_size, patch_size=p.patch_size, num_channels=3)
    text = LlamaConfig(vocab_size=p.vocab_size, hidden_size=hidden, intermediate_size=hidden * 5 // 2,
                       num_hidden_layers=layers, num_attention_heads=hidden // 64,
                       num_key_value_heads=2 if hidden // 64 % 2 == 0 else 1,  # must divide the heads
                       max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=p.bos_token_id,
                       eos_token_id=p.eos_token_id, pad_token_id=p.pad_token_id)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_id=p.image_token_id,
                       vision_feature_select_strategy="full", vision_feature_layer=-1, projector_hidden_act="gelu",
                       tie_word_embeddings=False)


def training_batch(samples: list[VQASample], processor: VQAProcessor) -> dict[str, torch.Tensor]:
    """Right-padded prompt + answer + EOS; labels only on the answer (and EOS)."""
    rows, labels = [], []
    for s in samples:
        prompt = processor.prompt_ids(s.question)
        answer = processor.encode(processor.answer_prefix + s.answer) + [processor.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), processor.pad_token_id, dtype=torch.long)
    lab = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for r, (row, lr) in enumerate(zip(rows, labels)):
        ids[r, :len(row)], lab[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), torch.tensor(lr), 1
    return dict(input_ids=ids, attention_mask=mask, labels=lab,
                pixel_values=torch.stack([processor.pixels(s.image) for s in samples]))


@dataclass(frozen=True)
class VLMRecipe:
    """How a zoo VLM is trained: its size, and a budget of `steps` batches of fresh procedural samples (batch
    `step` is drawn with seed `data_seed + step`, so no image repeats and a resumed run sees the same data);
    even steps ask short questions, odd steps descriptions and explanations (batches of similar lengths pad
    little). The vision tower starts from a pretrained one (`multispec.vision.tower`) and learns at
    `tower_lr_scale` times the rate of the rest (0: frozen, as LLaVA keeps its CLIP tower)."""

    layers: int = 16
    hidden: int = 256
    steps: int = 2400
    batch_size: int = 16
    lr: float = 1e-3
    tower_lr_scale: float = 0.1
    warmup: int = 100
    seed: int = 0
    data_seed: int = 100_000


def training_stream(recipe: VLMRecipe, processor: VQAProcessor):
    """`step -> batch` of the recipe's data stream."""
    def batch(step: int) -> dict[str, torch.Tensor]:
        samples = generate_vqa(recipe.batch_size, seed=recipe.data_seed + step, long_fraction=float(step % 2))
        return training_batch(samples, processor)
    return batch


def train_vlm(out_dir: str | Path, recipe: VLMRecipe, tower_state: dict[str, torch.Tensor] | None = None,
              int8: bool = False, checkpoint_every: int = 100, processor: VQAProcessor | None = None) -> dict:
    """Train a zoo VLM (fixed seed) and save it as a Llava checkpoint (fp16 `save_pretrained`, or int8
    storage with `int8`) with a training report; a run that was cut off resumes from `out_dir/resume.pt`,
    and a finished one is read back, not retrained."""
    from transformers import LlavaForConditionalGeneration

    out_dir = Path(out_dir)
    report_file = out_dir / "training_report.json"
    if report_file.exists():
        return json.loads(report_file.read_text())
    processor = processor or VQAProcessor()
    torch.manual_seed(recipe.seed)
    model = LlavaForConditionalGeneration(vlm_config(recipe.layers, recipe.hidden, processor))
    if tower_state is not None:
        model.model.vision_tower.load_state_dict(tower_state)
    if recipe.tower_lr_scale == 0:  # a frozen tower (LLaVA's recipe): no gradient, no optimiser state
        model.model.vision_tower.requires_grad_(False)
    tower = set(map(id, model.model.vision_tower.parameters()))
    groups = {}
    for p in (p for p in model.parameters() if p.requires_grad):
        key = (id(p) in tower, p.dim() >= 2)
        groups.setdefault(key, []).append(p)
    opt = torch.optim.AdamW([{"params": ps, "lr": recipe.lr * (recipe.tower_lr_scale if in_tower else 1.0),
                              "weight_decay": 0.05 if matrix else 0.0} for (in_tower, matrix), ps in groups.items()],
                            betas=(0.9, 0.95))
    warm, steps = recipe.warmup, recipe.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    run = Checkpoint(out_dir / "resume.pt", asdict(recipe) | {"pretrained_tower": tower_state is not None,
                                                               "processor": type(processor).__name__}, model,
                     opt, sched, every=checkpoint_every, total=steps)
    model.train()
    losses = train_steps(model, training_stream(recipe, processor), steps, (opt, sched),
                         f"zoo VLM ({recipe.layers} layers)", checkpoint=run)
    model.eval()
    model.generation_config.pad_token_id = processor.pad_token_id
    model.generation_config.eos_token_id = processor.eos_token_id
    if int8:
        save_int8(model, out_dir)
    else:
        model.to(torch.float16).save_pretrained(out_dir)
    report = {"recipe": asdict(recipe), "pretrained_tower": tower_state is not None,
              "processor": type(processor).__name__,
              "params": sum(p.numel() for p in model.parameters()), "storage": "int8" if int8 else "fp16",
              "final_loss": sum(losses[-50:]) / len(losses[-50:]),
              "loss_curve": [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 4) for i in range(0, steps, 50)],
              "seconds": round(run.seconds())}
    report_file.write_text(json.dumps(report, indent=2))
    run.finish()
    return report


def load_vlm(folder: str | Path, dtype: torch.dtype = torch.float32):
    """A zoo VLM folder: int8 storage (`multispec.zoo.int8`, loaded as fp32) or a `save_pretrained` checkpoint."""
    from transformers import LlavaForConditionalGeneration

    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained VLM; run `multispec zoo train vqa-llava`")
    if (folder / INT8_FILE).exists():
        return load_int8(LlavaForConditionalGeneration, folder).to(dtype)
    return LlavaForConditionalGeneration.from_pretrained(folder, dtype=dtype).eval()
