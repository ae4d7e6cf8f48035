"""Int8 storage for shipped checkpoints: half the bytes of fp16, for pairs that would not fit the zoo's budget.

Each weight matrix is stored as int8 with one fp16 scale per output row (symmetric, absmax / 127), so a
value is off by at most half its row's scale; vectors (norms, biases) stay fp16. Loading dequantizes to
fp32: the shipped model *is* the dequantized one, and every figure measured on the pair is measured on it.
The `transformers` config is saved beside it, so the class and its config are the user's usual ones.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FILE = "model.int8.safetensors"


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and fp16 per-row scales of a 2-D `weight` (rows: output features)."""
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a matrix, got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-8).half()
    q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def save_int8(model, folder: str | Path) -> None:
    """`model`'s config (`save_pretrained` layout) and its weights in int8 / fp16 under `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tensors = {}
    for name, value in model.state_dict().items():
        if value.dim() == 2 and value.is_floating_point():
            tensors[name + ".q"], tensors[name + ".scale"] = quantize(value)
        else:
            tensors[name] = value.detach().half() if value.is_floating_point() else value.detach()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / FILE))


def load_int8(cls, folder: str | Path):
    """A `cls` (e.g. `LlamaForCausalLM`) model from `save_int8`'s folder, in fp32, in eval mode."""
    from transformers import AutoConfig

    folder = Path(folder)
    if not (folder / FILE).exists():
        raise FileNotFoundError(f"{folder}: no {FILE} (write it with multispec.zoo.int8.save_int8)")
    stored = load_file(str(folder / FILE))
    state = {}
    for name, value in stored.items():
        if name.endswith(".scale"):
            continue
        if name.endswith(".q"):
            base = name[: -len(".q")]
            state[base] = dequantize(value, stored[base + ".scale"])
        else:
            state[name] = value.float() if value.is_floating_point() else value
    model = cls(AutoConfig.from_pretrained(folder))
    model.load_state_dict(state, strict=True)
    return model.float().eval()
