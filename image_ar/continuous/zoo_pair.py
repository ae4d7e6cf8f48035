"""The zoo's continuous-token pair, `mnist-patch-diffusion`, trained here on real MNIST.

Tokens are raw 4 x 4 pixel patches (49 tokens of dimension 16, pixels in [-1, 1]); each model is a causal
transformer over them with a per-token diffusion head (`PatchAR`):
- `target/`: 14 layers (hidden 128) and a 3-block head of width 192;
- `draft/`: 1 layer (hidden 96) and a 1-block head of width 64, trained on the same data and, mostly, to
  match the target's noise predictions (its guided and unguided halves): the trajectory density ratio
  that decides acceptance is a weighted sum of exactly those differences.
The image metrics use the classifier of the `mnist-vq-gpt` pair (the same digits, the same features).

`multispec zoo train mnist-patch-diffusion` reproduces them (fixed seeds; resumable by stage).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from multispec import zoo
from multispec.plugin import ZooEntry, ZooPair, train_steps

from ..classifier import DigitClassifier
from ..data import load_digits_dataset
from ..hub_load import from_folder
from ..zoo_pair import NAME as VQ_NAME
from .diffusion_head import TRAIN_STEPS, schedule_scheduler
from .patch_ar import PatchAR, PatchARConfig, patchify
from .training import batches, grid_weights, optimizer

NAME = "mnist-patch-diffusion"
CFG_SCALE = 2.0  # the guidance the benchmark samples with
STEPS, STOP = 8, 50  # the heads' sampling grid: 8 points from t = 999 down to the stop level 50
TARGET = PatchARConfig(layers=14, hidden=128, heads=4, head_width=192, head_blocks=3, steps=STEPS, stop=STOP)
DRAFT = PatchARConfig(layers=1, hidden=96, heads=4, head_width=64, head_blocks=1, steps=STEPS, stop=STOP)
SEED = 0


@dataclass
class ContinuousPair:
    target: PatchAR
    draft: PatchAR
    classifier: "object"  # DigitClassifier (shared with mnist-vq-gpt)
    folder: Path


def distillation_loss(draft: PatchAR, target: PatchAR, images: torch.Tensor, labels: torch.Tensor,
                      scale: float = CFG_SCALE, generator: torch.Generator | None = None) -> torch.Tensor:
    """How far the draft's noise predictions are from the target's on the same noisy tokens and prefixes:
    MSE on each guidance half at t uniform in [stop, T), plus MSE on the guided prediction ε_u + s (ε_c -
    ε_u) at the sampling grid's transition steps drawn in proportion to their weight in the acceptance
    log ratio (`grid_weights`): the second term is the expected trajectory log ratio itself, up to the
    state distribution (forward-noised data here, draft trajectories at sampling time)."""
    c = draft.config
    x0 = patchify(images, c.patch)
    ac = schedule_scheduler().alphas_cumprod.to(x0.device)
    noisy = ac[c.stop].sqrt() * x0 + (1 - ac[c.stop]).sqrt() * torch.randn(x0.shape, generator=generator)
    both = torch.cat([labels, torch.full_like(labels, draft.null_class)])
    prefix = noisy[:, :-1].repeat(2, 1, 1)
    tokens = x0.reshape(-1, c.token_dim)
    steps, weights = grid_weights(c)
    uniform = torch.randint(c.stop, TRAIN_STEPS, (len(tokens),), generator=generator)
    on_grid = steps[torch.multinomial(weights, len(tokens), replacement=True, generator=generator)]
    t = torch.cat([uniform, on_grid])
    a = ac[t][:, None]
    xt = a.sqrt() * tokens.repeat(2, 1) + (1 - a).sqrt() * torch.randn(2 * len(tokens), c.token_dim, generator=generator)
    # rows: [uniform t | grid t] x [cond | uncond] x tokens
    xt4, t4 = xt.view(2, 1, -1, c.token_dim).expand(2, 2, -1, -1), t.view(2, 1, -1).expand(2, 2, -1)
    with torch.no_grad():
        zt = target.transform(target.inputs(both, prefix, 0)).reshape(2, -1, target.config.hidden)
        teacher = target.head(xt4.reshape(-1, c.token_dim), t4.reshape(-1), zt.repeat(2, 1, 1).reshape(-1, zt.shape[-1]))
    zd = draft.transform(draft.inputs(both, prefix, 0)).reshape(2, -1, c.hidden)
    student = draft.head(xt4.reshape(-1, c.token_dim), t4.reshape(-1), zd.repeat(2, 1, 1).reshape(-1, zd.shape[-1]))
    teacher, student = teacher.view(2, 2, -1, c.token_dim), student.view(2, 2, -1, c.token_dim)
    halves = torch.nn.functional.mse_loss(student[0], teacher[0])
    guided = lambda e: e[1, 1] + scale * (e[1, 0] - e[1, 1])  # noqa: E731
    return halves + torch.nn.functional.mse_loss(guided(student), guided(teacher))


def deepen(base: PatchAR, config: PatchARConfig, seed: int = 0) -> PatchAR:
    """A `config` model (more layers, any head) carrying `base`'s transformer: base layer i goes to layer
    round(i (L - 1) / (l - 1)); every other layer's output projections start at zero, so the deepened
    transformer computes exactly `base`'s conditions z. The head is new (initialised by `config`). Used by
    `benchmarks/studies/continuous_eagle.py` to build a target with MAR's proportions from the shipped one."""
    b = base.config
    if config.hidden != b.hidden or config.heads != b.heads or config.layers < b.layers:
        raise ValueError(f"config: deepening keeps hidden ({b.hidden}) and heads ({b.heads}) and adds layers "
                         f"(base {b.layers}), got {config}")
    torch.manual_seed(seed)
    model = PatchAR(config)
    spread = {round(i * (config.layers - 1) / max(1, b.layers - 1)): i for i in range(b.layers)}
    with torch.no_grad():
        for name in ("embed", "classes", "norm_out"):
            getattr(model, name).load_state_dict(getattr(base, name).state_dict())
        model.pos.copy_(base.pos)
        for j in range(config.layers):
            for part in ("norm1", "qkv", "proj", "norm2", "fc1", "fc2"):
                if j in spread:
                    getattr(model, part)[j].load_state_dict(getattr(base, part)[spread[j]].state_dict())
                elif part in ("proj", "fc2"):
                    getattr(model, part)[j].weight.zero_()
    return model


@dataclass(frozen=True)
class ModelRecipe:
    """A `PatchAR`'s training run: `steps` of `batch_size` images, AdamW at `lr` (warm-up, cosine), `seed`."""

    steps: int
    batch_size: int
    lr: float
    seed: int


def train_model(config: PatchARConfig, images, labels, recipe: ModelRecipe, *, desc: str,
                teacher: PatchAR | None = None, distill_weight: float = 0.0, progress: bool = True,
                init: PatchAR | None = None):
    """Train a `PatchAR` on MNIST by `recipe` (diffusion loss, plus `distill_weight` x the distillation loss to
    `teacher`), from `init` when given (else freshly initialised)."""
    steps, batch_size, lr, seed = recipe.steps, recipe.batch_size, recipe.lr, recipe.seed
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = PatchAR(config) if init is None else init
    opt, sched = optimizer(model, lr, steps)
    data = batches(images, labels, batch_size, g)

    def step_loss(_: int) -> torch.Tensor:
        x, y = next(data)
        loss = model.loss(x, y, generator=g)
        if teacher is not None and distill_weight:
            loss = loss + distill_weight * distillation_loss(model, teacher, x, y, generator=g)
        return loss

    model.train()
    losses = train_steps(model, None, steps, (opt, sched), desc, loss=step_loss, progress=progress)
    return model.eval(), losses


@torch.no_grad()
def heldout_loss(model: PatchAR, images, labels, batch: int = 500) -> float:
    g = torch.Generator().manual_seed(1)
    total = 0.0
    for i in range(0, len(images), batch):
        x = images[i:i + batch, 0] * 2 - 1
        total += float(model.loss(x, labels[i:i + batch], class_dropout=0.0, generator=g)) * len(x)
    return total / len(images)


def save_half(model: PatchAR, folder: Path) -> None:
    """Weights stored in float16 (the zoo's size budget); `load_model` returns float32."""
    folder.mkdir(parents=True, exist_ok=True)
    half = PatchAR(model.config)
    half.load_state_dict(model.state_dict())
    half.half().save_pretrained(folder)


def load_model(folder: Path) -> PatchAR:
    return from_folder(PatchAR, folder).float().eval()


def train_pair(folder: Path, *, quick: bool = False) -> dict:
    """Train the target, then the draft, into `folder`; stages recorded in `report.json` are kept."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    report_path = folder / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    images, labels = load_digits_dataset("mnist", "train")
    test_images, test_labels = load_digits_dataset("mnist", "test")
    if quick:
        images, labels, test_images, test_labels = images[::20], labels[::20], test_images[::20], test_labels[::20]
    small = lambda c: PatchARConfig(**{**asdict(c), "layers": min(c.layers, 2)})  # noqa: E731
    target_cfg, draft_cfg = (small(TARGET), small(DRAFT)) if quick else (TARGET, DRAFT)
    steps_t, steps_d = (20, 20) if quick else (2500, 2500)
    if "target" not in report:
        target, losses = train_model(target_cfg, images, labels, ModelRecipe(steps_t, 32, 1e-3, SEED), desc="target")
        save_half(target, folder / "target")
        report["target"] = {"config": asdict(target_cfg), "steps": steps_t, "final_loss": losses[-1],
                            "heldout_loss": heldout_loss(target, test_images, test_labels)}
        report_path.write_text(json.dumps(report, indent=2))
    target = load_model(folder / "target")
    if "draft" not in report:
        draft, losses = train_model(draft_cfg, images, labels, ModelRecipe(steps_d, 32, 2e-3, SEED + 1), desc="draft",
                                    teacher=target, distill_weight=4.0)
        save_half(draft, folder / "draft")
        report["draft"] = {"config": asdict(draft_cfg), "steps": steps_d, "distill_weight": 4.0,
                           "final_loss": losses[-1], "heldout_loss": heldout_loss(draft, test_images, test_labels)}
        report_path.write_text(json.dumps(report, indent=2))
    return report


def load_pair(folder: Path | None = None) -> ContinuousPair:
    """The trained pair from `folder` (default: the shipped zoo weights) with the digit classifier."""
    folder = Path(folder) if folder is not None else zoo.path(NAME)
    if not (folder / "target" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train {NAME}`")
    classifier = from_folder(DigitClassifier, zoo.path(VQ_NAME) / "classifier").eval()
    return ContinuousPair(load_model(folder / "target"), load_model(folder / "draft"), classifier, folder)


def _zoo_load(folder: Path):
    pair = load_pair(folder)
    # no tokenizer: tokens are pixel patches (patchify / unpatchify); the drafter is the small PatchAR
    return ZooPair(pair.target, pair.draft, None, NAME)


def zoo_entry():
    return ZooEntry(NAME, "class-conditional MNIST, continuous tokens: 4x4 pixel patches, a 14-layer causal transformer "
                    "with a diffusion head (DDPM cosine, 8-point grid) and a 1-layer draft distilled on its noise "
                    "predictions (multispec.image_ar; continuous speculative decoding)", None,
                    _zoo_load, lambda folder: train_pair(folder))
