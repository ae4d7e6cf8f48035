"""Int8 weight storage: each matrix as int8 with one fp16 scale per output row (symmetric, absmax / 127),
so a value is off by at most half its row's scale; vectors (norms, biases) and integer tensors stay as they
are (floats in fp16). Loading dequantizes: the stored model *is* the dequantized one.

Used to ship checkpoints in half the bytes of fp16 (`multispec.zoo.int8` for `transformers` models,
`EagleHead.save(..., int8=True)` for heads)."""

from __future__ import annotations

import torch


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


def quantize_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict to store: float matrices as `name.q` (int8) + `name.scale` (fp16), other floats fp16."""
    tensors = {}
    for name, value in state.items():
        if value.dim() == 2 and value.is_floating_point():
            tensors[name + ".q"], tensors[name + ".scale"] = quantize(value)
        else:
            tensors[name] = value.detach().half() if value.is_floating_point() else value.detach()
    return {k: v.contiguous() for k, v in tensors.items()}


def is_quantized(tensors: dict[str, torch.Tensor]) -> bool:
    return any(name.endswith(".q") for name in tensors)


def dequantize_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`quantize_state`'s output back to a state dict (floats in fp32)."""
    state = {}
    for name, value in tensors.items():
        if name.endswith(".scale") and name[: -len(".scale")] + ".q" in tensors:
            continue
        if name.endswith(".q"):
            base = name[: -len(".q")]
            if base + ".scale" not in tensors:
                raise ValueError(f"tensors: {name} has no {base}.scale beside it")
            state[base] = dequantize(value, tensors[base + ".scale"])
        else:
            state[name] = value.float() if value.is_floating_point() else value
    return state
