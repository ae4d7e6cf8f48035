"""`DeviceGuard`: a `TorchFunctionMode` that finds, on a CPU, the code that would break on a GPU.

On a CPU every tensor is on the same device, so a path that makes a tensor without naming a device, or
draws random numbers from the global generator (or from a generator on another device than the draw),
runs fine here and crashes with a CUDA model ("index is on cpu, different from other tensors on
cuda:0"; "Expected a 'cpu' device type for generator but found 'cuda'"). Under the guard, every call
made *from the project's own source* (the first Python frame outside torch lies in multispec/, vision/,
image_ar/, ssm/ or reasoning/; calls from transformers, diffusers or torch internals are not ours) is
checked:

- a tensor factory (`zeros`, `ones`, `empty`, `full`, `arange`, `linspace`, `eye`, `tensor` /
  `as_tensor` of non-tensor data, `rand`, `randn`, `randint`, `randperm`, ...) must name its `device=`
  (the data's device, or "cpu" stated on purpose for host-side bookkeeping): `*_like` and `new_*` follow
  their input and are not factories;
- with `require_generator` (a run given a generator), every random draw (the factories above, `normal`,
  `multinomial`, `bernoulli`, `poisson`, the in-place `uniform_` / `normal_` / `exponential_` / ..., the
  `*_like` draws) must take the caller's generator: a draw without one is randomness from elsewhere;
- a draw with a generator must be made on the generator's own device (`device=` of a factory, the input
  of an in-place or input-based draw), then moved to the data.

Violations are collected (deduplicated by place and kind), not raised, so one run reports them all.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = tuple(str(REPO / name) + os.sep for name in ("multispec", "vision", "image_ar", "ssm", "reasoning"))
_TORCH = str(Path(torch.__file__).resolve().parent) + os.sep
_HERE = str(Path(__file__).resolve())

# files whose device-less factories are deliberate: host-side reference code that moves its result to the
# input's device before returning (and is owned elsewhere)
EXEMPT = {
    "multispec/kernels/tree_verify.py": "the greedy tree walk's PyTorch reference runs on the host (.tolist()) and "
                                        "returns its outputs on the inputs' device",
}

T = torch.Tensor
# factories that place their result on a device (the default one when `device=` is left out)
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace, torch.logspace,
             torch.eye, torch.empty_strided, torch.scalar_tensor, torch.tril_indices, torch.triu_indices,
             torch.rand, torch.randn, torch.randint, torch.randperm}
DATA_FACTORIES = {torch.tensor, torch.as_tensor}  # factories only for non-tensor data
RANDOM_FACTORIES = {torch.rand, torch.randn, torch.randint, torch.randperm}
# random draws shaped like (and placed on the device of) their first tensor argument
RANDOM_FROM_INPUT = {torch.multinomial, torch.bernoulli, torch.poisson, torch.rand_like, torch.randn_like,
                     torch.randint_like, T.multinomial, T.bernoulli, T.uniform_, T.normal_, T.exponential_,
                     T.random_, T.bernoulli_, T.geometric_, T.cauchy_, T.log_normal_}
WATCHED = FACTORIES | DATA_FACTORIES | RANDOM_FROM_INPUT | {torch.normal}


@dataclass
class Violation:
    where: str  # "path:line"
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _caller(roots: tuple[str, ...]) -> str | None:
    """'path:line' of the code that called the torch function, when it lies under `roots`. Only the direct
    caller counts: a factory called inside torch (`nn.Linear.__init__`, a functional op) or inside
    transformers belongs to them, whichever project function is further up the stack."""
    frame = sys._getframe(2)  # 0: here, 1: __torch_function__, 2: the caller
    name = frame.f_code.co_filename
    if name.startswith(_TORCH) or not name.startswith(roots):
        return None
    where = os.path.relpath(name, REPO).replace(os.sep, "/")
    return None if where in EXEMPT else f"{where}:{frame.f_lineno}"


def _device_of(value) -> torch.device:
    return torch.device(value) if not isinstance(value, torch.device) else value


def _same(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


@dataclass
class DeviceGuard(TorchFunctionMode):
    """See the module docstring. `roots`: source folders whose calls are checked."""

    require_generator: bool = True
    roots: tuple[str, ...] = SOURCE_ROOTS
    violations: list[Violation] = field(default_factory=list)
    calls: int = 0  # checked calls (made from `roots`), a sanity count

    def __post_init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str]] = set()

    def _flag(self, where: str, what: str) -> None:
        if (where, what) not in self._seen:
            self._seen.add((where, what))
            self.violations.append(Violation(where, what))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in WATCHED:
            where = _caller(self.roots)
            if where is not None:
                self.calls += 1
                for what in self._problems(func, args, kwargs):
                    self._flag(where, what)
        return func(*args, **kwargs)

    def _problems(self, func, args, kwargs) -> list[str]:
        name = ("Tensor." if func.__qualname__.startswith("TensorBase.") else "torch.") + func.__name__
        out = []
        generator = kwargs.get("generator")
        tensor_args = [a for a in args if isinstance(a, torch.Tensor)] + \
            [v for k, v in kwargs.items() if k in ("mean", "std", "input") and isinstance(v, torch.Tensor)]
        factory = func in FACTORIES or (func is torch.normal and not tensor_args) or \
            (func in DATA_FACTORIES and not (args and isinstance(args[0], torch.Tensor)))
        random = func in RANDOM_FACTORIES or func in RANDOM_FROM_INPUT or func is torch.normal
        if factory and kwargs.get("device") is None:
            out.append(f"{name} without device=")
        if random and self.require_generator and generator is None:
            out.append(f"{name} draws without the caller's generator")
        if random and generator is not None:
            if factory and kwargs.get("device") is not None:
                placed = _device_of(kwargs["device"])
            elif tensor_args:
                placed = tensor_args[0].device
            else:
                placed = None
            if placed is not None and not _same(placed, generator.device):
                out.append(f"{name} draws on {placed} with a generator on {generator.device}")
        return out

    def report(self) -> str:
        return "\n".join(str(v) for v in self.violations)
