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
        # `labels`: a training target some processors add (PaliGemma's), not a model input
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor) and k != "labels"}

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


@dataclass
class AnswerExample:
    inputs: dict[str, torch.Tensor]  # one row's prompt inputs (batch dimension 1, unpadded)
    answer: torch.Tensor  # the target's answer ids [A] (ending with EOS when it stopped)


def collate_examples(examples: list[AnswerExample], pad_token_id: int = 0, answer_token_type: int = 0
                     ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Right-padded prompt + answer rows and labels (-100 outside the answer). Per-token inputs (Qwen2-VL's
    `mm_token_type_ids`, Gemma 3's and PaliGemma's `token_type_ids`) are extended over the answer with
    `answer_token_type` (text: 0; PaliGemma's causal suffix: 1, its adapter's `appended_token_type`);
    `pixel_values` are stacked (one image per row, Llava; images of different sizes zero-padded to the largest,
    as Pixtral's processor pads a batch; LLaVA-NeXT / OneVision tiles and Idefics3 images padded to a common
    count, with `image_sizes` / `pixel_attention_mask`) or concatenated with `image_grid_thw` (Qwen2-VL's
    flattened patches)."""
    rows = [torch.cat([e.inputs["input_ids"][0], e.answer]) for e in examples]
    width = max(len(r) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    per_token = [name for name in ("mm_token_type_ids", "token_type_ids") if name in examples[0].inputs]
    types = {name: torch.full_like(ids, answer_token_type) for name in per_token}
    for r, (row, e) in enumerate(zip(rows, examples)):
        p = e.inputs["input_ids"].shape[1]
        ids[r, :len(row)], mask[r, :len(row)] = row, 1
        labels[r, p:len(row)] = e.answer
        for name, laid in types.items():
            laid[r, :p] = e.inputs[name][0]
    out = dict(input_ids=ids, attention_mask=mask, **types)
    if "image_grid_thw" in examples[0].inputs:
        out["pixel_values"] = torch.cat([e.inputs["pixel_values"] for e in examples])
        out["image_grid_thw"] = torch.cat([e.inputs["image_grid_thw"] for e in examples])
    elif "pixel_values" in examples[0].inputs:
        out["pixel_values"] = _pad_cat([e.inputs["pixel_values"] for e in examples])
        if "pixel_attention_mask" in examples[0].inputs:
            out["pixel_attention_mask"] = _pad_cat([e.inputs["pixel_attention_mask"] for e in examples])
        for key in ("image_sizes", "batch_num_images"):  # per-image inputs of the any-resolution families
            if key in examples[0].inputs:
                out[key] = torch.cat([e.inputs[key] for e in examples])
    return out, labels


def _pad_cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along dim 0 after zero-padding every other dim to the largest (any-resolution tiles and
    Idefics3 images per row: dim 1; images of different sizes: the last two dims). Zero tiles and images are
    padding to the models, as their processors make them; `image_sizes` say what is real."""
    most = [max(p.shape[d] for p in parts) for d in range(parts[0].dim())]
    out = []
    for p in parts:
        pad = []
        for d in reversed(range(1, p.dim())):
            pad += [0, most[d] - p.shape[d]]
        out.append(torch.nn.functional.pad(p, pad) if any(pad) else p)
    return torch.cat(out)


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
