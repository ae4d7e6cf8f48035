"""Argument validation shared by the public wrappers of the verification kernels (the core's and the modality
packages')."""

from __future__ import annotations

import torch

from ..host import require


def check_tensor(t: object, name: str, dim: int, dtype_kind: str, shape: tuple | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dimensions, got shape {tuple(t.shape)}")
    if dtype_kind == "int" and (t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex()):
        raise TypeError(f"{name}: expected an integer tensor, got {t.dtype}")
    if dtype_kind == "float" and not t.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if shape is not None:
        for i, (got, want) in enumerate(zip(t.shape, shape)):
            if want is not None and got != want:
                raise ValueError(f"{name}: expected shape {shape} (None = any), got {tuple(t.shape)}")
    return t


def check_same_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name}: on {t.device}, expected {device} like the other inputs")


def check_linked_tree(first_child: torch.Tensor, next_sibling: torch.Tensor) -> None:
    """Links must point inside the tree and only forward (parents precede children), so walks end. One check,
    deferred to the step's host read on CUDA (`multispec.host`): the kernels bound their walks by the tree
    size and take their links through `links_in_tree`, so nothing runs out of bounds before it fires."""
    t = first_child.shape[1]
    idx = torch.arange(t, device=first_child.device)[None, :]
    ok = torch.stack([(((links == -1) | (links > idx)) & (links < t)).all() for links in (first_child, next_sibling)])
    require(ok.all(), lambda: _bad_links(first_child, next_sibling))


def _bad_links(first_child: torch.Tensor, next_sibling: torch.Tensor) -> ValueError:
    t = first_child.shape[1]
    idx = torch.arange(t, device=first_child.device)[None, :]
    for name, links in (("first_child", first_child), ("next_sibling", next_sibling)):
        if bool(((links < -1) | (links >= t)).any()):
            return ValueError(f"{name}: entries must lie in [-1, {t})")
        if bool(((links >= 0) & (links <= idx)).any()):
            return ValueError(f"{name}: links must point to a higher node index (parents precede children)")
    return ValueError("first_child / next_sibling: malformed links")


def links_in_tree(links: torch.Tensor) -> torch.Tensor:
    """`links` with entries outside [-1, T) set to -1: what a kernel may index before a deferred check fires."""
    t = links.shape[1]
    return torch.where((links >= -1) & (links < t), links, -1)
