"""The settings a generation takes, as three objects that `speculative_generate`, `Session`, the modality
`generate` functions and the CLI share (no keyword list is copied from layer to layer):

- `SamplingConfig` (`multispec.sampling`): greedy or sampled, temperature, top-k, top-p, logits hooks;
- `StoppingConfig`: which ids end a row, which pad it, which token sequences stop it;
- `EngineConfig`: how each step runs (eager, the fixed-shape static step, or that step compiled), node
  padding for the CPU's matrix kernels, and the progress bar.

    speculative_generate(target, drafter, ids, max_new_tokens=64, tree=4,
                         sampling=SamplingConfig(do_sample=True, temperature=0.7),
                         stopping=StoppingConfig(stop=[[271]]), engine=EngineConfig(step="static"))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .sampling import SamplingConfig
from .steps import STEPS


def eos_ids(eos_token_id: int | Sequence[int] | torch.Tensor | None) -> tuple[int, ...]:
    """EOS ids in the order given (the first is `generate`'s default pad id), without repeats."""
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, int):
        return (eos_token_id,)
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.flatten().tolist()
    return tuple(dict.fromkeys(int(x) for x in eos_token_id))


def stop_sequences(stop: Sequence[int | Sequence[int]] | None, name: str = "stop") -> tuple[tuple[int, ...], ...]:
    """Stop sequences as tuples of ids (an int is a one-token sequence); an empty one is refused."""
    out = []
    for s in stop or ():
        seq = (int(s),) if isinstance(s, int) else tuple(int(t) for t in s)
        if not seq:
            raise ValueError(f"{name}: an empty stop sequence would stop at once")
        out.append(seq)
    return tuple(out)


@dataclass(frozen=True)
class StoppingConfig:
    """When a row stops, and what fills the rest of its output.

    `eos_token_id`: the ids that end a row (the stop token is kept, as `generate` does); None: the target's
    generation config (or the adapter's own: Janus's image rows never stop); `()`: never stop.
    `pad_token_id`: what pads rows that stopped early; None: the config's pad id, else the first EOS id.
    `stop`: token sequences that also end a row (multi-token delimiters such as a blank line), kept in
    the output like an EOS.
    """

    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    stop: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.eos_token_id is not None:
            if isinstance(self.eos_token_id, bool) or not isinstance(self.eos_token_id, (int, Sequence, torch.Tensor)):
                raise TypeError(f"eos_token_id: expected an int, a sequence of ints or None, got "
                                f"{type(self.eos_token_id).__name__}")
            object.__setattr__(self, "eos_token_id", eos_ids(self.eos_token_id))
        if self.pad_token_id is not None and (isinstance(self.pad_token_id, bool)
                                              or not isinstance(self.pad_token_id, int)):
            raise TypeError(f"pad_token_id: expected an int or None, got {type(self.pad_token_id).__name__}")
        object.__setattr__(self, "stop", stop_sequences(self.stop))

    @staticmethod
    def never() -> "StoppingConfig":
        """Rows run to their token budget (benchmarks: every method writes the same number of tokens)."""
        return StoppingConfig(eos_token_id=())


@dataclass(frozen=True)
class EngineConfig:
    """How each speculative step runs.

    `step`: "eager" (default: the model's own forward), "static" (the fixed-shape step: preallocated caches
    and a padded node budget, replayed from CUDA graphs on CUDA) or "compiled" (that step under
    `torch.compile`): the lean step for Llama-family targets and their EAGLE heads / lean draft models
    (`multispec.targets.static_step`), the model's own forward at fixed shapes for every other decoder whose
    cache is attention key/values (`multispec.targets.static_hf`); other targets are refused by name. `pad_widths[M]`: verify a step of M nodes (root included) as this many
    (>= M; padding nodes are invalid) where a CPU's matrix kernels run the wider batch faster
    (`multispec.draft_length.VerifyCost.padding()`); the output is unchanged, only the cost; eager steps
    only. `progress`: a progress bar over generated tokens. `on_step(draft, verdict, rows)`: called after each
    verification with the draft tree, the verdict and the original batch rows they cover (e.g.
    `multispec.trace.StepRecorder`, which the demos render). `session_tokens`: with a fixed-shape step, the tokens
    a `Session`'s caches hold in all (prompt, appended turns, generated tokens); `speculative_generate` sets it
    from the prompt and `max_new_tokens`.
    """

    step: str = "eager"
    pad_widths: Mapping[int, int] | None = field(default=None, hash=False)
    progress: bool = False
    session_tokens: int = 2048
    on_step: Callable[[Any, Any, list[int]], None] | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        if self.step not in STEPS:
            raise ValueError(f"step: expected one of {', '.join(map(repr, STEPS))}, got {self.step!r}")
        object.__setattr__(self, "pad_widths", check_pad_widths(self.pad_widths))
        if self.pad_widths and self.step != "eager":
            raise ValueError(f"pad_widths: the {self.step} step has a fixed node budget; padding is for step='eager'")
        if not isinstance(self.progress, bool):
            raise TypeError(f"progress: expected a bool, got {type(self.progress).__name__}")
        if isinstance(self.session_tokens, bool) or not isinstance(self.session_tokens, int) or self.session_tokens < 1:
            raise ValueError(f"session_tokens: expected an int >= 1, got {self.session_tokens!r}")
        if self.on_step is not None and not callable(self.on_step):
            raise TypeError(f"on_step: expected a callable (draft, verdict, rows) or None, got "
                            f"{type(self.on_step).__name__}")


def check_pad_widths(pad_widths: Mapping[int, int] | None) -> dict[int, int] | None:
    """`pad_widths` validated: each width M >= 1 maps to a width >= M."""
    if pad_widths is None:
        return None
    if not isinstance(pad_widths, Mapping):
        raise TypeError(f"pad_widths: expected a mapping of widths, got {type(pad_widths).__name__}")
    bad = {m: w for m, w in pad_widths.items() if not (isinstance(m, int) and isinstance(w, int) and 1 <= m <= w)}
    if bad:
        raise ValueError(f"pad_widths: each entry must map a width M >= 1 to a width >= M, got {bad}")
    return dict(pad_widths)


def check_max_new_tokens(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens: expected an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")


def checked(value, kind: type, name: str):
    """`value` if it is a `kind` (a default `kind()` for None), else a TypeError naming the argument."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"{name}: expected a {kind.__name__}, got {type(value).__name__}")
    return value


# keywords of earlier releases, now fields of a settings object: named in the error a stray one gets
MOVED = {**{k: "sampling=SamplingConfig(...)" for k in ("do_sample", "temperature", "top_k", "top_p")},
         **{k: "stopping=StoppingConfig(...)" for k in ("eos_token_id", "pad_token_id", "stop")},
         **{k: "engine=EngineConfig(...)" for k in ("step", "pad_widths", "progress", "on_step")},
         "guidance_scale": "the target: GuidedTarget(target, guidance_scale)"}


def refuse_moved(keywords: Mapping[str, object]) -> None:
    """A TypeError naming the first keyword that moved into a settings object, and where it went."""
    for name in keywords:
        if name in MOVED:
            raise TypeError(f"{name}: give it in {MOVED[name]}")


__all__ = ["EngineConfig", "SamplingConfig", "StoppingConfig", "check_max_new_tokens", "check_pad_widths", "checked",
           "eos_ids", "refuse_moved", "stop_sequences"]
