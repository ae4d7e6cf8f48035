"""Model inputs for a user's VLM checkpoint: its own `transformers` processor behind the small interface the
evaluation and training code use (`processor(image, question) -> model inputs`, `decode(ids)`), and
batching of single-row examples (prompt + the target's answer) for drafter training."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


class HFVQAProcessor:
    """Wraps `AutoProcessor.from_pretrained(path)`: the question goes into the chat template with one image
    (the processor expands the image tokens), or "<image token>\\n<question>" when there is no template."""

    def __init__(self, processor):
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)

    @staticmethod
    def from_pretrained(path: str | Path) -> "HFVQAProcessor":
        from transformers import AutoProcessor

        try:
            return HFVQAProcessor(AutoProcessor.from_pretrained(path))
        except (OSError, ValueError) as err:
            raise FileNotFoundError(f"--target: no usable processor in {path} ({err}); save the model's processor "
                                    "beside it (processor.save_pretrained)") from err

    def prompt(self, question: str) -> str:
        if getattr(self.processor, "chat_template", None):
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
            return self.processor.apply_chat_template(messages, add_generation_prompt=True)
        return f"{getattr(self.processor, 'image_token', '<image>')}\n{question}"

    def __call__(self, image, question: str) -> dict[str, torch.Tensor]:
        out = self.processor(images=image.convert("RGB"), text=self.prompt(question), return_tensors="pt")
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


@dataclass
class AnswerExample:
    inputs: dict[str, torch.Tensor]  # one row's prompt inputs (batch dimension 1, unpadded)
    answer: torch.Tensor  # the target's answer ids [A] (ending with EOS when it stopped)


def collate_examples(examples: list[AnswerExample], pad_token_id: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Right-padded prompt + answer rows and labels (-100 outside the answer). Per-token inputs (Qwen2-VL's
    `mm_token_type_ids`) are extended with text (0) over the answer; `pixel_values` are stacked (one image
    per row, Llava; LLaVA-NeXT / OneVision tiles padded to a common count, with `image_sizes`) or
    concatenated with `image_grid_thw` (Qwen2-VL's flattened patches)."""
    rows = [torch.cat([e.inputs["input_ids"][0], e.answer]) for e in examples]
    width = max(len(r) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    types = torch.zeros_like(ids) if "mm_token_type_ids" in examples[0].inputs else None
    for r, (row, e) in enumerate(zip(rows, examples)):
        p = e.inputs["input_ids"].shape[1]
        ids[r, :len(row)], mask[r, :len(row)] = row, 1
        labels[r, p:len(row)] = e.answer
        if types is not None:
            types[r, :p] = e.inputs["mm_token_type_ids"][0]
    out = dict(input_ids=ids, attention_mask=mask)
    if types is not None:
        out["mm_token_type_ids"] = types
    if "image_grid_thw" in examples[0].inputs:
        out["pixel_values"] = torch.cat([e.inputs["pixel_values"] for e in examples])
        out["image_grid_thw"] = torch.cat([e.inputs["image_grid_thw"] for e in examples])
    elif "pixel_values" in examples[0].inputs:
        pixels = [e.inputs["pixel_values"] for e in examples]
        if pixels[0].dim() == 5:  # any-resolution tiles [1, tiles, C, H, W]: zero tiles up to the most, as the
            most = max(p.shape[1] for p in pixels)  # image processors pad a batch (image_sizes say what is real)
            pixels = [torch.cat([p, p.new_zeros(p.shape[0], most - p.shape[1], *p.shape[2:])], 1) for p in pixels]
        out["pixel_values"] = torch.cat(pixels)
        for key in ("image_sizes", "batch_num_images"):  # per-image inputs of the any-resolution families
            if key in examples[0].inputs:
                out[key] = torch.cat([e.inputs[key] for e in examples])
    return out, labels


@torch.no_grad()
def answer_examples(model, processor, images_and_questions, max_new_tokens: int, eos_token_id: int | None,
                    pad_token_id: int = 0, progress: bool = True) -> list[AnswerExample]:
    """The target's own greedy answers (the drafter's training data), one question at a time."""
    from tqdm.auto import tqdm

    out = []
    for image, question in tqdm(list(images_and_questions), desc="target answers", unit="question",
                                disable=not progress):
        inputs = processor(image, question)
        seq = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_token_id,
                             pad_token_id=pad_token_id)
        out.append(AnswerExample(inputs, seq[0, inputs["input_ids"].shape[1]:]))
    return out
