"""multispec.image_ar: speculative decoding for autoregressive image generators.

Importing this package registers its target adapters with the core (found through the
`multispec.adapters` entry point): `transformers`' `JanusForConditionalGeneration` generates image tokens
(`JanusImageTarget`), with classifier-free guidance through `guidance_scale=` as in Janus's own
`generate(..., generation_mode="image")`; the zoo's own class-conditional `ClassConditionalGPT`
(`ImageGPTTarget`). `Relaxed` is LANTERN's relaxed acceptance rule; `generate_images` / `generate_ar`
generate class-conditional images speculatively / plainly; `multispec.image_ar.metrics` scores them.

Continuous tokens: `PatchAR` is a causal transformer over pixel patches with a per-token diffusion head;
`generate_continuous` samples it plainly or with continuous speculative decoding (`TrajectoryRatio`:
acceptance by the density ratio of whole denoising trajectories; exact, or relaxed by an explicit knob),
drafting with a small `PatchAR` or with a `PatchEagle` (EAGLE-style: it predicts the target's conditions
and samples with the target's head; `train_eagle` trains one for a user's own `PatchAR`).
"""

from multispec.plugin import register_entry, register_fixed_shape, register_target_adapter


from .continuous import (ContinuousImageOutput, HeadSampling, PatchAR, PatchARConfig, PatchEagle, PatchEagleConfig,
                         PatchEagleRecipe, TrajectoryRatio, generate_continuous, train_eagle)
from .continuous import load_pair as _load_continuous_pair
from .continuous import zoo_entry as continuous_zoo_entry
from .generate import ImageGenerationOutput, generate_ar, generate_images
from .gpt import ClassConditionalGPT, ImageGPTConfig
from .neighbourhood import latent_neighbours
from .relaxed import Relaxed, RelaxedVerdict
from .targets import FIXED_SHAPE_CLASSES, ImageGPTTarget, JanusImageTarget
from .vqvae import VQVAE
from .zoo_pair import CFG_SCALE, zoo_entry
from .zoo_pair import image_drafter as _image_drafter
from .zoo_pair import load_pair as _load_image_pair

register_target_adapter(lambda model: getattr(getattr(model, "config", None), "model_type", None) == "janus",
                        JanusImageTarget)
register_target_adapter(lambda model: isinstance(model, ClassConditionalGPT), ImageGPTTarget)
for _eager, _static in FIXED_SHAPE_CLASSES.items():  # `step="static"`: each adapter's own fixed-shape class
    register_fixed_shape(_eager, _static)
register_entry(zoo_entry())
register_entry(continuous_zoo_entry())


def load_image_pair(folder=None):
    """The zoo's class-conditional pair (`mnist-vq-gpt`): tokenizer, target, drafters, classifier."""
    return _load_image_pair(folder)


def load_continuous_pair(folder=None):
    """The zoo's continuous-token pair (`mnist-patch-diffusion`): target and draft `PatchAR`, classifier."""
    return _load_continuous_pair(folder)


def image_drafter(pair, kind: str = "eagle", guidance_scale: float | None = CFG_SCALE):
    """A drafter of `pair`: "eagle" (its EAGLE head, distilled at the zoo's guidance scale) or "draft" (its
    small AR model, guided like the target at `guidance_scale`; None: unguided)."""
    return _image_drafter(pair, kind, guidance_scale)


__all__ = ["VQVAE", "ClassConditionalGPT", "ContinuousImageOutput", "HeadSampling", "ImageGPTConfig", "ImageGPTTarget",
           "ImageGenerationOutput", "JanusImageTarget", "PatchAR", "PatchARConfig", "PatchEagle", "PatchEagleConfig",
           "PatchEagleRecipe", "Relaxed", "RelaxedVerdict", "TrajectoryRatio", "generate_ar", "generate_continuous",
           "generate_images", "image_drafter", "latent_neighbours", "load_continuous_pair", "load_image_pair",
           "train_eagle"]
