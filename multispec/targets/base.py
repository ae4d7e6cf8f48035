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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import eos_ids
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


class _Committing(abc.ABC):
    """What both contracts share: keep an accepted path, drop what was fed, keep only some rows."""

    @abc.abstractmethod
    def commit(self, path: torch.Tensor) -> None:  # path: [B, D + 1] tree indices, root first, -1 padded
        """Keep the pending nodes on `path` (the accepted root-to-node path of each row); drop the rest."""

    @abc.abstractmethod
    def discard(self) -> None:
        """Drop every pending node (a scored span that is not kept)."""

    @abc.abstractmethod
    def select(self, rows: torch.Tensor) -> None:  # rows: [B'] int64 batch positions to keep, in order
        """Keep only these batch rows (the others finished)."""


class Target(_Committing):
    """A model the loop verifies drafts with (see the module docstring for the lifecycle).

    Everything the session and the rules read of a target is declared here, with its default; an adapter
    sets what differs for its model:

    - `name`, `vocab_size` (the generated vocabulary), `device`;
    - `model`: the model this adapter runs (None for a hand-written target); `shown_model`: the model the
      user passed, where the adapter runs a view of it (a VLM's text model), else None (`user_model`);
    - `prefill_inputs`: model inputs besides input_ids / attention_mask that `prefill` takes (pixel_values);
      `per_token_inputs`: those with one value per prompt token (mm_token_type_ids), and
      `appended_token_type`: their value for text appended after the prompt (a prefix LM's suffix: 1);
    - `prompt_vocab_size`: prompt ids may come from a larger vocabulary than the generated ones (Janus: text
      prompt, image tokens); None: the same vocabulary;
    - `stop_token_ids`: the ids that end a row; None: the model's generation config (as `generate`), () never;
    - `provides`: the features this adapter can return (`FeatureRequest`);
    - `accepts_host_counts`: `commit(path, counts=...)` takes the per-row counts the session read on the
      host, so the commit reads nothing from the device;
    - `unconditional_prompt(prompt) -> Prompt`: the unconditional half of classifier-free guidance, for
      adapters that know their model's convention (`GuidedTarget`'s default); None where unknown;
    - `max_positions`: the longest sequence the model takes (None: unbounded);
    - `generation_defaults()`: the EOS ids and pad id `generate` would use;
    - `eager_class`: the adapter class this one stands in for, faster (None: itself); the fixed-shape class
      registered for that class serves it (`multispec.targets.static.register_fixed_shape`).

    The fixed-shape contract: `step="static"` runs an adapter's models on the class registered for exactly its
    class (or its `eager_class`), written out by name beside it; any other adapter is refused by name.
    """

    name: str = "target"
    vocab_size: int
    device: torch.device
    model: Any = None
    shown_model: Any = None
    prefill_inputs: frozenset[str] = frozenset()
    per_token_inputs: frozenset[str] = frozenset()
    appended_token_type: int = 0
    prompt_vocab_size: int | None = None
    stop_token_ids: tuple[int, ...] | None = None
    provides: FeatureRequest = NO_FEATURES
    accepts_host_counts: bool = False
    unconditional_prompt: Callable[[Prompt], Prompt] | None = None
    eager_class: type | None = None

    @property
    def user_model(self) -> Any:
        """The model to name to the user (and to fingerprint): `shown_model`, else `model`, else the adapter."""
        if self.shown_model is not None:
            return self.shown_model
        return self.model if self.model is not None else self

    def describe(self) -> str:
        """How errors name this target: "name (ModelClass)"."""
        return f"{self.name} ({type(self.user_model).__name__})"

    @property
    def max_positions(self) -> int | None:
        """The model config's `max_position_embeddings` (None: no model, no such limit, or dynamic NTK RoPE,
        which rescales its frequencies past it by design)."""
        config = getattr(self.model, "config", None)
        rope = getattr(config, "rope_parameters", None)
        if isinstance(rope, dict) and rope.get("rope_type") == "dynamic":
            return None
        value = getattr(config, "max_position_embeddings", None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def generation_defaults(self) -> tuple[tuple[int, ...], int | None]:
        """The EOS ids and pad id of the model's generation config, as `generate` would use them
        (`stop_token_ids`, when set, replaces the EOS ids)."""
        config = getattr(self.model, "generation_config", None)
        eos = eos_ids(config.eos_token_id) if config is not None else ()
        if self.stop_token_ids is not None:
            eos = tuple(self.stop_token_ids)
        return eos, (config.pad_token_id if config is not None else None)

    @property
    @abc.abstractmethod
    def batch_size(self) -> int: ...

    @abc.abstractmethod
    def prefill(self, prompt: Prompt, request: FeatureRequest = NO_FEATURES) -> PrefillOutput: ...

    @abc.abstractmethod
    def score(self, tokens: torch.Tensor,  # [B, T] int64: node 0 each row's root, then the draft's nodes
              parents: torch.Tensor,  # [B, T] or [T] int64: a node's parent's index (< its own), -1 for the root
              valid: torch.Tensor | None = None,  # [B, T] bool: real nodes (None: all)
              request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        """The target's logits [B, T, V] after every node of the tree, in one pass; the nodes stay pending
        until `commit` or `discard`."""

    def checkpoint(self) -> Any:
        """An opaque mark of the committed state, for `rollback` (no pending tree; valid until `select`)."""
        raise TypeError(f"{self.describe()}: this adapter cannot roll back")

    def rollback(self, state: Any) -> None:
        """Return to a `checkpoint` (everything committed since is forgotten)."""
        raise TypeError(f"{self.describe()}: this adapter cannot roll back")

    # ---- checks shared by every adapter -------------------------------------------------------------------
    def check_prompt(self, prompt: Prompt) -> None:
        """Raise naming the argument if `prompt` carries an input this target does not take (or lacks one it
        needs: adapters extend this)."""
        unknown = sorted(set(prompt.inputs) - set(self.prefill_inputs))
        if unknown:
            takes = ", ".join(sorted(self.prefill_inputs)) or "no inputs besides input_ids and attention_mask"
            raise TypeError(f"{unknown[0]}: {self.describe()} does not take this input (it takes: {takes})")

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
            raise ValueError(f"{who}: asks for {' and '.join(missing)}, which {self.describe()} does not provide")


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
