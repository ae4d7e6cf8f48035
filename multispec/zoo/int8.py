"""Int8 storage for shipped `transformers` checkpoints: half the bytes of fp16, for pairs that would not fit
the zoo's budget (the format: `multispec.int8`). The `transformers` config is saved beside the weights, so the
class and its config are the user's usual ones; loading dequantizes to fp32.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file, save_file

from ..int8 import dequantize, dequantize_state, quantize, quantize_state

__all__ = ["FILE", "dequantize", "load_int8", "quantize", "save_int8"]

FILE = "model.int8.safetensors"


def save_int8(model, folder: str | Path) -> None:
    """`model`'s config (`save_pretrained` layout) and its weights in int8 / fp16 under `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    save_file(quantize_state(model.state_dict()), str(folder / FILE))


def load_int8(cls, folder: str | Path):
    """A `cls` (e.g. `LlamaForCausalLM`) model from `save_int8`'s folder, in fp32, in eval mode."""
    from transformers import AutoConfig

    folder = Path(folder)
    if not (folder / FILE).exists():
        raise FileNotFoundError(f"{folder}: no {FILE} (write it with multispec.zoo.int8.save_int8)")
    stored = load_file(str(folder / FILE))
    state = dequantize_state(stored)
    config_class = getattr(cls, "config_class", None)  # a subclass's own config (e.g. an image GPT's layout)
    config = (config_class or AutoConfig).from_pretrained(folder)
    model = cls(config)
    model.load_state_dict(state, strict=True)
    return model.float().eval()
