"""Vision-language models as speculative targets (and draft models): `transformers`' Llava, LLaVA-NeXT,
LLaVA-OneVision, Mistral 3, Idefics3 / SmolVLM, Gemma 3, PaliGemma and Qwen2-VL / Qwen2.5-VL / Qwen3-VL classes, as users
load them.

Prefill runs the model's own vision tower and projector (`get_image_features`) and places the image
embeddings at the prompt's image tokens, as the model's forward does; everything after the prompt is text,
fed as token ids through `HFCausalLM`'s tree attention (additive float masks, commit by gather). What
differs per family is the positions: Llava counts tokens; Qwen2-VL gives every token 3-axis rotary
positions (`get_rope_index`), and a token after the prompt sits at its 1-D index plus the row's
`rope_deltas` on all three axes. Forgetting the delta is silently wrong (by ~3e-3 in the logits), so
the adapter owns the positions and the loop never computes one.
"""

from __future__ import annotations

import abc
from typing import Any

import torch
from transformers import PreTrainedModel

from multispec.plugin import (FeatureRequest, Features, HFCausalLM, LeanCausalLM, NO_FEATURES, PrefillOutput, Prompt,
                              StaticFeed, lean_unsupported)


class VisionLanguageTarget(HFCausalLM):
    """What Llava and Qwen2-VL share: images enter at prefill, through the image tokens of `input_ids`."""

    model_types: tuple[str, ...] = ()
    prefill_inputs = frozenset({"pixel_values"})
    appended_token_type = 0  # the per-token type (e.g. `token_type_ids`) of text appended after the prompt
    provides = FeatureRequest(hidden=True, layers=(0,), image_embeds=True)

    def __init__(self, model: PreTrainedModel, name: str = "target"):
        if not (isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) in self.model_types):
            raise TypeError(f"{name}: expected a transformers {' or '.join(self.model_types)} model, "
                            f"got {type(model).__name__}")
        super().__init__(model, name)
        self.image_token_id = int(model.config.image_token_id)

    @abc.abstractmethod
    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        """Projected image embeddings of every image in the batch, in prompt order, [N, H] (each model
        family runs its own vision tower and projector)."""

    def _prepare_positions(self, prompt: Prompt, image_tokens: torch.Tensor) -> None:
        """Called before the prefill: adapters with their own position scheme set it up here."""

    def _place_images(self, embeds: torch.Tensor, image_tokens: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """The prompt's input embeddings with the image embeddings at its image tokens (an adapter whose model
        places them inside its own forward, with more than the embeddings, returns `embeds` unchanged)."""
        return embeds.masked_scatter(image_tokens[..., None], image)

    def check_prompt(self, prompt: Prompt) -> None:
        super().check_prompt(prompt)
        mask = prompt.attention_mask.bool()
        image_tokens = (prompt.input_ids == self.image_token_id) & mask
        n = int(image_tokens.sum())
        if n and "pixel_values" not in prompt.inputs:
            raise ValueError(f"pixel_values: input_ids hold {n} image tokens (id {self.image_token_id}) but no "
                             "pixel_values were given")
        if not n and "pixel_values" in prompt.inputs:
            raise ValueError(f"pixel_values: given, but input_ids hold no image token (id {self.image_token_id}); "
                             "build the prompt with the model's processor")
        if bool(image_tokens[:, -1].any()):
            # the last prompt token is fed later as a token id: its image embedding would be lost
            raise ValueError("input_ids: a prompt ends with an image token; end it with text (as chat templates do)")

    @torch.no_grad()
    def prefill(self, prompt: Prompt, request: FeatureRequest = NO_FEATURES) -> PrefillOutput:
        self.check_prompt(prompt)
        self.check_request(request)
        ids, mask = prompt.input_ids.to(self.device), prompt.attention_mask.to(self.device)
        image_tokens = (ids == self.image_token_id) & mask.bool()
        table = self.model.get_input_embeddings()
        # an image id outside the text vocabulary (PaliGemma's may be): its embedding is replaced below anyway
        outside = self.image_token_id >= table.num_embeddings
        embeds = table(ids.masked_fill(image_tokens, 0) if outside else ids)
        image = None
        if bool(image_tokens.any()):
            image = self._image_embeddings(prompt.inputs).to(embeds.device, embeds.dtype)
            n = int(image_tokens.sum())
            if image.shape[0] != n:
                raise ValueError(f"pixel_values: the images give {image.shape[0]} embeddings, but input_ids hold {n} "
                                 "image tokens")
            embeds = self._place_images(embeds, image_tokens, image)
        self._prepare_positions(prompt, image_tokens)
        out = self.start(ids, mask, inputs_embeds=embeds, request=request)
        if request.image_embeds:
            counts = image_tokens.sum(dim=1)
            width = int(counts.max())
            slots = torch.arange(width, device=self.device)[None, :] < counts[:, None]
            per_row = embeds.new_zeros(ids.shape[0], width, embeds.shape[-1])
            if image is not None:
                per_row[slots] = image
            features = out.features if out.features is not None else Features()
            features.image_embeds, features.image_mask = per_row, slots
            out.features = features
        return out


class LlavaTarget(VisionLanguageTarget):
    """`LlavaForConditionalGeneration`, the any-resolution `LlavaNextForConditionalGeneration` and
    `LlavaOnevisionForConditionalGeneration` (tiles per `image_sizes`, unpadding and image-newline embeddings:
    the model's own `get_image_features` packs them in the order of the prompt's image tokens), and
    `Mistral3ForConditionalGeneration` (a Pixtral tower over each image at its own `image_sizes`, patches merged
    by the projector; its row-break and end tokens are text in the prompt)."""

    model_types = ("llava", "llava_next", "llava_onevision", "mistral3")
    prefill_inputs = frozenset({"pixel_values", "image_sizes", "batch_num_images"})

    # Pixtral (Mistral 3) runs all images as one sequence with a block-diagonal mask, whose size grows with
    # the square of the batch's patches: its images go through the tower this many at a time (the same result)
    pixtral_chunk = 16

    def check_prompt(self, prompt: Prompt) -> None:
        super().check_prompt(prompt)
        needs_sizes = self.model.config.model_type in ("mistral3", "llava_next", "llava_onevision")
        if needs_sizes and "pixel_values" in prompt.inputs and "image_sizes" not in prompt.inputs:
            raise ValueError(f"image_sizes: {type(self.model).__name__} needs each image's (height, width) with "
                             "pixel_values; the processor returns it with input_ids")

    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        extra = {k: inputs[k] for k in ("image_sizes", "batch_num_images") if k in inputs}
        pixels = inputs["pixel_values"].to(self.device, self.dtype)
        if self.model.config.model_type == "mistral3":
            parts = []
            for i in range(0, pixels.shape[0], self.pixtral_chunk):
                out = self.model.model.get_image_features(
                    pixel_values=pixels[i: i + self.pixtral_chunk], return_dict=True,
                    image_sizes=extra["image_sizes"][i: i + self.pixtral_chunk])
                parts.extend(out.pooler_output)
            return torch.cat(parts, dim=0)
        out = self.model.model.get_image_features(pixel_values=pixels, return_dict=True, **extra)
        return torch.cat(list(out.pooler_output), dim=0)


class Qwen2VLTarget(VisionLanguageTarget):
    """`Qwen2VLForConditionalGeneration` and `Qwen2_5_VLForConditionalGeneration`: 3-axis rotary positions
    from `get_rope_index` at prefill; tree nodes at each row's token count + its rope delta, on every axis."""

    model_types = ("qwen2_vl", "qwen2_5_vl")
    prefill_inputs = frozenset({"pixel_values", "image_grid_thw", "mm_token_type_ids"})
    per_token_inputs = frozenset({"mm_token_type_ids"})
    graph_attributes = ("rope_deltas",)  # read by `node_positions`: a fixed-shape step's graph input

    def check_prompt(self, prompt: Prompt) -> None:
        super().check_prompt(prompt)
        if "pixel_values" in prompt.inputs:
            for name, what in (("image_grid_thw", "each image's (t, h, w) patch grid"),
                               ("mm_token_type_ids", "which tokens are text (0) and image (1)")):
                if name not in prompt.inputs:
                    raise ValueError(f"{name}: {type(self.model).__name__} needs it with pixel_values ({what}); "
                                     "the processor returns it with input_ids")
            types = prompt.inputs["mm_token_type_ids"]
            if tuple(types.shape) != tuple(prompt.input_ids.shape):
                raise ValueError(f"mm_token_type_ids: shape {tuple(types.shape)} does not match input_ids "
                                 f"{tuple(prompt.input_ids.shape)}")

    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        out = self.model.model.get_image_features(inputs["pixel_values"].to(self.device),
                                                  inputs["image_grid_thw"].to(self.device), return_dict=True)
        return torch.cat(list(out.pooler_output), dim=0)

    def _prepare_positions(self, prompt: Prompt, image_tokens: torch.Tensor) -> None:
        ids, mask = prompt.input_ids.to(self.device), prompt.attention_mask.to(self.device)
        if bool(image_tokens.any()):
            positions, deltas = self.model.model.get_rope_index(
                input_ids=ids, mm_token_type_ids=prompt.inputs["mm_token_type_ids"].to(self.device),
                image_grid_thw=prompt.inputs["image_grid_thw"].to(self.device), attention_mask=mask)
            self.rope_deltas = deltas.reshape(-1).to(self.device)
        else:  # text only: 1-D positions on every axis
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[None].expand(3, -1, -1)
            self.rope_deltas = torch.zeros(ids.shape[0], dtype=torch.long, device=self.device)
        self._prompt_positions = positions[:, :, :-1]  # the prefilled tokens (the last one is the first root)

    def prefill_positions(self, positions: torch.Tensor) -> torch.Tensor:
        return self._prompt_positions

    def node_positions(self, positions: torch.Tensor) -> torch.Tensor:
        return (positions + self.rope_deltas[:, None])[None].expand(3, -1, -1)

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self.rope_deltas = self.rope_deltas[rows.to(self.device)]


class Idefics3Target(VisionLanguageTarget):
    """`Idefics3ForConditionalGeneration` and `SmolVLMForConditionalGeneration`: `pixel_values` [B, images per
    row, C, H, W] (an all-zero image is padding and gives no tokens) with `pixel_attention_mask` [B, images,
    H, W]; the model's own tower, pixel shuffle and connector give each image's tokens, in prompt order.
    Positions count tokens."""

    model_types = ("idefics3", "smolvlm")
    prefill_inputs = frozenset({"pixel_values", "pixel_attention_mask"})

    def check_prompt(self, prompt: Prompt) -> None:
        super().check_prompt(prompt)
        pixels = prompt.inputs.get("pixel_values")
        if pixels is not None and (pixels.dim() != 5 or pixels.shape[0] != prompt.input_ids.shape[0]):
            raise ValueError(f"pixel_values: {type(self.model).__name__} takes [batch, images per row, channels, "
                             f"height, width] with one entry per prompt row, got {tuple(pixels.shape)}")

    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        mask = inputs.get("pixel_attention_mask")
        out = self.model.model.get_image_features(
            pixel_values=inputs["pixel_values"].to(self.device, self.dtype), return_dict=True,
            pixel_attention_mask=None if mask is None else mask.to(self.device))
        return torch.cat(list(out.pooler_output), dim=0)


class Gemma3VLTarget(VisionLanguageTarget):
    """`Gemma3ForConditionalGeneration`: SigLIP tower and pooled projector (`mm_tokens_per_image` tokens an
    image); in the prompt the tokens of one image attend to each other both ways (and earlier tokens causally),
    as the model's own mask does from `token_type_ids` (here read from the image tokens themselves, which the
    processor marks alike); sliding-window layers apply their window on top. Positions count tokens."""

    model_types = ("gemma3",)
    prefill_inputs = frozenset({"pixel_values", "token_type_ids"})
    per_token_inputs = frozenset({"token_type_ids"})

    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        out = self.model.model.get_image_features(inputs["pixel_values"].to(self.device, self.dtype), return_dict=True)
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])

    def prefill_blocks(self, ids: torch.Tensor, mask2d: torch.Tensor) -> torch.Tensor:
        image = (ids == self.image_token_id) & mask2d.bool()
        starts = image & ~torch.nn.functional.pad(image, (1, 0))[:, :-1]
        block = torch.where(image, starts.long().cumsum(-1), 0)  # 1, 2, ... per image run; 0 for text
        return (block[:, :, None] == block[:, None, :]) & (block[:, :, None] > 0)


class PaliGemmaTarget(VisionLanguageTarget):
    """`PaliGemmaForConditionalGeneration` (PaliGemma 1 and 2): SigLIP tower and linear projector; a prefix LM,
    whose prefix (the tokens of type 0 in `token_type_ids`: the image and the prompt text) attends both ways,
    the rest causally. The prefill therefore runs the whole prompt (`prefill_whole_prompt`). Without
    `token_type_ids` the model attends causally, and so does the adapter. Positions count from 1 (the
    model's convention); generated tokens are suffix (type 1)."""

    model_types = ("paligemma",)
    prefill_inputs = frozenset({"pixel_values", "token_type_ids"})
    per_token_inputs = frozenset({"token_type_ids"})
    appended_token_type = 1
    prefill_whole_prompt = True
    blocks_cross_windows = True
    _prefix: torch.Tensor | None = None  # [B, L] the prompt's prefix tokens (set before each prefill)
    _root_in_prefix = False  # the next feed's roots are the prompts' last tokens (before the first commit)

    def __init__(self, model: PreTrainedModel, name: str = "target"):
        if not (isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) in self.model_types):
            raise TypeError(f"{name}: expected a transformers paligemma model, got {type(model).__name__}")
        # the text model is driven directly: PaliGemma's own forward rebuilds every mask from a 2-D one, while
        # the tree needs its per-layer masks (full and sliding) as given; logits are softcapped alike
        HFCausalLM.__init__(self, text_model_view(model), name)
        self.vlm = self.shown_model = model
        self.image_token_id = int(model.config.image_token_id)

    def check_prompt(self, prompt: Prompt) -> None:
        super().check_prompt(prompt)
        types = prompt.inputs.get("token_type_ids")
        if types is not None and tuple(types.shape) != tuple(prompt.input_ids.shape):
            raise ValueError(f"token_type_ids: shape {tuple(types.shape)} does not match input_ids "
                             f"{tuple(prompt.input_ids.shape)}")

    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        out = self.vlm.model.get_image_features(inputs["pixel_values"].to(self.device, self.dtype), return_dict=True)
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])

    def _prepare_positions(self, prompt: Prompt, image_tokens: torch.Tensor) -> None:
        types = prompt.inputs.get("token_type_ids")
        self._prefix = None if types is None else (types == 0).to(self.device)
        self._root_in_prefix = self._prefix is not None

    def prefill_blocks(self, ids: torch.Tensor, mask2d: torch.Tensor) -> torch.Tensor | None:
        if self._prefix is None:
            return None
        prefix = self._prefix[:, : ids.shape[1]] & mask2d.bool()
        return prefix[:, :, None] & prefix[:, None, :]

    def prefill_positions(self, positions: torch.Tensor) -> torch.Tensor:
        return positions + 1

    def node_positions(self, positions: torch.Tensor) -> torch.Tensor:
        return positions + 1

    def feed_unwindowed(self, allowed: torch.Tensor, cols: torch.Tensor, p0: int) -> torch.Tensor | None:
        # the last prompt token, fed as the first root, belongs to the prefix: in the model's own prompt pass its
        # sliding layers attend to the whole prefix, past their window (`transformers` ORs the prefix block
        # onto the windowed causal mask), so the root must too, until the first commit
        if self._prefix is None or p0 or not self._root_in_prefix:
            return None
        extra = torch.zeros_like(allowed)
        w = cols.shape[0]
        last = self._prefix[:, -1]
        extra[:, 0, :w] = allowed[:, 0, :w] & self._prefix[:, cols] & last[:, None]
        return extra

    def commit(self, path: torch.Tensor, counts=None) -> None:
        super().commit(path, counts)
        self._root_in_prefix = False

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        if self._prefix is not None:
            self._prefix = self._prefix[rows.to(self.device)]


class StaticPaliGemmaFeed(StaticFeed):
    """Mixed in before `PaliGemmaTarget`: its feeds at fixed shapes (`multispec.targets.static_hf`), the first
    root's reach past the sliding window over the prefix (`feed_unwindowed`) given as tensors the captured graph
    reads: the prefix over every cache column and, per row, whether the next root is the prompt's last prefix
    token."""

    graph_attributes = ("_prefix_cols", "_root_flag")

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        out = super().start(input_ids, attention_mask, **kwargs)
        b = input_ids.shape[0]
        self._prefix_cols = torch.zeros(b, self.capacity, dtype=torch.bool, device=self.device)
        self._root_flag = torch.zeros(b, dtype=torch.bool, device=self.device)
        if self._prefix is not None:
            self._prefix_cols[:, : self._prefix.shape[1]] = self._prefix
            self._root_flag = self._prefix[:, -1] & self._root_in_prefix
        return out

    def unwindowed_pairs(self, allowed: torch.Tensor) -> torch.Tensor:
        extra = torch.zeros_like(allowed)
        extra[:, :, 0] = allowed[:, :, 0] & self._prefix_cols[:, None] & self._root_flag[:, None, None]
        return extra

    def commit(self, path: torch.Tensor, counts=None) -> None:
        super().commit(path, counts)
        self._root_flag = torch.zeros_like(self._root_flag)

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        rows = rows.to(self.device)
        self._prefix_cols, self._root_flag = self._prefix_cols[rows], self._root_flag[rows]


class Qwen3VLTarget(Qwen2VLTarget):
    """`Qwen3VLForConditionalGeneration`: Qwen2-VL's 3-axis positions (interleaved M-RoPE inside the model), and
    deepstack: features of the vision tower's intermediate layers are added to the hidden states at the image
    positions after the first decoder layers. The prefill therefore hands the model its own encoder outputs
    (`mm_encoder_outputs`) with the prompt's plain token embeddings, and the model places the image embeddings
    and the deepstack features itself; the tree nodes after the prompt are text and need neither."""

    model_types = ("qwen3_vl",)

    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        out = self.model.model.get_image_features(inputs["pixel_values"].to(self.device),
                                                  inputs["image_grid_thw"].to(self.device), return_dict=True)
        self._encoder_outputs = out  # for the prefill's forward (`prefill_extra_inputs`)
        return torch.cat(list(out.pooler_output), dim=0)

    def _place_images(self, embeds: torch.Tensor, image_tokens: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return embeds

    def prefill_extra_inputs(self) -> dict:
        out, self._encoder_outputs = getattr(self, "_encoder_outputs", None), None  # this prefill's alone
        return {} if out is None else {"mm_encoder_outputs": {"image": out}}


def text_model_view(model: PreTrainedModel) -> PreTrainedModel:
    """A causal LM of the VLM's text config whose decoder and head *are* the VLM's (shared modules, no
    copy): what the core's lean engine drives once the image embeddings are in place. Built once per
    model (it costs ~20 ms) and kept on it."""
    from transformers import AutoModelForCausalLM

    view = model.__dict__.get("_multispec_text_view")
    if view is not None and view.model is model.model.language_model and view.lm_head is model.lm_head:
        return view
    config = model.config.get_text_config()
    with torch.device("meta"):  # the view's own weights are replaced at once: never allocate them
        view = AutoModelForCausalLM.from_config(config)
    view.model = model.model.language_model
    view.lm_head = model.lm_head
    view.generation_config = model.generation_config
    model.__dict__["_multispec_text_view"] = view  # outside nn.Module's registries: not a submodule
    return view


def lean_llava_unsupported(model: Any) -> str | None:
    """None if `LeanLlavaTarget` can drive `model` (a Llava whose text model the lean engine runs)."""
    if not (isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) == "llava"):
        return "not a Llava model"
    text = model.config.get_text_config()
    if getattr(text, "model_type", None) not in ("llama", "mistral", "qwen2"):
        return f"text model {getattr(text, 'model_type', None)!r}"
    return lean_unsupported(text_model_view(model))


class LeanLlavaTarget(LlavaTarget, LeanCausalLM):
    """`LlavaTarget` whose language model runs through the core's lean forward (fused projections, a
    rotary table, no module dispatch): the same logits as the model's own forward at a fraction of the
    per-call cost, as `as_target` does for text Llama / Mistral / Qwen2. The prefill still runs the
    Llava's vision tower and projector. `LlavaTarget` stays as the reference."""

    eager_class = LlavaTarget  # what the fixed-shape step wraps (`multispec.targets.static_hf`)

    def __init__(self, model: PreTrainedModel, name: str = "target"):
        reason = lean_llava_unsupported(model)
        if reason is not None:
            raise TypeError(f"{name}: the lean Llava target does not support this model: {reason}")
        LeanCausalLM.__init__(self, text_model_view(model), name)
        self.vlm = self.shown_model = model
        self.image_token_id = int(model.config.image_token_id)

    def _image_embeddings(self, inputs: dict[str, Any]) -> torch.Tensor:
        extra = {"image_sizes": inputs["image_sizes"]} if "image_sizes" in inputs else {}
        pixels = inputs["pixel_values"].to(self.device, self.dtype)
        out = self.vlm.model.get_image_features(pixel_values=pixels, return_dict=True, **extra)
        return torch.cat(list(out.pooler_output), dim=0)


ADAPTERS = (LlavaTarget, Qwen2VLTarget, Qwen3VLTarget, Idefics3Target, Gemma3VLTarget, PaliGemmaTarget)


# the fixed-shape classes (`step="static"`), one written for each adapter: the model's own forward at fixed shapes
# (`StaticFeed`) under the adapter's inputs and positions; PaliGemma's with its prefix root's masks as tensors
class StaticVisionLanguageTarget(StaticFeed, VisionLanguageTarget):
    """`VisionLanguageTarget` at fixed shapes."""


class StaticLlavaTarget(StaticFeed, LlavaTarget):
    """`LlavaTarget` (and `LeanLlavaTarget`, which stands in for it) at fixed shapes."""


class StaticQwen2VLTarget(StaticFeed, Qwen2VLTarget):
    """`Qwen2VLTarget` at fixed shapes (its 3-axis positions as the eager feed gives them)."""


class StaticQwen3VLTarget(StaticFeed, Qwen3VLTarget):
    """`Qwen3VLTarget` at fixed shapes."""


class StaticIdefics3Target(StaticFeed, Idefics3Target):
    """`Idefics3Target` (SmolVLM too) at fixed shapes."""


class StaticGemma3VLTarget(StaticFeed, Gemma3VLTarget):
    """`Gemma3VLTarget` at fixed shapes."""


class StaticPaliGemmaTarget(StaticPaliGemmaFeed, PaliGemmaTarget):
    """`PaliGemmaTarget` at fixed shapes, its prefix root's reach past the window given as tensors."""


FIXED_SHAPE_CLASSES = {VisionLanguageTarget: StaticVisionLanguageTarget, LlavaTarget: StaticLlavaTarget,
                       Qwen2VLTarget: StaticQwen2VLTarget, Qwen3VLTarget: StaticQwen3VLTarget,
                       Idefics3Target: StaticIdefics3Target, Gemma3VLTarget: StaticGemma3VLTarget,
                       PaliGemmaTarget: StaticPaliGemmaTarget}


def vision_adapter_for(model: Any) -> type[VisionLanguageTarget] | None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type == "llava" and lean_llava_unsupported(model) is None:
        return LeanLlavaTarget
    for adapter in ADAPTERS:
        if isinstance(model, PreTrainedModel) and model_type in adapter.model_types:
            return adapter
    return None
