"""Tiny randomly initialised image generators for tests and examples: `JanusForConditionalGeneration` (the
real class) and the zoo's `ClassConditionalGPT`."""

from __future__ import annotations

import torch

from .gpt import ClassConditionalGPT, gpt_config

TEXT_VOCAB = 128
IMAGE_VOCAB = 64  # VQ codebook entries
NUM_IMAGE_TOKENS = 16
BOS, BOI, PAD = 1, 5, 0


def make_janus(seed: int = 0, head_scale: float = 4.0) -> torch.nn.Module:
    """Janus with a 2-layer Llama language model (hidden 64), a 64-entry VQ codebook and 16 image tokens per
    image; `generation_config` set up for `generate(..., generation_mode="image")`."""
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig

    torch.manual_seed(seed)
    text = LlamaConfig(vocab_size=TEXT_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       bos_token_id=BOS, eos_token_id=2, pad_token_id=PAD)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4,
                  projection_dim=64, num_image_tokens=NUM_IMAGE_TOKENS, depth=1, mlp_ratio=2.0)
    vq = dict(embed_dim=8, num_embeddings=IMAGE_VOCAB, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
              num_res_blocks=1, num_patches=4, projection_dim=64, image_token_embed_dim=64, num_hidden_layers=1)
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=3,
                         tie_word_embeddings=False)
    model = JanusForConditionalGeneration(config)
    with torch.no_grad():
        model.model.generation_head.vision_head.weight.mul_(head_scale)
    generation = model.generation_config
    generation.bos_token_id, generation.pad_token_id, generation.eos_token_id = BOS, PAD, 2
    generation.generation_kwargs = {"boi_token_id": BOI}
    return model.eval()


def janus_prompts(lengths: tuple[int, ...] = (6, 4), seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded text prompts `BOS, text..., BOI` (pad 0): what Janus's processor builds for image mode."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        row = torch.cat([torch.tensor([BOS]), torch.randint(7, TEXT_VOCAB, (n - 2,), generator=g), torch.tensor([BOI])])
        ids[r, width - n:] = row
        mask[r, width - n:] = 1
    return ids, mask


def make_image_gpt(seed: int = 0, layers: int = 2, hidden: int = 64, codebook_size: int = 64, num_classes: int = 4,
                   grid_size: int = 3, head_scale: float = 3.0) -> torch.nn.Module:
    """A tiny randomly initialised `ClassConditionalGPT` (9 codes per image by default); `head_scale`
    sharpens its output so greedy paths are not near-ties."""
    torch.manual_seed(seed)
    config = gpt_config(layers, hidden, heads=4, kv_heads=2, intermediate=2 * hidden, codebook_size=codebook_size,
                        num_classes=num_classes, grid_size=grid_size)
    model = ClassConditionalGPT(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model.eval()
