"""The contracts between the speculative loop and the models it drives.

Two contracts, deliberately separate:

- `Target`: what the loop verifies with. `prefill(prompt, request)` once; then one draft tree per step:
  `score(tokens, parents, valid, request)` over the whole tree (node 0 = each row's root, the last
  committed token; `parents[b, t]` < t its parent's tree index, -1 for the root), then `commit(path)` with
  the accepted root-to-node path (tree indices, -1 padded) or `discard()`; `select(rows)` when rows finish.
- `FeedingEngine`: what a model drafter grows its tree with. Nodes arrive a few at a time (a catch-up chain,
  then one depth per call), each after its parent; `feed` returns their logits; `commit(path)` keeps the
  named pending nodes. `HFCausalLM` is both; a state-space target is only a `Target` (the package that adapts
  it registers a feeding engine of its own for drafting).

Outputs are typed: `PrefillOutput` and `TargetOutput` carry the logits or roots, the features a drafter
asked for (`FeatureRequest` -> `Features`), and modality extras. Positions belong to the adapter: the loop
never computes one.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..prompt import Prompt


@dataclass(frozen=True)
class FeatureRequest:
    """What a feature-level drafter reads from the target, at prefill and at every scored node.

    `hidden`: the final, normed hidden state (what the LM head reads; EAGLE-1/2).
    `layers`: the residual stream entering these decoder layers (0 = the embeddings, `num_layers` = the
    last layer's output before the final norm; EAGLE-3 reads a low, a middle and a high one).
    `image_embeds`: the projected image embeddings a VLM target placed in the prompt (prefill only).
    Only what is requested is kept.
    """

    hidden: bool = False
    layers: tuple[int, ...] = ()
    image_embeds: bool = False

    def __post_init__(self) -> None:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.layers):
            raise TypeError(f"layers: expected a tuple of ints, got {self.layers!r}")
        object.__setattr__(self, "layers", tuple(sorted(set(self.layers))))

    @property
    def empty(self) -> bool:
        return not (self.hidden or self.layers or self.image_embeds)

    def __or__(self, other: "FeatureRequest") -> "FeatureRequest":
        return FeatureRequest(self.hidden or other.hidden, self.layers + other.layers,
                              self.image_embeds or other.image_embeds)


NO_FEATURES = FeatureRequest()


@dataclass
class Features:
    """Requested target features for a set of positions (prefilled tokens, or the nodes of a scored tree).

    `hidden` [B, N, H] and `layers[i]` [B, N, H] per position; `image_embeds` [B, I, H] with
    `image_mask` [B, I] (True = a real image embedding; rows hold different numbers) at prefill.
    """

    hidden: torch.Tensor | None = None
    layers: dict[int, torch.Tensor] = field(default_factory=dict)
    image_embeds: torch.Tensor | None = None
    image_mask: torch.Tensor | None = None

    def gather(self, index: torch.Tensor) -> "Features":
        """The per-position features at `index` [B, K] (clamped at 0; callers mask the padding)."""
        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.gather(1, index.clamp(min=0).to(t.device)[..., None].expand(-1, -1, t.shape[-1]))

        return Features(None if self.hidden is None else pick(self.hidden),
                        {i: pick(t) for i, t in self.layers.items()}, self.image_embeds, self.image_mask)

    def select(self, rows: torch.Tensor) -> "Features":
        """Only batch rows `rows`."""
        def keep(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows.to(t.device)]

        return Features(keep(self.hidden), {i: keep(t) for i, t in self.layers.items()}, keep(self.image_embeds),
                        keep(self.image_mask))


@dataclass
class PrefillOutput:
    """`roots` [B]: each row's last prompt token, not yet seen by the target (the first tree's root);
    `features`: the requested features of the prefilled tokens (positions 0 .. L-2), None if none asked;
    `extras`: modality-specific state (e.g. a VLM's rope deltas)."""

    roots: torch.Tensor
    features: Features | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class TargetOutput:
    """`logits` [B, T, V] float32 after every node (for a continuous target: its own scores in `extras`);
    `features`: the requested features at every node, None if none asked."""

    logits: torch.Tensor | None
    features: Features | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def _name(obj: Any) -> str:
    # `shown_model`: the model a user passed, where the adapter drives a view of it (a VLM's text model)
    shown = getattr(obj, "shown_model", None) or getattr(obj, "model", obj)
    return f"{getattr(obj, 'name', 'target')} ({type(shown).__name__})"


class _Committing(abc.ABC):
    """What both contracts share: keep an accepted path, drop what was fed, keep only some rows."""

    @abc.abstractmethod
    def commit(self, path: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def discard(self) -> None: ...

    @abc.abstractmethod
    def select(self, rows: torch.Tensor) -> None: ...


class Target(_Committing):
    """A model the loop verifies drafts with (see the module docstring for the lifecycle)."""

    name: str = "target"
    vocab_size: int
    device: torch.device
    # model inputs besides input_ids / attention_mask that `prefill` takes (e.g. pixel_values)
    prefill_inputs: frozenset[str] = frozenset()
    # prompt ids may come from a larger vocabulary than the generated ones (Janus: text prompt, image tokens);
    # None: the same vocabulary
    prompt_vocab_size: int | None = None
    # the ids that end a row; None: the model's generation config decides (as `generate`), () never stops
    stop_token_ids: tuple[int, ...] | None = None
    # prefill inputs with one value per prompt token (laid out like input_ids, e.g. mm_token_type_ids)
    per_token_inputs: frozenset[str] = frozenset()
    # the features this adapter can return
    provides: FeatureRequest = NO_FEATURES

    @property
    @abc.abstractmethod
    def batch_size(self) -> int: ...

    @abc.abstractmethod
    def prefill(self, prompt: Prompt, request: FeatureRequest = NO_FEATURES) -> PrefillOutput: ...

    @abc.abstractmethod
    def score(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None,
              request: FeatureRequest = NO_FEATURES) -> TargetOutput: ...

    def checkpoint(self) -> Any:
        """An opaque mark of the committed state, for `rollback` (no pending tree; valid until `select`)."""
        raise TypeError(f"{_name(self)}: this adapter cannot roll back")

    def rollback(self, state: Any) -> None:
        """Return to a `checkpoint` (everything committed since is forgotten)."""
        raise TypeError(f"{_name(self)}: this adapter cannot roll back")

    # ---- checks shared by every adapter -------------------------------------------------------------------
    def check_prompt(self, prompt: Prompt) -> None:
        """Raise naming the argument if `prompt` carries an input this target does not take (or lacks one it
        needs: adapters extend this)."""
        unknown = sorted(set(prompt.inputs) - set(self.prefill_inputs))
        if unknown:
            takes = ", ".join(sorted(self.prefill_inputs)) or "no inputs besides input_ids and attention_mask"
            raise TypeError(f"{unknown[0]}: {_name(self)} does not take this input (it takes: {takes})")

    def check_request(self, request: FeatureRequest, who: str = "drafter") -> None:
        """Raise naming `who` if it asks for features this target cannot return."""
        missing = []
        if request.hidden and not self.provides.hidden:
            missing.append("the final hidden state")
        if request.layers and not self.provides.layers:
            missing.append(f"layer hidden states {list(request.layers)}")
        if request.image_embeds and not self.provides.image_embeds:
            missing.append("image embeddings")
        if missing:
            raise ValueError(f"{who}: asks for {' and '.join(missing)}, which {_name(self)} does not provide")


class FeedingEngine(_Committing):
    """Incremental tree feeding for model drafters (see the module docstring)."""

    vocab_size: int
    device: torch.device

    @property
    @abc.abstractmethod
    def num_pending(self) -> int: ...

    @abc.abstractmethod
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PrefillOutput:
        """Prefill all prompt tokens but the last; the last ones are the roots [B]."""

    @abc.abstractmethod
    def feed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None) -> TargetOutput:
        """Feed M nodes per row; `parents[b, m]` the pending index of node m's parent (-1 = the committed
        prefix); node m becomes pending index `num_pending + m`. Returns their logits [B, M, V]."""


def check_layers(layers: Iterable[int], num_layers: int, who: str = "drafter") -> None:
    bad = [i for i in layers if not 0 <= i <= num_layers]
    if bad:
        raise ValueError(f"{who}: requested layer features {bad}; this target has layers 0..{num_layers}")
