"""Image-generation metrics over any feature extractor: FID (through `torchmetrics`'
`FrechetInceptionDistance(feature=<module>)`), improved precision and recall (Kynkaenniemi et al. 2019,
k-nearest-neighbour balls in feature space), an Inception-Score-style class confidence and class accuracy
from a classifier.

Here the extractor is the zoo's `DigitClassifier` (128-d features): numbers are comparable between runs
of this suite, not with papers' Inception-based FIDs. `inception_fid` computes the standard Inception FID
when `torch-fidelity` and its weights are available locally (they cannot be downloaded here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass
class ImageScores:
    fid: float
    precision: float
    recall: float
    class_confidence: float  # exp(E_x KL(p(y|x) || p(y))) with the classifier's softmax (the IS formula)
    class_accuracy: float | None  # argmax class == the requested label (None without labels)
    mean_max_prob: float  # mean of the classifier's top probability
    num_images: int
    num_reference: int

    def as_dict(self) -> dict:
        return asdict(self)


def _check_images(images: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != 1:
        raise ValueError(f"{name}: expected a tensor [N, 1, H, W], got {getattr(images, 'shape', type(images).__name__)}")
    if images.shape[0] < 2:
        raise ValueError(f"{name}: FID needs at least 2 images, got {images.shape[0]}")
    images = images.float()
    if images.min() < 0 or images.max() > 1:
        raise ValueError(f"{name}: pixel values must lie in [0, 1]")
    return images


@torch.no_grad()
def _features(extractor, images: torch.Tensor, batch: int = 500) -> torch.Tensor:
    return torch.cat([extractor(images[i:i + batch]).double() for i in range(0, len(images), batch)])


def frechet_distance(extractor, images: torch.Tensor, reference: torch.Tensor) -> float:
    """FID between `images` and `reference` in `extractor`'s feature space (torchmetrics)."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    # no cross-process sync: in a data-parallel eval, rank 0 alone scores the images every process drew
    fid = FrechetInceptionDistance(feature=extractor, reset_real_features=True, sync_on_compute=False)
    with torch.no_grad():
        for i in range(0, len(reference), 500):
            fid.update(reference[i:i + 500], real=True)
        for i in range(0, len(images), 500):
            fid.update(images[i:i + 500], real=False)
    return float(fid.compute())


def precision_recall(fake: torch.Tensor, real: torch.Tensor, k: int = 3) -> tuple[float, float]:
    """Improved precision (fraction of fake features inside some real feature's k-NN ball) and recall
    (fraction of real features inside some fake feature's k-NN ball)."""
    if min(len(fake), len(real)) <= k:
        raise ValueError(f"k: needs more than {k} images on each side, got {len(fake)} and {len(real)}")

    def radii(x: torch.Tensor) -> torch.Tensor:
        d = torch.cdist(x, x)
        return d.kthvalue(k + 1, dim=1).values  # the 0th neighbour is the point itself

    def covered(points: torch.Tensor, centres: torch.Tensor, r: torch.Tensor) -> float:
        return float((torch.cdist(points, centres) <= r[None, :]).any(dim=1).double().mean())

    return covered(fake, real, radii(real)), covered(real, fake, radii(fake))


@torch.no_grad()
def image_scores(images: torch.Tensor, reference: torch.Tensor, classifier, labels: torch.Tensor | None = None,
                 k: int = 3) -> ImageScores:
    """All the scores of generated `images` [N, 1, 28, 28] in [0, 1] against `reference` real images, with
    `classifier` (a `DigitClassifier`, or any module with `features` / `logits`) as feature extractor."""
    images, reference = _check_images(images, "images"), _check_images(reference, "reference")
    if labels is not None:
        labels = torch.as_tensor(labels).long()
        if labels.shape != (len(images),):
            raise ValueError(f"labels: expected one label per image ({len(images)}), got shape {tuple(labels.shape)}")
    classifier = classifier.eval()
    fid = frechet_distance(classifier, images, reference)
    precision, recall = precision_recall(_features(classifier.features, images),
                                         _features(classifier.features, reference), k)
    probs = torch.cat([classifier.logits(images[i:i + 500]).double().softmax(-1) for i in range(0, len(images), 500)])
    marginal = probs.mean(0, keepdim=True)
    kl = (probs * (probs.clamp(min=1e-12).log() - marginal.clamp(min=1e-12).log())).sum(-1)
    accuracy = None if labels is None else float((probs.argmax(-1) == labels).double().mean())
    return ImageScores(fid, precision, recall, float(kl.mean().exp()), accuracy, float(probs.max(-1).values.mean()),
                       len(images), len(reference))


def inception_fid(images: torch.Tensor, reference: torch.Tensor) -> float:
    """The standard FID on Inception-v3 pool features (grey images repeated to RGB, as uint8). Needs
    `torch-fidelity` and its Inception weights already on this machine."""
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance

        fid = FrechetInceptionDistance(feature=2048, sync_on_compute=False)
    except Exception as error:  # missing torch-fidelity, or weights it cannot download
        raise RuntimeError("features: Inception FID needs `torch-fidelity` and its Inception weights on this "
                           f"machine (they cannot be downloaded here): {error}") from error
    to_rgb = lambda x: (x.float().clamp(0, 1) * 255).byte().repeat(1, 3, 1, 1)  # noqa: E731
    fid.update(to_rgb(reference), real=True)
    fid.update(to_rgb(images), real=False)
    return float(fid.compute())


NOISE_KEYS = ("fid", "precision", "recall", "class_accuracy", "class_confidence")
SEED_RUNS = 3  # plain AR is scored under this many seeds: the spread a quality difference must beat


def seed_spread(runs: list[dict], keys: tuple[str, ...] = NOISE_KEYS) -> dict[str, dict[str, float]]:
    """Per score, over runs of one method that differ only in their seeds: mean, min, max and spread (max - min)."""
    if len(runs) < 2:
        raise ValueError(f"runs: a spread needs at least 2 runs, got {len(runs)}")
    out = {}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = {"mean": sum(values) / len(values), "min": min(values), "max": max(values),
                        "spread": max(values) - min(values)}
    return out


def beyond_noise(scores: dict, reference: dict, spread: dict[str, dict[str, float]]) -> dict[str, bool]:
    """Per score: whether `scores` differ from `reference` (the same seeds' plain AR run) by more than twice
    the seed spread, the least a quality claim needs."""
    return {key: abs(scores[key] - reference[key]) > 2 * s["spread"]
            for key, s in spread.items() if scores.get(key) is not None and reference.get(key) is not None}
