"""Tiny randomly initialised vision-language models of the real `transformers` classes, and prompts with
images for them (no download needed): for tests, examples and the README."""

from __future__ import annotations

import torch

from multispec.plugin import EagleConfig

from .drafters import VisionDraftConfig, VisionEagleHead
from .processing import AnswerExample

VOCAB = 128
IMAGE_TOKEN = 3  # inside the text vocabulary, as in the released checkpoints
VLM_KINDS = ("llava-clip", "llava-siglip", "llava-next", "llava-onevision", "qwen2-vl", "qwen2.5-vl", "mistral3",
             "idefics3", "smolvlm", "gemma3", "qwen3-vl", "paligemma")
# rows of a Mistral 3 batch: images of these sizes (height, width), 4x4 patches merged 2x2: 8 tokens each
MISTRAL3_SIZES = [(16, 32), (32, 16), (16, 32)]
# any-resolution tiles of 16x16 (LLaVA-NeXT / OneVision): images are cut into up to 2x2 tiles plus a base view
PINPOINTS = [[16, 16], [16, 32], [32, 16], [32, 32]]
# rows of a `vlm_prompts` batch get images of these sizes (rows 0 and 2 alike: a wrong-image control)
ANYRES_SIZES = [(20, 36), (30, 18), (20, 36)]
_TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1,
             eos_token_id=2, pad_token_id=0)


def make_vlm(kind: str = "llava-clip", seed: int = 0, head_scale: float = 8.0) -> torch.nn.Module:
    """A random VLM of `kind` (one of `VLM_KINDS`; each family's builder below says what it builds). The LM
    head is scaled so argmax ties are rare."""
    if kind not in _BUILDERS:
        raise ValueError(f"kind: expected one of {VLM_KINDS}, got {kind!r}")
    torch.manual_seed(seed)
    model = _BUILDERS[kind](kind)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    model.generation_config.pad_token_id = 0
    return model.eval()


def _small_tower(**extra) -> dict:
    """The vision towers' shared tiny shape: 16x16 images of 4x4 patches."""
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                patch_size=4, **extra)


def _llava(kind: str) -> torch.nn.Module:
    """Llava with a CLIP tower (CLS dropped: 16 image tokens) or a SigLIP tower (no CLS: strategy "full")."""
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              SiglipVisionConfig)

    siglip = kind == "llava-siglip"
    vision = SiglipVisionConfig(**_small_tower(num_channels=3)) if siglip else CLIPVisionConfig(
        **_small_tower(num_channels=3), projection_dim=32)
    config = LlavaConfig(vision_config=vision, text_config=LlamaConfig(**_TEXT), image_token_id=IMAGE_TOKEN,
                         vision_feature_select_strategy="full" if siglip else "default",
                         vision_feature_layer=-1, projector_hidden_act="gelu", tie_word_embeddings=False)
    return LlavaForConditionalGeneration(config)


def _qwen3_vl(kind: str) -> torch.nn.Module:
    """Qwen3-VL: Qwen2-VL's layout, interleaved M-RoPE, deepstack from both tower layers."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    rope = dict(rope_type="default", rope_theta=1e4, mrope_section=[2, 3, 3], mrope_interleaved=True)
    vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3, deepstack_visual_indexes=[0, 1],
                  num_position_embeddings=16)
    config = Qwen3VLConfig(text_config=dict(_TEXT, head_dim=16, rope_parameters=rope), vision_config=vision,
                           image_token_id=IMAGE_TOKEN, video_token_id=4, vision_start_token_id=5,
                           vision_end_token_id=6, tie_word_embeddings=False)
    return Qwen3VLForConditionalGeneration(config)


def _qwen2_vl(kind: str) -> torch.nn.Module:
    """Qwen2-VL / Qwen2.5-VL with 4x4 patches merged 2x2 (M-RoPE sections summing to head_dim / 2)."""
    import transformers

    rope = dict(rope_type="default", rope_theta=1e4, mrope_section=[2, 3, 3])
    if kind == "qwen2-vl":
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    else:
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=16,
                      fullatt_block_indexes=[1])
    prefix = "Qwen2VL" if kind == "qwen2-vl" else "Qwen2_5_VL"
    config = getattr(transformers, f"{prefix}Config")(
        text_config=dict(_TEXT, rope_parameters=rope), vision_config=vision, image_token_id=IMAGE_TOKEN,
        video_token_id=4, vision_start_token_id=5, vision_end_token_id=6, tie_word_embeddings=False)
    return getattr(transformers, f"{prefix}ForConditionalGeneration")(config)


def _mistral3(kind: str) -> torch.nn.Module:
    """Mistral 3: a Pixtral tower of 4x4 patches at each image's own size, merged 2x2 by the projector."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 head_dim=16, patch_size=4, image_size=32, num_channels=3)
    config = Mistral3Config(vision_config=vision, text_config=MistralConfig(**_TEXT, sliding_window=None),
                            image_token_index=IMAGE_TOKEN, spatial_merge_size=2, vision_feature_layer=-1,
                            tie_word_embeddings=False)
    return Mistral3ForConditionalGeneration(config)


def _idefics3(kind: str) -> torch.nn.Module:
    """Idefics3 / SmolVLM: pixel shuffle by 2 (4 tokens an image), up to 2 images a row, Llama text."""
    import transformers
    from transformers import LlamaConfig

    prefix = "Idefics3" if kind == "idefics3" else "SmolVLM"
    vision = getattr(transformers, f"{prefix}VisionConfig")(**_small_tower())
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=vision, text_config=LlamaConfig(**_TEXT), scale_factor=2, image_token_id=IMAGE_TOKEN,
        tie_word_embeddings=False)
    return getattr(transformers, f"{prefix}ForConditionalGeneration")(config)


def _gemma3(kind: str) -> torch.nn.Module:
    """Gemma 3: SigLIP, images pooled to 4 tokens; Gemma 3 text with a sliding layer (window 6) and a global one."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(**_TEXT, head_dim=16, sliding_window=6, query_pre_attn_scalar=16,
                            layer_types=["sliding_attention", "full_attention"])
    config = Gemma3Config(text_config=text, vision_config=SiglipVisionConfig(**_small_tower()), mm_tokens_per_image=4,
                          image_token_index=IMAGE_TOKEN, boi_token_index=4, eoi_token_index=5,
                          tie_word_embeddings=False)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # the projection initialises to zeros (no image would matter): random, about as
        # loud as the sqrt(hidden)-scaled text embeddings
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.05)
    return model


def _paligemma(kind: str) -> torch.nn.Module:
    """PaliGemma 2: SigLIP, 16 tokens an image; Gemma 2 text with softcaps, a sliding layer (window 6) and a
    global one; a prefix LM."""
    from transformers import Gemma2Config, PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipVisionConfig

    text = Gemma2Config(**_TEXT, head_dim=16, sliding_window=6, query_pre_attn_scalar=16,
                        layer_types=["sliding_attention", "full_attention"])
    vision = SiglipVisionConfig(**_small_tower(projection_dim=64))
    config = PaliGemmaConfig(text_config=text, vision_config=vision, image_token_index=IMAGE_TOKEN,
                             projection_dim=64, tie_word_embeddings=False)
    return PaliGemmaForConditionalGeneration(config)


def _anyres_vlm(kind: str) -> torch.nn.Module:
    """LLaVA-NeXT (CLIP tower, Llama text) or LLaVA-OneVision (SigLIP tower, Qwen2 text): any-resolution
    tiles of 16x16 images (`PINPOINTS`), 4x4 patches, image newline embeddings between rows of patches."""
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, Qwen2Config,
                              SiglipVisionConfig)

    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                 patch_size=4, num_channels=3)
    common = dict(image_token_id=IMAGE_TOKEN, vision_feature_layer=-1, image_grid_pinpoints=PINPOINTS,
                  tie_word_embeddings=False)
    if kind == "llava-next":
        config = LlavaNextConfig(vision_config=CLIPVisionConfig(**tower, projection_dim=32),
                                 text_config=LlamaConfig(**_TEXT), vision_feature_select_strategy="default", **common)
        return LlavaNextForConditionalGeneration(config)
    config = LlavaOnevisionConfig(vision_config=SiglipVisionConfig(**tower), text_config=Qwen2Config(**_TEXT),
                                  video_token_id=4, vision_feature_select_strategy="full", **common)
    return LlavaOnevisionForConditionalGeneration(config)


# one builder per family (LLaVA-NeXT / OneVision: `_anyres_vlm`, any-resolution tiles)
_BUILDERS = {"llava-clip": _llava, "llava-siglip": _llava, "llava-next": _anyres_vlm, "llava-onevision": _anyres_vlm,
             "qwen2-vl": _qwen2_vl, "qwen2.5-vl": _qwen2_vl, "qwen3-vl": _qwen3_vl, "mistral3": _mistral3,
             "idefics3": _idefics3, "smolvlm": _idefics3, "gemma3": _gemma3, "paligemma": _paligemma}


def anyres_images(kind: str, sizes: list[tuple[int, int]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random RGB images of `sizes` (height, width) through the model family's own image processor, as a
    user's processor call gives them (pixel_values of tiles, image_sizes, ...)."""
    import numpy as np
    from PIL import Image
    from transformers import LlavaNextImageProcessor, LlavaOnevisionImageProcessor

    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    if kind == "llava-next":
        processor = LlavaNextImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                            image_grid_pinpoints=PINPOINTS)
    else:
        processor = LlavaOnevisionImageProcessor(size={"height": 16, "width": 16}, image_grid_pinpoints=PINPOINTS)
    return dict(processor(images, return_tensors="pt"))


def anyres_token_counts(kind: str, images: dict[str, torch.Tensor]) -> list[int]:
    """Image tokens per image (tiles, unpadding and newlines included): what the processor expands each
    image placeholder to, read from the model family's own feature packing."""
    with torch.random.fork_rng():  # the caller's random stream stays as it was
        model = make_vlm(kind)
    with torch.no_grad():
        out = model.model.get_image_features(pixel_values=images["pixel_values"], image_sizes=images["image_sizes"],
                                             return_dict=True)
    return [int(t.shape[0]) for t in out.pooler_output]


def vlm_prompts(kind: str, before: tuple[int, ...] = (4, 2, 6), after: tuple[int, ...] = (3, 5, 2),
                seed: int = 0) -> dict[str, torch.Tensor]:
    """A left-padded batch with one image per row: `before[r]` text tokens, the image's tokens, `after[r]`
    text tokens. Rows get different images; for Qwen2-VL also different image sizes (4x4 and 4x8 patch
    grids). Returns the model's keyword arguments (input_ids, attention_mask, pixel_values, ...)."""
    g = torch.Generator().manual_seed(seed)
    rows, types, pixels, grids = [], [], [], []
    qwen = kind.startswith("qwen")
    anyres = kind in ("llava-next", "llava-onevision")
    if anyres:
        images = anyres_images(kind, [ANYRES_SIZES[r % len(ANYRES_SIZES)] for r in range(len(before))], seed)
        counts = anyres_token_counts(kind, images)
    sizes = []
    for r, (nb, na) in enumerate(zip(before, after)):
        if anyres:
            n_image = counts[r]
        elif kind in ("idefics3", "smolvlm"):  # rows 0 and 2: one image; row 1: two (the second one's slot
            n_images = 2 if r % 3 == 1 else 1   # in the other rows is an all-zero padding image)
            pixels.append(torch.stack([torch.randn(3, 16, 16, generator=g) if i < n_images else torch.zeros(3, 16, 16)
                                       for i in range(2)]))
            n_image = 4 * n_images
        elif kind == "gemma3":
            pixels.append(torch.randn(3, 16, 16, generator=g))
            n_image = 4
        elif kind == "paligemma":
            pixels.append(torch.randn(3, 16, 16, generator=g))
            n_image = 16
        elif kind == "mistral3":  # each image at its own size, zero-padded to the batch's (as the processor does)
            h, w = MISTRAL3_SIZES[r % len(MISTRAL3_SIZES)]
            image = torch.zeros(3, 32, 32)
            image[:, :h, :w] = torch.randn(3, h, w, generator=g)
            pixels.append(image)
            sizes.append((h, w))
            n_image = (h // 8) * (w // 8)
        elif qwen:
            grid = (1, 4, 4 if r % 2 == 0 else 8)  # (t, h, w) in patches; the 2x2 merge gives h*w/4 tokens
            patches = grid[0] * grid[1] * grid[2]
            pixels.append(torch.randn(patches, 3 * 2 * 4 * 4, generator=g))
            grids.append(grid)
            n_image = patches // 4
        else:
            pixels.append(torch.randn(3, 16, 16, generator=g))
            n_image = 16
        text = lambda n: torch.randint(7, VOCAB, (n,), generator=g)  # noqa: E731 (ids 0-6 are special)
        ids = torch.cat([text(nb), torch.full((n_image,), IMAGE_TOKEN), text(na)])
        rows.append(ids)
        types.append((ids == IMAGE_TOKEN).long())
    width = max(len(x) for x in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    token_types = torch.zeros_like(input_ids)
    for r, (ids, kinds) in enumerate(zip(rows, types)):
        input_ids[r, width - len(ids):] = ids
        mask[r, width - len(ids):] = 1
        token_types[r, width - len(ids):] = kinds
    out = dict(input_ids=input_ids, attention_mask=mask)
    if qwen:
        out.update(pixel_values=torch.cat(pixels), image_grid_thw=torch.tensor(grids), mm_token_type_ids=token_types)
    elif anyres:
        out.update(images)
    elif sizes:
        out.update(pixel_values=torch.stack(pixels), image_sizes=torch.tensor(sizes))
    elif kind == "gemma3":  # the processor's token types: 1 at image tokens
        out.update(pixel_values=torch.stack(pixels), token_type_ids=token_types)
    elif kind == "paligemma":  # the processor's token types: 0 over the whole prompt (the prefix)
        out.update(pixel_values=torch.stack(pixels), token_type_ids=torch.zeros_like(input_ids))
    elif kind in ("idefics3", "smolvlm"):
        stacked = torch.stack(pixels)  # [rows, 2 images, 3, 16, 16]
        out.update(pixel_values=stacked,
                   pixel_attention_mask=torch.ones(stacked.shape[:2] + (16, 16), dtype=torch.bool))
    else:
        out.update(pixel_values=torch.stack(pixels))
    return out


def row_of(inputs: dict[str, torch.Tensor], r: int) -> dict[str, torch.Tensor]:
    """Row `r` of a `vlm_prompts` batch alone, unpadded, with only its own image."""
    keep = inputs["attention_mask"][r].bool()
    out = dict(input_ids=inputs["input_ids"][r, keep][None], attention_mask=inputs["attention_mask"][r, keep][None])
    if "image_grid_thw" in inputs:
        grids = inputs["image_grid_thw"]
        sizes = grids.prod(-1).tolist()
        start = sum(sizes[:r])
        out.update(pixel_values=inputs["pixel_values"][start:start + sizes[r]], image_grid_thw=grids[r:r + 1],
                   mm_token_type_ids=inputs["mm_token_type_ids"][r, keep][None])
    else:  # one image per row: every per-image input (pixel_values, image_sizes, batch_num_images) by row
        out.update({k: v[r:r + 1] for k, v in inputs.items()
                    if k not in ("input_ids", "attention_mask", "token_type_ids")})
        if "token_type_ids" in inputs:  # one per token, like input_ids
            out["token_type_ids"] = inputs["token_type_ids"][r, keep][None]
    return out


def forbid_special_tokens(model) -> torch.nn.Module:
    """Zero the head's rows of ids 0-6 (pad, BOS, EOS, the image token...): their logits are then 0, below
    the top of the scaled random head, so greedy answers stay text (an image token in an answer would be
    taken for an image by the model's next forward)."""
    with torch.no_grad():
        model.get_output_embeddings().weight[:7] = 0
    return model


def tiny_answer_examples(model, kind: str, count: int = 24, new_tokens: int = 20, seed: int = 5) -> list:
    """The model's own greedy answers to `count` random prompts with images (ragged text before and after
    the image), as drafter training examples (`multispec.vision.processing.AnswerExample`)."""
    out = []
    for i in range(0, count, 3):
        batch = vlm_prompts(kind, before=(1 + i % 3, 3, 2), after=(2, 1 + i % 2, 3), seed=seed + i)
        for r in range(3):
            row = row_of(batch, r)
            with torch.no_grad():  # ids 0-6 are special (image, video, pad...): keep the answers text
                seq = model.generate(**row, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                                     pad_token_id=0, suppress_tokens=list(range(7)))
            out.append(AnswerExample(row, seq[0, row["input_ids"].shape[1]:]))
    return out[:count]


def tiny_head(model, mode: str, **vision):
    """A fresh `VisionEagleHead` for a `make_vlm` model."""
    text = model.config.get_text_config()
    config = EagleConfig(hidden_size=text.hidden_size, draft_vocab_size=VOCAB, target_vocab_size=VOCAB,
                         intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    return VisionEagleHead(config, VisionDraftConfig(mode=mode, image_token_id=IMAGE_TOKEN, **vision))
