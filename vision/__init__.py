"""multispec.vision: speculative decoding for vision-language models.

Importing this package registers its target adapters with the core (the core finds it through the
`multispec.adapters` entry point), so `multispec.speculative_generate` takes `transformers`'
`LlavaForConditionalGeneration`, `Qwen2VLForConditionalGeneration` and `Qwen2_5_VLForConditionalGeneration`
directly, with their image inputs as keyword arguments:

    speculative_generate(vlm, draft, input_ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=64)
"""

from multispec.targets import register_target_adapter

from .targets import LlavaTarget, Qwen2VLTarget, VisionLanguageTarget, vision_adapter_for

register_target_adapter(lambda model: vision_adapter_for(model) is not None,
                        lambda model: vision_adapter_for(model)(model))

__all__ = ["LlavaTarget", "Qwen2VLTarget", "VisionLanguageTarget", "vision_adapter_for"]
