"""Pretraining of the zoo VLM's vision tower on what its images show.

A Llava's tower is normally a pretrained CLIP / SigLIP; the zoo's is trained here from scratch, and a tower
that learns only through the language model's loss learns to read little (the first zoo VLM answered
short questions about as well with another image of the same kind). So the tower first learns the scenes
directly: a small head of learned queries cross-attends over the tower's last hidden states (the layer
Llava reads, `vision_feature_layer=-1`) and classifies, per slot of `Scene`, the colour, the value and the
shape, plus the kind of image. The head is thrown away; the tower's weights initialise the Llava.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .vqa_synth import COLOURS, KINDS, MAX_SLOTS, SHAPES, Scene, generate_vqa

COLOUR_IDS = {c: i + 1 for i, c in enumerate(COLOURS)}  # 0: none
SHAPE_IDS = {s: i + 1 for i, s in enumerate(SHAPES)}
VALUES = 11  # 0: none, v + 1 for v in 0..9
ATTRIBUTES = {"colour": len(COLOURS) + 1, "value": VALUES, "shape": len(SHAPES) + 1}


def scene_labels(scenes: list[Scene]) -> dict[str, torch.Tensor]:
    """kind [B] and, per attribute, [B, MAX_SLOTS] class ids (0 = absent)."""
    labels = {name: torch.zeros(len(scenes), MAX_SLOTS, dtype=torch.long) for name in ATTRIBUTES}
    for b, scene in enumerate(scenes):
        for i, item in enumerate(scene.slots):
            if item is None:
                continue
            labels["colour"][b, i] = COLOUR_IDS.get(item.colour, 0)
            labels["value"][b, i] = 0 if item.value is None else item.value + 1
            labels["shape"][b, i] = SHAPE_IDS.get(item.shape, 0)
    labels["kind"] = torch.tensor([KINDS.index(s.kind) for s in scenes])
    return labels


class SceneHead(nn.Module):
    """MAX_SLOTS + 1 learned queries (one per slot, one for the kind), one cross-attention over the patch
    features, and a linear classifier per attribute."""

    def __init__(self, hidden: int, heads: int = 4):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(MAX_SLOTS + 1, hidden) * hidden ** -0.5)
        self.norm = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
        self.out = nn.ModuleDict({name: nn.Linear(hidden, n) for name, n in ATTRIBUTES.items()})
        self.kind = nn.Linear(hidden, len(KINDS))

    def forward(self, patches: torch.Tensor) -> dict[str, torch.Tensor]:
        kv = self.norm(patches)
        q = self.queries[None].expand(patches.shape[0], -1, -1)
        x = q + self.attn(q, kv, kv, need_weights=False)[0]
        x = x + self.mlp(x)
        logits = {name: layer(x[:, :MAX_SLOTS]) for name, layer in self.out.items()}
        logits["kind"] = self.kind(x[:, MAX_SLOTS])
        return logits


def tower_features(tower: nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """The hidden states Llava reads with `vision_feature_layer=-1` (before the post-layernorm)."""
    return tower(pixel_values=pixel_values, output_hidden_states=True).hidden_states[-1]


def scene_loss(head: SceneHead, patches: torch.Tensor, labels: dict[str, torch.Tensor]):
    """(summed cross-entropy, per-attribute accuracy over present slots and over kinds)."""
    logits = head(patches)
    present = labels["colour"] + labels["value"] + labels["shape"] > 0
    loss = F.cross_entropy(logits["kind"], labels["kind"])
    acc = {"kind": (logits["kind"].argmax(-1) == labels["kind"]).float().mean()}
    for name in ATTRIBUTES:
        loss = loss + F.cross_entropy(logits[name].flatten(0, 1), labels[name].flatten())
        right = logits[name].argmax(-1) == labels[name]
        acc[name] = right[present].float().mean()
    return loss, acc


def pretrain_tower(tower: nn.Module, pixels, steps: int = 3000, batch_size: int = 64, lr: float = 1e-3,
                   seed: int = 0, data_seed: int = 50_000) -> dict:
    """Train `tower` (a `SiglipVisionModel`, in place) on fresh procedural scenes, one batch per step (batch
    `step` is drawn with seed `data_seed + step`: no image is seen twice); `pixels(image)` is the
    processor's image transform. Returns a report with the held-out attribute accuracies."""
    torch.manual_seed(seed)
    hidden = tower.config.hidden_size
    head = SceneHead(hidden, tower.config.num_attention_heads)
    params = list(tower.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.05)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))

    def batch(seed_: int, n: int):
        samples = generate_vqa(n, seed=seed_)
        return torch.stack([pixels(s.image) for s in samples]), scene_labels([s.scene for s in samples])

    start = time.time()
    tower.train()
    head.train()
    bar = tqdm(range(steps), desc="vision tower", unit="step")
    losses = []
    for step in bar:
        x, labels = batch(data_seed + step, batch_size)
        loss, acc = scene_loss(head, tower_features(tower, x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}", value=f"{float(acc['value']):.2f}")
    tower.eval()
    head.eval()
    with torch.no_grad():  # held out: seeds below data_seed are never used for training batches
        x, labels = batch(data_seed - 1, 512)
        _, acc = scene_loss(head, tower_features(tower, x), labels)
    return {"steps": steps, "batch_size": batch_size, "lr": lr, "final_loss": sum(losses[-50:]) / len(losses[-50:]),
            "held_out_accuracy": {k: round(float(v), 4) for k, v in acc.items()}, "seconds": round(time.time() - start)}
