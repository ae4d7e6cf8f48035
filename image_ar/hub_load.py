"""Loading this package's `huggingface_hub` mixin models (VQ-VAE, classifier, patch AR) from a folder without
the hub's bare `print("Loading weights from local directory")`, which interleaved with every command's results."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path


def from_folder(cls, folder: str | Path, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        return cls.from_pretrained(folder, **kwargs)
