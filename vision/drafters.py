"""EAGLE-style drafters for vision-language targets: plain (every image embedding in the draft sequence),
ViSpec (a query adaptor compresses each image to q-1 tokens plus a global vector fused into the features of
the text after the image) and SpecVLM (an elastic compressor picks importance pruning, 2-D pooling, 2-D
convolution or a resampler per input).

The draft sequence pairs token x_{j+1} with the target's feature f_j (entry j), as the core's EAGLE head
does; at the entries whose next token is an image token, the drafter sees the target's projected image
embedding instead of the image token's embedding (plain), or the compressor's tokens instead of all of
them, placed where the image's last entries were (ViSpec, SpecVLM). Compressed tokens enter the decoder
directly (they bypass `fc`, as in ViSpec). Positions count the draft sequence's own entries, in training
and at inference alike. All of a row's image tokens form one span (one image per row, as in the zoo;
several images in a row are compressed together).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import PreTrainedModel

from multispec.plugin import (EagleConfig, EagleDrafter, EagleHead, FeatureRequest, Features, Prompt, dequantize_state,
                              is_quantized)

from .compress import COMPRESSORS, ElasticCompressor, QueryAdaptor

MODES = ("eagle", "vispec", "specvlm")


@dataclass
class VisionDraftConfig:
    mode: str = "eagle"  # eagle | vispec | specvlm
    image_token_id: int = 0
    num_queries: int = 2  # vispec: q queries -> q-1 draft tokens + 1 global vector
    global_vector: bool = True  # vispec: fuse the global vector into the features of the text after the image
    ratio: int = 4  # specvlm: compression of prune / pool / conv (a square: 2-D windows)
    resampler_queries: int = 2  # specvlm
    branches: tuple[str, ...] = COMPRESSORS  # specvlm: the gate's choices ("text" only as an ablation)

    def __post_init__(self):
        self.branches = tuple(self.branches)
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        if self.mode == "vispec" and self.num_queries < 1 + (not self.global_vector):
            raise ValueError(f"num_queries: ViSpec needs at least {1 + (not self.global_vector)}, got {self.num_queries}")


class VisionEagleHead(EagleHead):
    """`EagleHead` plus a ViSpec query adaptor with its global-vector fusion, or a SpecVLM compressor."""

    def __init__(self, config: EagleConfig, vision: VisionDraftConfig, d2t: torch.Tensor | None = None):
        super().__init__(config, d2t)
        self.vision = vision
        h, heads = config.hidden_size, config.num_attention_heads
        self.adaptor = self.img_fc = self.compressor = None
        if vision.mode == "vispec":
            self.adaptor = QueryAdaptor(h, heads, vision.num_queries)
            if vision.global_vector:
                # [I | 0]: starts as a pass-through of the feature (a text-trained head loads unchanged)
                self.img_fc = nn.Linear(2 * h, h)
                with torch.no_grad():
                    self.img_fc.weight.zero_()
                    self.img_fc.weight[:, :h] = torch.eye(h)
                    self.img_fc.bias.zero_()
        elif vision.mode == "specvlm":
            self.compressor = ElasticCompressor(h, heads, vision.ratio, vision.resampler_queries, vision.branches)

    def fuse_global(self, features: torch.Tensor, global_vec: torch.Tensor | None,
                    where: torch.Tensor | None = None) -> torch.Tensor:
        """ViSpec: img_fc(cat(f, g)) with each row's g [B, H] broadcast over the positions of f [B, S, H], at
        the entries `where` [B, S] marks (None: all); the others keep f (the text before the image, rows
        without one)."""
        if self.img_fc is None or global_vec is None:
            return features
        g = global_vec[:, None, :].to(self.img_fc.weight.dtype).expand(-1, features.shape[1], -1)
        fused = self.img_fc(torch.cat([features.to(g.dtype), g], -1))
        return fused if where is None else torch.where(where[..., None], fused, features.to(fused.dtype))

    def save(self, folder: str | Path, dtype: torch.dtype = torch.float16, int8: bool = False) -> None:
        super().save(folder, dtype, int8)
        (Path(folder) / "vision_config.json").write_text(json.dumps(asdict(self.vision), indent=2))

    @staticmethod
    def load(folder: str | Path, dtype: torch.dtype = torch.float32) -> "VisionEagleHead":
        folder = Path(folder)
        for name in ("eagle_config.json", "vision_config.json"):
            if not (folder / name).exists():
                raise FileNotFoundError(f"folder: no {name} in {folder} (train one with `multispec train vision-draft`)")
        config = EagleConfig(**json.loads((folder / "eagle_config.json").read_text()))
        vision = VisionDraftConfig(**json.loads((folder / "vision_config.json").read_text()))
        tensors = load_file(str(folder / "eagle.safetensors"))
        if is_quantized(tensors):  # stored with int8=True: the dequantized head is the shipped one
            tensors = dequantize_state(tensors)
        head = VisionEagleHead(config, vision, tensors["d2t"])
        head.load_state_dict({k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()})
        return head.to(dtype).eval()


@dataclass
class DraftSequence:
    embeds: torch.Tensor  # [B, S, H] decoder inputs, left-padded
    mask: torch.Tensor  # [B, S] 1 = a real entry
    index: torch.Tensor  # [B, E] column of each original entry in the sequence; -1 = compressed away / padding
    global_vec: torch.Tensor | None  # [B, H] (ViSpec) or None
    has_image: torch.Tensor  # [B] whether the row holds an image
    choice: torch.Tensor | None  # [B, branches] the gate's one-hot choice (SpecVLM) or None


def build_draft_sequence(head: VisionEagleHead, embed: nn.Module, tokens: torch.Tensor, mask: torch.Tensor,
                         features: torch.Tensor, image_embeds: torch.Tensor | None, image_mask: torch.Tensor | None,
                         question_at: torch.Tensor, tau: float = 1.0, gumbel: torch.Tensor | None = None
                         ) -> DraftSequence:
    """The draft's input sequence for entries j (token `tokens[:, j]` = x_{j+1}, feature `features[:, j]` =
    f_j; `mask` marks real entries), shared by training and inference so both see the same thing. `question_at`
    [B]: the entry whose feature summarises the question (the gate reads it); `gumbel`: see `ElasticCompressor`."""
    vision = head.vision
    b, e = tokens.shape
    dtype = head.fc.weight.dtype
    device = tokens.device
    mask = mask.bool()
    is_image = (tokens == vision.image_token_id) & mask
    counts = is_image.sum(1)
    if image_embeds is None:
        if bool(counts.any()):
            raise ValueError("features: the prompt holds image tokens but the target gave no image embeddings "
                             "(use a VLM target, e.g. multispec.vision.LlavaTarget)")
        image_embeds = features.new_zeros(b, 0, features.shape[-1])
        image_mask = torch.zeros(b, 0, dtype=torch.bool, device=device)
    image_embeds, image_mask = image_embeds.to(device, dtype), image_mask.to(device).bool()
    # a prompt that starts with an image token (no BOS) has one image embedding no entry pairs with
    # (entry j holds token j+1): the compressors see it, the plain drafter's scatter skips it
    excess = image_mask.sum(1).to(counts) - counts
    if bool((excess < 0).any() | (excess > 1).any()):
        raise ValueError(f"image_embeds: rows hold {image_mask.sum(1).tolist()} image embeddings for "
                         f"{counts.tolist()} image tokens")
    scatter_mask = image_mask & (image_mask.long().cumsum(1) > excess[:, None])
    has_image = counts > 0
    global_vec, compressed, choice = None, None, None
    if vision.mode == "vispec" and image_embeds.shape[1]:
        z = head.adaptor(image_embeds, image_mask)  # [B, q, H]
        keep = vision.num_queries - 1 if vision.global_vector else vision.num_queries
        compressed = [z[r, :keep] if has_image[r] else z[r, :0] for r in range(b)]
        if vision.global_vector:
            global_vec = z[:, -1] * has_image[:, None]
    elif vision.mode == "vispec":
        global_vec = features.new_zeros(b, features.shape[-1]).to(dtype) if vision.global_vector else None
    elif vision.mode == "specvlm":
        compressed = [image_embeds.new_zeros(0, image_embeds.shape[-1])] * b
        if bool(has_image.any()):
            question = features[torch.arange(b, device=device), question_at].to(dtype)
            rows = has_image.nonzero().flatten()
            out, picked = head.compressor(image_embeds[rows], image_mask[rows], question[rows], tau,
                                          None if gumbel is None else gumbel[rows])
            for i, r in enumerate(rows.tolist()):
                compressed[r] = out[i]
            choice = torch.zeros(b, len(vision.branches), dtype=picked.dtype, device=device)
            choice[rows] = picked
    token_embeds = embed(tokens.clamp(min=0).to(embed.weight.device)).to(device, dtype)
    if vision.mode == "eagle" and image_embeds.shape[1]:
        token_embeds = token_embeds.masked_scatter(is_image[..., None], image_embeds[scatter_mask])
    # ViSpec's global vector reaches the text after the image only (entries past the row's last image token)
    last_image = torch.where(is_image, torch.arange(e, device=device), -1).max(1).values
    after_image = (torch.arange(e, device=device) > last_image[:, None]) & has_image[:, None] & mask
    feats = head.fuse_global(features.to(dtype) * mask[..., None], global_vec, after_image)
    fused = head.fc(torch.cat([token_embeds, feats], -1))
    if compressed is None:  # plain: one entry per original entry
        index = torch.where(mask, torch.arange(e, device=device).expand(b, e), -1)
        return DraftSequence(fused * mask[..., None], mask.long(), index, global_vec, has_image, choice)
    embeds, seq_mask, index = _packed(fused, mask, is_image, has_image, compressed)
    return DraftSequence(embeds, seq_mask, index, global_vec, has_image, choice)


def _packed(fused: torch.Tensor, mask: torch.Tensor, is_image: torch.Tensor, has_image: torch.Tensor,
            compressed: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's text entries with its compressed image tokens in place of the image, left-padded: (embeds,
    mask, the column of each original entry or -1)."""
    b, e = mask.shape
    device, dtype = fused.device, fused.dtype
    rows, index = [], torch.full((b, e), -1, dtype=torch.long, device=device)
    order = []
    for r in range(b):
        text = (mask[r] & ~is_image[r]).nonzero().flatten()
        if has_image[r]:
            last = int(is_image[r].nonzero().max())
            before, after = text[text < last], text[text > last]
            rows.append(torch.cat([fused[r, before], compressed[r].to(dtype), fused[r, after]]))
            order.append((before, len(compressed[r]), after))
        else:
            rows.append(fused[r, text])
            order.append((text, 0, text[:0]))
    width = max(1, max(len(x) for x in rows))
    embeds = fused.new_zeros(b, width, fused.shape[-1])
    seq_mask = torch.zeros(b, width, dtype=torch.long, device=device)
    for r, (x, (before, k, after)) in enumerate(zip(rows, order)):
        pad = width - len(x)
        embeds[r, pad:] = x
        seq_mask[r, pad:] = 1
        index[r, before] = pad + torch.arange(len(before), device=device)
        index[r, after] = pad + len(before) + k + torch.arange(len(after), device=device)
    return embeds, seq_mask, index


class VisionEagleDrafter(EagleDrafter):
    """Drafts for a VLM target (`LlavaTarget`, `Qwen2VLTarget`) with a `VisionEagleHead`; the prompt's image
    reaches the draft through the target's projected image embeddings (a feature request)."""

    feature_request = FeatureRequest(hidden=True, image_embeds=True)

    def __init__(self, head: VisionEagleHead, target: PreTrainedModel):
        if not isinstance(head, VisionEagleHead):
            raise TypeError(f"head: expected a VisionEagleHead, got {type(head).__name__}")
        super().__init__(head, target)
        image_token = getattr(target.config, "image_token_id", None)
        if image_token is not None and int(image_token) != head.vision.image_token_id:
            raise ValueError(f"head: trained with image token id {head.vision.image_token_id}, the target's is "
                             f"{image_token}")
        self._global = None

    @torch.no_grad()
    def draft_embeds(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        rows = self._has_image[:, None].expand(-1, features.shape[1])  # generated text follows the image
        return super().draft_embeds(tokens, self.head.fuse_global(features.to(self.device), self._global, rows))

    @torch.no_grad()
    def start(self, prompt: Prompt, features: Features | None = None) -> None:
        if features is None or features.hidden is None:
            raise ValueError("features: the VLM drafter needs the target's prefill hidden states")
        input_ids, attention_mask = prompt.input_ids.to(self.device), prompt.attention_mask.to(self.device)
        b, length = input_ids.shape
        if length < 2:
            raise ValueError("input_ids: the VLM drafter needs prompts of at least two tokens")
        feats = torch.zeros(b, length - 1, features.hidden.shape[-1], device=self.device, dtype=features.hidden.dtype)
        feats[:, : features.hidden.shape[1]] = features.hidden.to(self.device)
        tokens, mask = input_ids[:, 1:], attention_mask[:, 1:]
        question_at = torch.full((b,), length - 2, dtype=torch.long, device=self.device)
        seq = build_draft_sequence(self.head, self.embed, tokens, mask, feats, features.image_embeds,
                                   features.image_mask, question_at)
        self._global, self._has_image = seq.global_vec, seq.has_image
        self.last_choice = seq.choice  # SpecVLM: which compressor each row got (for reports and demos)
        # the last entry (x_{L-1}, f_{L-2}) is the first root: `lm.start` leaves it out and `propose` feeds it
        self.lm.start(seq.mask.new_zeros(seq.mask.shape), seq.mask, inputs_embeds=seq.embeds)
        self._pending_tokens = input_ids[:, -1:]
        self._pending_features = feats[:, -1:]
        self._pending_counts = [1] * b
        self._proposed = False

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        if self._global is not None:
            self._global = self._global[rows.to(self.device)]
            self._has_image = self._has_image[rows.to(self.device)]
