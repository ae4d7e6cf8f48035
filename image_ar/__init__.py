"""multispec.image_ar: speculative decoding for autoregressive image generators.

Importing this package registers its target adapters with the core (found through the
`multispec.adapters` entry point): `transformers`' `JanusForConditionalGeneration` generates image tokens
(`JanusImageTarget`), with classifier-free guidance through `guidance_scale=` as in Janus's own
`generate(..., generation_mode="image")`.
"""

from multispec.targets import register_target_adapter

from .gpt import ClassConditionalGPT, ImageGPTConfig
from .janus import JanusImageTarget
from .target import ImageGPTTarget
from .vqvae import VQVAE

register_target_adapter(lambda model: getattr(getattr(model, "config", None), "model_type", None) == "janus",
                        JanusImageTarget)
register_target_adapter(lambda model: isinstance(model, ClassConditionalGPT), ImageGPTTarget)

__all__ = ["VQVAE", "ClassConditionalGPT", "ImageGPTConfig", "ImageGPTTarget", "JanusImageTarget"]
