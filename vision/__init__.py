"""multispec.vision: speculative decoding for vision-language models.

Importing this package registers its target adapters with the core (the core finds it through the
`multispec.adapters` entry point), so `multispec.speculative_generate` takes `transformers`'
the vision-language classes of `vision_adapter_for` (Llava, LLaVA-NeXT, LLaVA-OneVision, Mistral 3,
Idefics3, SmolVLM, Gemma 3, PaliGemma, Qwen2-VL, Qwen2.5-VL, Qwen3-VL) directly, with their image inputs as keyword arguments:

    speculative_generate(vlm, draft, input_ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=64)

Drafters: `VisionEagleDrafter` over a `VisionEagleHead` in one of three modes (plain EAGLE, ViSpec, SpecVLM),
trained with `VisionDistiller` (online logit distillation). The zoo pair `vqa-llava` ships all three;
`vqa-words-llava` (word tokens, 256 image tokens) ships beside it (`multispec zoo train vqa-words-llava` retrains it).
"""

from multispec.plugin import register_entry, register_fixed_shape, register_target_adapter

from .compress import ElasticCompressor, QueryAdaptor
from .distill import DistillConfig, VisionDistiller
from .drafters import VisionDraftConfig, VisionEagleDrafter, VisionEagleHead, build_draft_sequence
from .targets import (FIXED_SHAPE_CLASSES, Gemma3VLTarget, Idefics3Target, LlavaTarget, PaliGemmaTarget,
                      Qwen2VLTarget, Qwen3VLTarget, VisionLanguageTarget, vision_adapter_for)
from .zoo_pair import zoo_entry
from .zoo_words import zoo_entry as words_zoo_entry

register_target_adapter(lambda model: vision_adapter_for(model) is not None,
                        lambda model: vision_adapter_for(model)(model))
for _eager, _static in FIXED_SHAPE_CLASSES.items():  # `step="static"`: each adapter's own fixed-shape class
    register_fixed_shape(_eager, _static)
register_entry(zoo_entry())
register_entry(words_zoo_entry())

__all__ = ["DistillConfig", "ElasticCompressor", "Gemma3VLTarget", "Idefics3Target", "LlavaTarget", "PaliGemmaTarget",
           "QueryAdaptor", "Qwen2VLTarget", "Qwen3VLTarget",
           "VisionDistiller", "VisionDraftConfig", "VisionEagleDrafter", "VisionEagleHead", "VisionLanguageTarget",
           "build_draft_sequence", "vision_adapter_for"]
