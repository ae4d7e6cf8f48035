"""EAGLE heads for Janus image generation, and `multispec train draft` for a Janus target.

A Janus prompt is text (ending on the begin-of-image token) and every generated token an image token, embedded
by `prepare_embeddings_for_image_generation` and scored by the generation head. The head reads the language
model's final hidden state (the conditional half's, under guidance) and takes each token embedded as the target
embeds it: the prompt's tokens (the first root, the begin-of-image token, included) with the text table, the
image tokens with the image one.

Training (`multispec train draft --target MY_JANUS --data prompts.txt`): each prompt (a line of text, or a JSONL
`prompt` / `text` field) is rendered as Janus's processor does in image mode (the tokenizer's chat template
when it has one, then the begin-of-image token), the target draws `--images-per-class` images for it, sampled
and guided at `--guidance-scale`, and the head learns the guided law u + s (c - u) at the image tokens, its
inputs left-padded to one width (the head masks the padding and counts positions from each row's first token,
as when it drafts). Every twentieth prompt (at least one) is held out: `report.json` gives the accepted length
of guided greedy generation on them, before and after training.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from multispec import EngineConfig, SamplingConfig, speculative_generate
from multispec.plugin import (DraftKind, EagleConfig, EagleDrafter, EagleHead, EagleTrainConfig, EagleTrainer,
                              GuidedTarget, NGramDrafter, Prompt, TrainLoop, current_shards, item_generator,
                              loop_config, loop_report, write_report)

from .targets import JanusImageTarget, restore_generation_kwargs


def is_janus(config) -> bool:
    return getattr(config, "model_type", None) == "janus"


def codebook_size(model: PreTrainedModel) -> int:
    return int(model.config.vq_config.num_embeddings)


def token_embeds(model: PreTrainedModel, ids: torch.Tensor, text_columns: int) -> torch.Tensor:
    """[B, S, H]: columns before `text_columns` embedded as text, the rest as image tokens."""
    image = model.prepare_embeddings_for_image_generation(ids.clamp(0, codebook_size(model) - 1))
    if text_columns <= 0:
        return image
    text = model.get_input_embeddings()(ids[:, :text_columns]).to(image.dtype)
    return torch.cat([text, image[:, text_columns:]], dim=1)


class JanusEagleDrafter(EagleDrafter):
    """An `EagleHead` drafting image tokens for a Janus target (see the module docstring)."""

    def __init__(self, head: EagleHead, target: PreTrainedModel):
        if not is_janus(getattr(target, "config", None)):
            raise TypeError(f"target: expected a transformers JanusForConditionalGeneration, got {type(target).__name__}")
        super().__init__(head, target)
        self.model = target
        self._prompt = False  # within `start`: every entry is a prompt (text) token
        self._text_root = False  # the next feed's first column is the prompt's last token

    @staticmethod
    def target_vocab_size(target: PreTrainedModel) -> int:
        return codebook_size(target)

    @torch.no_grad()
    def start(self, prompt: Prompt, features=None) -> None:
        self._prompt = True
        try:
            super().start(prompt, features)
        finally:
            self._prompt = False
        self._text_root = True

    @torch.no_grad()
    def draft_embeds(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        if self._prompt:
            return super().draft_embeds(tokens, features)
        # the first feed after `start` leads with the root, the prompt's last (text) token; a step the drafter
        # skipped queues its tokens behind it, so it stays in column 0
        text = 1 if self._text_root else 0
        self._text_root = False
        embeds = token_embeds(self.model, tokens.to(self.embed.weight.device), text)
        return self.head.fuse(embeds.to(self.device), features.to(self.device))


def janus_head(model: PreTrainedModel, seed: int = 0) -> EagleHead:
    """An untrained head mirroring one layer of Janus's language model, over its image codebook."""
    text = model.config.text_config
    v = codebook_size(model)
    config = EagleConfig(hidden_size=text.hidden_size, draft_vocab_size=v, target_vocab_size=v,
                         intermediate_size=text.intermediate_size, num_attention_heads=text.num_attention_heads,
                         num_key_value_heads=text.num_key_value_heads,
                         max_position_embeddings=text.max_position_embeddings)
    torch.manual_seed(seed)
    return EagleHead(config).to(model.device)


class JanusGuidedTrainer(EagleTrainer):
    """EAGLE's losses on [prompt, image tokens] rows, taught the guided law at the image tokens."""

    def __init__(self, target: PreTrainedModel, head: EagleHead, scale: float, prompt_width: int,
                 config: EagleTrainConfig):
        super().__init__(target, head, config)
        self.scale, self.prompt_width = scale, prompt_width
        self._width, self._uncond_next = 0, None

    @torch.no_grad()
    def features(self, ids: torch.Tensor, mask: torch.Tensor, uncond: torch.Tensor) -> torch.Tensor:
        """The conditional and unconditional runs' final hidden states side by side [B, S, 2H], in bf16."""
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        lm = self.target.model.language_model
        halves = [lm(inputs_embeds=token_embeds(self.target, x, self.prompt_width), attention_mask=mask,
                     position_ids=positions).last_hidden_state for x in (ids, uncond)]
        return torch.cat(halves, dim=-1).to(torch.bfloat16)

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        head = self.target.model.generation_head
        return head(features.to(next(head.parameters()).dtype)).float()[..., self.head.d2t]

    def teacher_logits(self, next_features: torch.Tensor) -> torch.Tensor:
        cond = self.target_logits(next_features)
        uncond = self.target_logits(self._uncond_next[:, : next_features.shape[1]])
        return uncond + self.scale * (cond - uncond)

    def head_inputs(self, next_tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        offset = self._width - next_tokens.shape[1]  # the column of next_tokens[:, 0] in the row
        embeds = token_embeds(self.target, next_tokens, self.prompt_width - offset).detach()
        return self.head.fuse(embeds, features)

    def losses(self, ids, feats, noise=None, attention_mask=None, loss_mask=None):
        h = feats.shape[-1] // 2
        self._width, self._uncond_next = ids.shape[1], feats[:, 1:, h:].float()
        return super().losses(ids, feats[..., :h], noise, attention_mask, loss_mask)


class JanusEagleKind(DraftKind):
    """The trained module and the shared loop's losses for a Janus head (rows of one width)."""

    name = "eagle"

    def __init__(self, target: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, uncond: torch.Tensor,
                 prompt_width: int, scale: float, seed: int, feature_batch: int = 8):
        self.target, self.ids, self.mask, self.seed = target, ids, mask, seed
        self.module = self.head = janus_head(target, seed)
        self.trainer = JanusGuidedTrainer(target, self.head, scale, prompt_width, EagleTrainConfig(ce_weight=0.5))
        self.features = torch.cat([self.trainer.features(ids[i:i + feature_batch], mask[i:i + feature_batch],
                                                         uncond[i:i + feature_batch])
                                   for i in range(0, len(ids), feature_batch)])
        # entry j predicts token j + 2: the image tokens' entries count
        self.loss_mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool, device=ids.device)
        self.loss_mask[:, prompt_width - 2: ids.shape[1] - 2] = True

    def losses(self, items: Sequence[int], step: int) -> dict:
        rows = torch.tensor(list(items), device=self.ids.device)
        ids, feats = self.ids[rows], self.features[rows]
        s, h = ids.shape[1] - 1, feats.shape[-1] // 2
        device = feats.device
        noise = torch.stack([torch.randn(s, h, generator=item_generator(self.seed, step, i, device), device=device)
                             for i in items])
        parts = self.trainer.losses(ids, feats, noise=noise, attention_mask=self.mask[rows],
                                    loss_mask=self.loss_mask[rows])
        return {"total": parts["total"], "acc": parts["acc"], "tokens": float(self.loss_mask[rows].sum())}

    def save(self, folder) -> None:
        self.head.save(folder)

    def drafter(self) -> JanusEagleDrafter:
        return JanusEagleDrafter(self.head.eval(), self.target)


# ---- data -------------------------------------------------------------------------------------------------


def read_prompts(path: str | Path) -> list[str]:
    """Prompts: the non-empty lines of a text file, or the `prompt` (or `text`) field of each JSONL record."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data: {path} is not a file")
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        prompts = []
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"--data: {path}:{n}: not JSON ({err.msg})") from None
            text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"--data: {path}:{n}: expected a 'prompt' or 'text' field")
            prompts.append(text)
        lines = prompts
    if not lines:
        raise ValueError(f"--data: {path} holds no prompt")
    return lines


def prompt_ids(tokenizer, model: PreTrainedModel, text: str) -> list[int]:
    """What Janus's processor feeds in image mode: BOS, the prompt (as a user turn of the chat template when the
    tokenizer has one), the begin-of-image token."""
    config = model.generation_config
    boi = (getattr(config, "generation_kwargs", None) or {}).get("boi_token_id")
    if boi is None or config.bos_token_id is None:
        raise ValueError("--target: its generation_config needs bos_token_id and generation_kwargs['boi_token_id'] "
                         "(Janus's image mode)")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if not ids or ids[0] != config.bos_token_id:
        ids = [config.bos_token_id] + ids
    return ids + [boi]


def left_padded(rows: Sequence[Sequence[int]], pad: int, device, width: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows left-padded to `width` (default the longest) and their attention mask."""
    width = width or max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def unconditional(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """The rows with their prompts made unconditional as the target's guidance makes them (image tokens kept)."""
    prompt = JanusImageTarget(model).unconditional_prompt(Prompt(ids[:, :prompt_width], mask[:, :prompt_width], {}))
    return torch.cat([prompt.input_ids, ids[:, prompt_width:]], dim=1)


@torch.no_grad()
def draw_images(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, scale: float, seed: int,
                batch: int = 16) -> torch.Tensor:
    """Image tokens [N, T] the target samples for left-padded prompts, guided at `scale` (plain decoding)."""
    guided, n = GuidedTarget(model, scale), int(model.config.vision_config.num_image_tokens)
    generator = torch.Generator(ids.device).manual_seed(seed)
    out = []
    for i in range(0, len(ids), batch):
        seq = speculative_generate(guided, NGramDrafter(), ids[i:i + batch], attention_mask=mask[i:i + batch],
                                   max_new_tokens=n,
                                   tree=0, sampling=SamplingConfig(do_sample=True), generator=generator,
                                   engine=EngineConfig(progress=False)).sequences
        out.append(seq[:, ids.shape[1]:])
    return torch.cat(out)


@torch.no_grad()
def accepted(model: PreTrainedModel, drafter, ids: torch.Tensor, mask: torch.Tensor, scale: float) -> float:
    """Tokens committed per target forward, guided greedy generation of one image per prompt, chains of 4."""
    n = int(model.config.vision_config.num_image_tokens)
    out = speculative_generate(GuidedTarget(model, scale), drafter, ids, attention_mask=mask, max_new_tokens=n, tree=4)
    return round(out.stats.mean_accepted_length, 4)


def run(args: argparse.Namespace, scale: float, per_prompt: int) -> int:
    """`multispec train draft` for a Janus target (see the module docstring)."""
    from transformers import AutoTokenizer, JanusForConditionalGeneration

    shards = current_shards()
    model = JanusForConditionalGeneration.from_pretrained(args.target, dtype=torch.float32).eval()
    restore_generation_kwargs(model, args.target)
    device = args.device or (str(shards.device) if shards.world > 1 else None)
    if device is not None:
        model.to(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"--target: {args.target} has no tokenizer transformers can load ({err})") from None
    prompts = [prompt_ids(tokenizer, model, p) for p in read_prompts(args.data)]
    held_at = set(range(19, len(prompts), 20)) or ({len(prompts) - 1} if len(prompts) > 1 else set())
    held = [p for i, p in enumerate(prompts) if i in held_at] or prompts
    train = [p for i, p in enumerate(prompts) if i not in held_at]
    pad = model.generation_config.pad_token_id or 0
    width = max(len(p) for p in prompts)
    ids, mask = left_padded([p for p in train for _ in range(per_prompt)], pad, model.device, width)
    codes = draw_images(model, ids, mask, scale, args.seed)
    rows, row_mask = torch.cat([ids, codes], 1), torch.cat([mask, torch.ones_like(codes)], 1)
    kind = JanusEagleKind(model, rows, row_mask, unconditional(model, rows, row_mask, width), width, scale, args.seed)
    held_ids, held_mask = left_padded(held, pad, model.device)
    untrained = accepted(model, kind.drafter(), held_ids, held_mask, scale) if shards.main else None
    loop = loop_config(args)
    trainer = TrainLoop(kind.module, kind.losses, len(rows), loop, args.out, shards, desc="train eagle (Janus)")
    history = trainer.run()
    report = loop_report(args, trainer, history, guidance_scale=scale, prompts=len(train), heldout_prompts=len(held),
                         images=len(rows), untrained_accepted_length=untrained)
    if shards.main:
        if trainer.finished:
            kind.save(args.out)
            report["accepted_length"] = accepted(model, kind.drafter(), held_ids, held_mask, scale)
            report["eval"] = {"prompts": len(held), "chain_k": 4, "guided": scale, "greedy": True}
        write_report(args.out, report)
    return 0


__all__ = ["JanusEagleDrafter", "JanusEagleKind", "JanusGuidedTrainer", "accepted", "draw_images", "is_janus",
           "janus_head", "prompt_ids", "read_prompts", "run", "token_embeds", "unconditional"]
