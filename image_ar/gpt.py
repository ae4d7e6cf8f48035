"""A LlamaGen-style class-conditional image GPT: a class token and a begin-image token, then the image's
VQ codes in raster order, next-token prediction, classifier-free guidance by a null class.

It is a `transformers` `LlamaForCausalLM` (1-D RoPE where LlamaGen uses 2-D; everything else the same
shape of model) with two changes a class-conditional image model needs: the input vocabulary holds the
codes, then one token per class, then the null class (`codebook_size + num_classes`), and the output head
scores codes only (`codebook_size` rows), so no sampler can ever emit a class token. `save_pretrained` /
`ClassConditionalGPT.from_pretrained` work as for any `transformers` model; the speculative core runs it
through its lean Llama forward (`ImageGPTTarget`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from multispec.plugin import uniform


class ImageGPTConfig(LlamaConfig):
    """`LlamaConfig` plus the image layout: `codebook_size` codes, `num_classes` classes (+ a null class),
    `grid_size` x `grid_size` tokens per image. `vocab_size` (the input embedding) is derived."""

    def __init__(self, codebook_size: int = 512, num_classes: int = 10, grid_size: int = 7, **kwargs):
        kwargs["vocab_size"] = codebook_size + num_classes + 2
        kwargs.setdefault("tie_word_embeddings", False)
        # room past the last code: the last speculative step drafts nodes beyond it (RoPE needs no table)
        kwargs.setdefault("max_position_embeddings", grid_size * grid_size + 2 + 64)
        super().__init__(**kwargs)
        self.codebook_size, self.num_classes, self.grid_size = codebook_size, num_classes, grid_size

    @property
    def num_image_tokens(self) -> int:
        return self.grid_size * self.grid_size

    @property
    def null_class_token(self) -> int:
        return self.codebook_size + self.num_classes

    @property
    def begin_image_token(self) -> int:
        return self.codebook_size + self.num_classes + 1


class ClassConditionalGPT(LlamaForCausalLM):
    """See the module docstring. Sequence: [class token, begin-image, code_1, ..., code_{grid^2}]."""

    config_class = ImageGPTConfig

    def __init__(self, config: ImageGPTConfig):
        super().__init__(config)
        self.lm_head = nn.Linear(config.hidden_size, config.codebook_size, bias=False)
        self.post_init()

    def class_tokens(self, labels: torch.Tensor | list[int]) -> torch.Tensor:
        """Prompt ids [N, 2] (class token, begin-image) for class labels (None or -1: the null class, i.e.
        unconditional)."""
        if isinstance(labels, (list, tuple)):
            labels = [-1 if v is None else int(v) for v in labels]
        labels = torch.as_tensor(labels, device=self.device)  # on the model's device, as its prompt must be
        c = self.config
        if labels.dim() != 1 or ((labels < -1) | (labels >= c.num_classes)).any():
            raise ValueError(f"labels: expected class ids in [0, {c.num_classes}) (or -1 for unconditional), got "
                             f"{labels.tolist()}")
        classes = torch.where(labels < 0, c.null_class_token, c.codebook_size + labels).long()[:, None]
        return torch.cat([classes, torch.full_like(classes, c.begin_image_token)], dim=1)

    def unconditional_tokens(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """The same prompts with every class token replaced by the null class (CFG's unconditional half)."""
        c = self.config
        is_class = (prompt_ids >= c.codebook_size) & (prompt_ids < c.null_class_token)
        return torch.where(is_class, c.null_class_token, prompt_ids)

    def image_loss(self, labels: torch.Tensor, codes: torch.Tensor, class_dropout: float = 0.1,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """Next-code cross-entropy on images `codes` [N, grid^2] of `labels` [N]; a `class_dropout`
        fraction of rows is shown the null class (so the model also learns the unconditional law)."""
        prompt = self.class_tokens(labels)
        if class_dropout > 0:
            drop = uniform((len(labels),), generator, prompt.device) < class_dropout
            prompt = torch.where(drop[:, None], self.unconditional_tokens(prompt), prompt)
        ids = torch.cat([prompt, codes.long()], dim=1)
        logits = self(input_ids=ids[:, :-1]).logits[:, prompt.shape[1] - 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), codes.reshape(-1).long())


def gpt_config(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, codebook_size: int = 512,
               num_classes: int = 10, grid_size: int = 7) -> ImageGPTConfig:
    return ImageGPTConfig(codebook_size=codebook_size, num_classes=num_classes, grid_size=grid_size,
                          hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=1e-5,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
