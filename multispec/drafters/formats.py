"""EAGLE heads in the layouts they are published in, recognised from the folder alone:

- multispec's own (`eagle_config.json` + `eagle.safetensors`): `EagleHead`;
- EAGLE-3 as vLLM and SGLang serve it (`config.json` naming an EAGLE-3 architecture or carrying
  `draft_vocab_size` / `target_hidden_size` / the fused layers, weights `midlayer.*` or `layers.0.*`, `fc`,
  `norm`, `lm_head`, `d2t`, `t2d`): `Eagle3Head`;
- EAGLE-1/2 as the reference code writes it (a one-layer Llama `config.json`, weights `fc.*` and `layers.0.*`
  without the layer's input norm, no final norm and no LM head: the target's own reads the layer's output):
  `EagleHead` with `reference_layout`, the target's LM head copied in.

    drafter = load_eagle("path/to/head", target)     # EagleDrafter or Eagle3Drafter
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ..targets.hf import output_vocab_size
from .eagle import EagleConfig, EagleDrafter, EagleHead
from .eagle3 import Eagle3Drafter, Eagle3Head, read_weights

EAGLE3_KEYS = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "speculators_model_type")


def layout(folder: str | Path) -> str:
    """"multispec", "eagle3" or "eagle-reference" for a head folder, or a FileNotFoundError saying what it holds."""
    folder = Path(folder)
    if (folder / "eagle_config.json").exists():
        return "multispec"
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: neither eagle_config.json (a multispec EAGLE head) nor config.json "
                                "(an EAGLE-3 or reference EAGLE-1/2 head)")
    config = json.loads((folder / "config.json").read_text())
    names = " ".join(config.get("architectures") or [])
    if "eagle3" in names.lower().replace("_", "") or any(k in config for k in EAGLE3_KEYS):
        return "eagle3"
    return "eagle-reference"


def load_reference_eagle(folder: str | Path, target: PreTrainedModel, dtype: torch.dtype = torch.float32) -> EagleHead:
    """An EAGLE-1/2 head in the reference code's layout (see the module docstring), for `target`."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = {k.removeprefix("model."): v for k, v in read_weights(folder).items()}
    if "fc.weight" not in tensors or not any(k.startswith("layers.0.") for k in tensors):
        raise ValueError(f"{folder}: not an EAGLE-1/2 head (no fc.weight and layers.0.* weights)")
    vocab, hidden = output_vocab_size(target), target.get_output_embeddings().weight.shape[1]
    if config["hidden_size"] != hidden:
        raise ValueError(f"{folder}: a head for hidden size {config['hidden_size']}, the target's is {hidden}")
    head = EagleHead(EagleConfig(
        hidden_size=hidden, draft_vocab_size=vocab, target_vocab_size=vocab,
        intermediate_size=config["intermediate_size"], num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
        rope_theta=config.get("rope_theta", 10000.0), rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        max_position_embeddings=config.get("max_position_embeddings", 2048), reference_layout=True,
        fc_bias="fc.bias" in tensors))
    state = {("decoder.model." + k if k.startswith("layers.") else k): v for k, v in tensors.items()
             if k.startswith(("fc.", "layers."))}
    state["decoder.lm_head.weight"] = target.get_output_embeddings().weight.detach()
    expected = {k for k in head.state_dict() if k not in ("d2t", "decoder.model.embed_tokens.weight")}
    if set(state) != expected:
        raise ValueError(f"{folder}: weights do not match a reference EAGLE-1/2 layer: missing "
                         f"{sorted(expected - set(state))[:6]}, unexpected {sorted(set(state) - expected)[:6]}")
    head.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    return head.to(dtype).eval()


def load_eagle(folder: str | Path, target: PreTrainedModel) -> EagleDrafter:
    """The drafter of the EAGLE head in `folder` (any layout of the module docstring) for `target`."""
    kind = layout(folder)
    if kind == "multispec":
        return EagleDrafter(EagleHead.load(folder), target)
    if kind == "eagle3":
        return Eagle3Drafter(Eagle3Head.load(folder, target=target), target)
    return EagleDrafter(load_reference_eagle(folder, target), target)


__all__ = ["layout", "load_eagle", "load_reference_eagle"]
