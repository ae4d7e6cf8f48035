"""Continuous speculative decoding for diffusion-head AR image models (one family of `multispec.image_ar`).

`PatchAR` (`patch_ar.py`) is a causal transformer over pixel patches with a per-token diffusion head
(`diffusion_head.py`); `HeadSampler` (`head_sampler.py`) samples a head along a fixed grid. The loop's parts:
the target (`targets.py`), the drafters (`drafters.py`: a small `PatchAR`, or a `PatchEagle` that samples with
the target's head; `eagle_train.py` trains one), the rule (`trajectory_ratio.py`, its kernel in
`trajectory_kernel.py`) and `generate_continuous` (`generate.py`). The zoo pair `mnist-patch-diffusion`
(`zoo_pair.py`, trained with `training.py`) and `multispec bench image-ar --method continuous` (`bench.py`).
"""

from .drafters import PatchEagle, PatchEagleConfig
from .eagle_train import PatchEagleRecipe, train_eagle
from .generate import ContinuousImageOutput, generate_continuous
from .head_sampler import HeadSampling
from .patch_ar import PatchAR, PatchARConfig
from .trajectory_ratio import TrajectoryRatio
from .zoo_pair import load_pair, zoo_entry

__all__ = ["ContinuousImageOutput", "HeadSampling", "PatchAR", "PatchARConfig", "PatchEagle", "PatchEagleConfig",
           "PatchEagleRecipe", "TrajectoryRatio", "generate_continuous", "load_pair", "train_eagle", "zoo_entry"]
