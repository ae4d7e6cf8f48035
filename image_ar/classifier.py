"""A small MNIST classifier: the feature extractor of the image metrics (FID, precision/recall) and the
judge of class accuracy and class confidence, trained here because Inception weights cannot be fetched.

`DigitClassifier.features(images)` gives the 128-d penultimate activations (`num_features`, the
attribute `torchmetrics`' `FrechetInceptionDistance(feature=module)` reads); calling the module returns
the same features, so it plugs into `torchmetrics` directly; `logits(images)` the 10 class scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from multispec.plugin import train_steps

from .data import shifted


class DigitClassifier(nn.Module, PyTorchModelHubMixin):
    """Images [N, 1, 28, 28] in [0, 1] (uint8 in [0, 255] is accepted too, as torchmetrics passes)."""

    def __init__(self, num_classes: int = 10, width: int = 32, num_features: int = 128):
        super().__init__()
        self.num_features = num_features
        self.body = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 14
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 7
            nn.Flatten(), nn.Linear(2 * width * 49, num_features), nn.ReLU())
        self.head = nn.Linear(num_features, num_classes)

    @staticmethod
    def _prepare(images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[-2:] != (28, 28) or images.shape[1] not in (1, 3):
            raise ValueError(f"images: expected [N, 1, 28, 28] (or 3 channels), got {tuple(images.shape)}")
        x = images.float() / 255.0 if not images.is_floating_point() else images.float()
        return x.mean(dim=1, keepdim=True) if x.shape[1] == 3 else x

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(self._prepare(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images)

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


def train_classifier(images: torch.Tensor, labels: torch.Tensor, *, steps: int = 1200, batch_size: int = 128,
                     lr: float = 2e-3, seed: int = 0, progress: bool = True) -> DigitClassifier:
    """Train on `images` (with small random shifts) and `labels`; returns the model in eval mode."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = DigitClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)

    def step_loss(_: int) -> torch.Tensor:
        idx = torch.randint(0, len(images), (batch_size,), generator=g)
        return F.cross_entropy(model.logits(shifted(images[idx], 2, g)), labels[idx])

    train_steps(model, None, steps, (opt, sched), "classifier", loss=step_loss, clip=None, progress=progress)
    return model.eval()


@torch.no_grad()
def accuracy(model: DigitClassifier, images: torch.Tensor, labels: torch.Tensor) -> float:
    return float((model.logits(images).argmax(-1) == labels).float().mean())
