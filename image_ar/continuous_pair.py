"""The zoo's continuous-token pair, `mnist-patch-diffusion`, trained here on real MNIST.

Tokens are raw 4 x 4 pixel patches (49 tokens of dimension 16, pixels in [-1, 1]).
- `target/` (`PatchAR`, stored int8): a 24-layer causal transformer (hidden 128) with a lean 2-layer diffusion
  head of width 256 (`DenoiserLeanMLP`). MAR's proportions: the transformer costs several times the head's
  whole 7-transition sample, so a draft that shares the head is cheap next to a target token. Trained in two
  stages: a 14-layer model with MAR's adaLN head (2,500 steps), then deepened to 24 layers (`deepen`: the
  new layers start as the identity) with the lean head and trained 2,000 steps more.
- `draft/` (`PatchEagle`): one causal layer that predicts the target's conditions from its features and
  the emitted tokens, and samples with the target's head (`continuous_eagle`). Trained on the target's
  features of 6,144 training digits, on the MSE to the conditions plus the expected acceptance log ratio.
The image metrics use the classifier of the `mnist-vq-gpt` pair (the same digits, the same features).

`multispec zoo train mnist-patch-diffusion` reproduces them (fixed seeds; resumable by stage).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .patch_ar import PatchAR, PatchARConfig, patchify

NAME = "mnist-patch-diffusion"
CFG_SCALE = 2.0  # the guidance the benchmark samples with
STEPS, STOP = 8, 50  # the heads' sampling grid: 8 points from t = 999 down to the stop level 50
# the target is trained in two stages: a 14-layer model with MAR's adaLN head (the first pair's target), then
# deepened to 24 layers (its layers spread out, the new ones starting as the identity) with a lean head
TARGET_BASE = PatchARConfig(layers=14, hidden=128, heads=4, head_width=192, head_blocks=3, steps=STEPS, stop=STOP)
TARGET = PatchARConfig(layers=24, hidden=128, heads=4, head_kind="lean", head_width=256, head_blocks=2, steps=STEPS,
                       stop=STOP)
SEED = 0


@dataclass
class ContinuousPair:
    target: PatchAR
    draft: "object"  # PatchEagle: the EAGLE-style draft (samples with the target's head)
    classifier: "object"  # DigitClassifier (shared with mnist-vq-gpt)
    folder: Path


def _batches(images: torch.Tensor, labels: torch.Tensor, batch_size: int, g: torch.Generator):
    from .data import shifted

    while True:
        idx = torch.randint(0, len(images), (batch_size,), generator=g)
        x = shifted(images[idx], 2, g)[:, 0] * 2 - 1
        yield x, labels[idx]


def _optimizer(model, lr: float, steps: int):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.02}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 30)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    return opt, sched


def grid_weights(config: PatchARConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(timesteps [S - 1], w [S - 1]): the grid's transition steps and the weight w_i with which a noise-
    prediction difference δε enters the trajectory log ratio, log p/q ~ -1/2 Σ_i w_i |δε_i|² (w_i =
    (c0_i sqrt(1 - ᾱ_i) / sqrt(ᾱ_i))² / σ_i², c0 the posterior mean's x̂0 coefficient)."""
    from .diffusion_head import Trajectory

    traj = Trajectory.make(config.steps, config.stop)
    a = traj.alphas_cumprod[:-1]
    return traj.timesteps[:-1], (traj.mean_x0 * (1 - a).sqrt() / a.sqrt()) ** 2 / traj.std ** 2


def deepen(base: PatchAR, config: PatchARConfig, seed: int = 0) -> PatchAR:
    """A `config` model (more layers, any head) carrying `base`'s transformer: base layer i goes to layer
    round(i (L - 1) / (l - 1)); every other layer's output projections start at zero, so the deepened
    transformer computes exactly `base`'s conditions z. The head is new (initialised by `config`)."""
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


def train_model(config: PatchARConfig, images, labels, *, steps: int, batch_size: int, lr: float, seed: int,
                desc: str, progress: bool = True, init: PatchAR | None = None):
    """Train a `PatchAR` on MNIST with its diffusion loss, from `init` when given (else freshly initialised)."""
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = PatchAR(config) if init is None else init
    opt, sched = _optimizer(model, lr, steps)
    data = _batches(images, labels, batch_size, g)
    losses = []
    bar = tqdm(range(steps), desc=desc, unit="step", disable=not progress)
    model.train()
    for _ in bar:
        x, y = next(data)
        loss = model.loss(x, y, generator=g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.4f}")
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


def save_int8(model: PatchAR, folder: Path) -> None:
    """Config and int8 weights (`multispec.zoo.int8`'s layout): the target's transformer would not fit the
    zoo's budget in float16. `load_model` returns float32; every figure is measured on that model."""
    from safetensors.torch import save_file

    from multispec.zoo.int8 import FILE, quantize_state

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(asdict(model.config), indent=2))
    save_file(quantize_state(model.state_dict()), str(folder / FILE))


def load_model(folder: Path) -> PatchAR:
    from multispec.zoo.int8 import FILE

    if (folder / FILE).exists():
        from safetensors.torch import load_file

        from multispec.zoo.int8 import dequantize_state

        model = PatchAR(json.loads((folder / "config.json").read_text()))
        model.load_state_dict(dequantize_state(load_file(str(folder / FILE))))
        return model.float().eval()
    return PatchAR.from_pretrained(folder).float().eval()


def load_eagle(folder: Path):
    from .continuous_eagle import PatchEagle

    return PatchEagle.from_pretrained(folder).float().eval()


def train_pair(folder: Path, *, quick: bool = False) -> dict:
    """Train the target (two stages) and the EAGLE-style draft into `folder`; stages recorded in
    `report.json` are kept. The first stage's model (`target_base/`) is removed once the target is saved."""
    import shutil
    import time

    from .continuous_eagle import teacher_forced_acceptance, train_eagle
    from .data import load_digits_dataset

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    report_path = folder / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    images, labels = load_digits_dataset("mnist", "train")
    test_images, test_labels = load_digits_dataset("mnist", "test")
    if quick:
        images, labels, test_images, test_labels = images[::20], labels[::20], test_images[::20], test_labels[::20]
    small = lambda c, n: PatchARConfig(**{**asdict(c), "layers": min(c.layers, n)})  # noqa: E731
    base_cfg, target_cfg = (small(TARGET_BASE, 2), small(TARGET, 3)) if quick else (TARGET_BASE, TARGET)
    steps_b, steps_t, steps_d = (20, 20, 20) if quick else (2500, 2000, 6000)

    def record(stage: str, entry: dict, t0: float) -> None:
        report[stage] = entry | {"seconds": round(time.perf_counter() - t0)}
        report_path.write_text(json.dumps(report, indent=2))

    if "target" not in report and "target_base" not in report:
        t0 = time.perf_counter()
        base, losses = train_model(base_cfg, images, labels, steps=steps_b, batch_size=32, lr=1e-3, seed=SEED,
                                   desc="target (base stage)")
        save_half(base, folder / "target_base")
        record("target_base", {"config": asdict(base_cfg), "steps": steps_b, "final_loss": losses[-1],
                               "heldout_loss": heldout_loss(base, test_images, test_labels)}, t0)
    if "target" not in report:
        t0 = time.perf_counter()
        start = deepen(load_model(folder / "target_base"), target_cfg)
        target, losses = train_model(target_cfg, images, labels, steps=steps_t, batch_size=32, lr=5e-4, seed=SEED + 2,
                                     desc="target (deepened)", init=start)
        save_int8(target, folder / "target")
        shutil.rmtree(folder / "target_base")
        record("target", {"config": asdict(target_cfg), "steps": steps_t, "lr": 5e-4, "from": "target_base, deepened",
                          "final_loss": sum(losses[-50:]) / len(losses[-50:]),
                          "heldout_loss": heldout_loss(load_model(folder / "target"), test_images, test_labels)}, t0)
    target = load_model(folder / "target")
    if "draft" not in report:
        t0 = time.perf_counter()
        eagle, losses = train_eagle(target, images, labels, steps=steps_d, batch_size=32, pool=512 if quick else 6144,
                                    lr=1e-3, guidance_scale=CFG_SCALE, seed=SEED + 3)
        eagle.half().save_pretrained(folder / "draft")
        eagle = load_eagle(folder / "draft")
        held = test_images[:100], test_labels[:100]
        record("draft", {"kind": "eagle", "config": asdict(eagle.config), "steps": steps_d, "pool": 512 if quick else 6144,
                         "final_loss": sum(losses[-50:]) / len(losses[-50:]),
                         "teacher_forced_acceptance": teacher_forced_acceptance(target, eagle, *held, CFG_SCALE),
                         "teacher_forced_acceptance_rollout": teacher_forced_acceptance(target, eagle, *held, CFG_SCALE,
                                                                                        rollout=True)}, t0)
    return report


def load_pair(folder: Path | None = None) -> ContinuousPair:
    """The trained pair from `folder` (default: the shipped zoo weights) with the digit classifier."""
    from multispec import zoo

    from .classifier import DigitClassifier
    from .zoo_pair import NAME as VQ_NAME

    folder = Path(folder) if folder is not None else zoo.path(NAME)
    if not (folder / "target" / "config.json").exists() or not (folder / "draft" / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train {NAME}`")
    classifier = DigitClassifier.from_pretrained(zoo.path(VQ_NAME) / "classifier").eval()
    return ContinuousPair(load_model(folder / "target"), load_eagle(folder / "draft"), classifier, folder)


def _zoo_load(folder: Path):
    from multispec.zoo import ZooPair

    pair = load_pair(folder)
    # no tokenizer: tokens are pixel patches (patchify / unpatchify); the drafter is the EAGLE-style PatchEagle
    return ZooPair(pair.target, pair.draft, None, NAME)


def zoo_entry():
    from multispec.zoo import ZooEntry

    return ZooEntry(NAME, "class-conditional MNIST, continuous tokens: 4x4 pixel patches, a 24-layer causal transformer "
                    "with a lean diffusion head (DDPM cosine, 8-point grid) and a 1-layer EAGLE-style draft that "
                    "predicts its conditions and samples with its head (multispec.image_ar; continuous speculative "
                    "decoding)", None,
                    _zoo_load, lambda folder: train_pair(folder))
