"""`transformers` causal LMs as speculative targets (and as the engine of model drafters).

`HFCausalLM` keeps a KV cache for a batch of rows whose lengths drift apart as they accept different
numbers of tokens. Layout per row b: columns [start[b], length[b]) hold its committed tokens (start =
its left padding); columns [length[b], width) are stale and masked out; nodes fed since the last commit
("pending" nodes) sit after `width`, in feeding order, and attend to their row's committed prefix plus
their own ancestors among the pending nodes. A commit copies the accepted path's cache entries to
[length[b], length[b] + a[b]) and drops every pending column, so a rollback costs one small gather.

Attention masks are additive float 4D masks (a bool mask is silently wrong on the eager path) and
position ids are the row's committed length + depth, so every row computes exactly what it would
compute alone. Sliding-window layers get their own mask; the cache keeps full layers for all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

try:  # transformers' own map from a config to its cache layers (5.x; older: the config's `layer_types`)
    from transformers.cache_utils import get_layer_types_and_kwargs
except ImportError:
    get_layer_types_and_kwargs = None

from ..host import DEFERRED_DEVICE_TYPES
from ..prompt import Prompt
from ..tree import ancestor_mask_from_parents
from .base import (NO_FEATURES, FeatureRequest, Features, FeedingEngine, PrefillOutput, Target, TargetOutput,
                   check_layers)
from .dynamic_rope import DynamicNTK, dynamic_rotary
from .lm_head import tall_lm_head
from .registry import served_models


def check_causal_lm(model: object, name: str, allow_stateful: bool = False) -> None:
    """Raise TypeError unless `model` is a decoder-only `transformers` model we can drive (a stateful one,
    e.g. a hybrid state-space/attention model, only when the caller handles its state: `allow_stateful`)."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"{name}: expected a transformers PreTrainedModel, got {type(model).__name__}")
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise TypeError(f"{name}: encoder-decoder models ({type(model).__name__}) are not supported")
    if not allow_stateful:
        other = {i: kind for i, kind in enumerate(cache_layer_types(config)) if kind not in KV_CACHE_LAYER_TYPES}
        if other or getattr(model, "_is_stateful", False):
            served = served_models()
            known = (f"the registered adapters drive {', '.join(served)}" if served else
                     "state-space models are driven by an adapter package (entry-point group multispec.adapters) "
                     "when one is installed")
            layers = ", ".join(f"{i}: {kind!r}" for i, kind in list(other.items())[:6]) + (
                ", ..." if len(other) > 6 else "")
            what = f"cache layers that are not attention key/values ({layers})" if other else "a recurrent state"
            raise TypeError(f"{name}: {type(model).__name__} keeps {what}; multispec's generic adapter verifies "
                            f"trees over attention key/value caches only, and no registered adapter drives this "
                            f"class (it would need its own tree recurrence and state commit); {known}")
    if model.get_output_embeddings() is None:
        raise TypeError(f"{name}: {type(model).__name__} has no language-model head (use a *ForCausalLM class)")


# cache layers the generic adapter can crop, gather and mask per tree node ("dummy": a layer without any cache)
KV_CACHE_LAYER_TYPES = {"full_attention", "sliding_attention", "dummy"}


def keeps_state(model: object) -> bool:
    """Whether `model` keeps anything but attention key/values across tokens: it flags itself stateful, or a
    cache layer `transformers` would build for it is not attention (LFM2's conv layers, without the flag)."""
    if getattr(model, "_is_stateful", False):
        return True
    config = getattr(model, "config", None)
    return config is not None and any(kind not in KV_CACHE_LAYER_TYPES for kind in cache_layer_types(config))


def cache_layer_types(config) -> list[str]:
    """The kind of cache layer `transformers` builds for each decoder layer of `config` ("full_attention",
    "sliding_attention", "linear_attention", "conv", "hybrid", ...): what the model keeps per layer, read from
    the config (no forward). KV-sharing consumer layers count as "kv_sharing" (their keys come from another
    layer, which the generic adapter does not follow)."""
    text = config.get_text_config(decoder=True)
    if getattr(text, "kv_sharing_modes", None) is not None and "reuse" in text.kv_sharing_modes:
        return ["kv_sharing" if mode == "reuse" else "full_attention" for mode in text.kv_sharing_modes]
    try:
        if get_layer_types_and_kwargs is None:
            raise AttributeError("get_layer_types_and_kwargs")
        types, _ = get_layer_types_and_kwargs(text)
    except (AttributeError, TypeError, ValueError):  # a config without per-layer fields: its own list, if any
        types = list(getattr(text, "layer_types", None) or [])
    return [str(t) for t in types]


def attention_layer_types(config) -> tuple[list[str] | None, int | None]:
    """(layer types, sliding window) as the model applies them: `layer_types` when the config lists them;
    a config with a sliding window and no list (Mistral, Mixtral) slides in every layer; the window is
    None when no layer slides."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types is None and window is not None and getattr(config, "use_sliding_window", True):
        types = ["sliding_attention"] * int(config.num_hidden_layers)
    if types is None or "sliding_attention" not in types:
        window = None
    return types, window


def output_vocab_size(model: PreTrainedModel) -> int:
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if hasattr(head, "weight") else int(model.config.get_text_config().vocab_size)


@contextmanager
def captured_features(decoder: torch.nn.Module, request: FeatureRequest) -> Iterator[dict]:
    """Within the block, `decoder`'s forward records the requested features in the yielded dict: "hidden", its
    final (normed) output, and layer i, the residual stream entering layer i (i = the layer count: the last
    layer's output, entering the final norm). Hooks, so every position is kept even when only the last logits
    are computed."""
    captured: dict = {}
    hooks = []
    if request.hidden:
        hooks.append(decoder.register_forward_hook(lambda _m, _a, out: captured.__setitem__(
            "hidden", out[0] if isinstance(out, tuple) else out.last_hidden_state)))
    for i in request.layers:
        module = decoder.layers[i] if i < len(decoder.layers) else decoder.norm
        hooks.append(module.register_forward_pre_hook(
            lambda _m, args, kw, i=i: captured.__setitem__(i, args[0] if args else kw["hidden_states"]),
            with_kwargs=True))
    try:
        yield captured
    finally:
        for hook in hooks:
            hook.remove()


@dataclass
class PendingNodes:
    """Nodes fed since the last commit, per row."""

    parents: torch.Tensor  # [B, P] pending index of the parent, -1 = committed prefix
    positions: torch.Tensor  # [B, P] position ids
    ancestors: torch.Tensor  # [B, P, P] bool, ancestor-or-self


class HFCausalLM(Target, FeedingEngine):
    """Prefill / score-a-tree / commit adapter over a `transformers` causal LM; also the incremental
    feeding engine of model drafters.

    The subclass contract: an adapter for a model family the core does not know (a modality's, or a user's)
    overrides only these public hooks, each documented where it is defined; the rest is the core's.
    - `prefill_extra_inputs()`: further keyword arguments of the prefill's forward (a VLM's encoder outputs);
    - `prefill_blocks(ids, mask2d)`: prompt token pairs that attend both ways (an image's tokens, a prefix), with
      the class attribute `blocks_cross_windows`; `feed_unwindowed(allowed, cols, p0)`: pairs of a later feed
      that sliding windows do not cut;
    - `prefill_positions(positions)` / `node_positions(positions)`: the position ids the model reads (e.g.
      Qwen2-VL's 3-axis rotary positions);
    - `run_forward(request, **kwargs)`, `prefill_forward(...)`, `score_forward(...)`: the model's call on the
      prompt and on a feed's nodes (a model with recurrent layers runs them on the tree here);
    - `new_cache()`: the cache object the model writes (a hybrid's own cache class).
    A fixed-shape engine for such an adapter is a class of its own (`StaticFeed`'s contract), registered with
    `register_fixed_shape(EagerClass, StaticClass)` (`multispec.plugin`)."""

    stateful = False  # subclasses that keep a model's recurrent state themselves set this
    provides = FeatureRequest(hidden=True, layers=(0,))  # any layer (the index range is checked per model)

    def __init__(self, model: PreTrainedModel, name: str = "target"):
        check_causal_lm(model, name, allow_stateful=self.stateful)
        self.model = model.eval()
        self.name = name
        self.vocab_size = output_vocab_size(model)
        text_config = model.config.get_text_config(decoder=True)
        self.layer_types, self.sliding_window = attention_layer_types(text_config)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache: DynamicCache | None = None
        rotary = dynamic_rotary(model)  # dynamic NTK RoPE: every token rotated as `generate` rotates it
        self._ntk = None if rotary is None else DynamicNTK(rotary, name)

    # ---- lifecycle ----------------------------------------------------------------------------------
    def prefill(self, prompt: Prompt, request: FeatureRequest = NO_FEATURES) -> PrefillOutput:
        self.check_prompt(prompt)
        self.check_request(request)
        return self.start(prompt.input_ids, prompt.attention_mask, request=request)

    def check_request(self, request: FeatureRequest, who: str = "drafter") -> None:
        super().check_request(request, who)
        if request.layers:
            check_layers(request.layers, self.num_layers, who)

    @property
    def num_layers(self) -> int:
        return len(self.model.get_decoder().layers)

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
              inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> PrefillOutput:
        """Prefill all prompt tokens but the last one; the last ones are the first roots [B]; features
        (if requested) cover the prefilled tokens [B, L-1, ...]."""
        b, length = input_ids.shape
        self.cache = self.new_cache()
        self.start_col = (attention_mask == 0).sum(dim=1).to(self.device)
        self.length = torch.full((b,), length - 1, dtype=torch.long, device=self.device)
        self.host_length = [length - 1] * b  # `length` as the host knows it (commits with counts keep it)
        self.width = length - 1
        self._reset_pending(b)
        if self._ntk is not None:
            self._ntk.start(attention_mask)
        features = None
        if length > 1 and self.prefill_whole_prompt:
            features = self._prefill_whole(input_ids, attention_mask, request, inputs_embeds)
        elif length > 1:
            embeds = None if inputs_embeds is None else inputs_embeds[:, :-1].to(self.device)
            features = self.prefill_forward(input_ids[:, :-1].to(self.device), attention_mask[:, :-1].to(self.device),
                                     request, embeds)
        elif not request.empty:
            features = self._empty_features(b, request)
        return PrefillOutput(input_ids[:, -1].to(self.device), features)

    # A model whose earlier prompt tokens attend to later ones (a prefix LM: PaliGemma's bidirectional prefix)
    # sets this: the prefill then runs the whole prompt, so every prompt token's K/V sees the last one, and drops
    # the last token's K/V. Fed again as the first root, the last token attends to every prompt token exactly as
    # in the whole-prompt pass (the last position sees all of them either way), so its K/V and logits are the
    # model's own.
    prefill_whole_prompt = False

    def _prefill_whole(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, request: FeatureRequest,
                       inputs_embeds: torch.Tensor | None) -> Features | None:
        embeds = None if inputs_embeds is None else inputs_embeds.to(self.device)
        features = self.prefill_forward(input_ids.to(self.device), attention_mask.to(self.device), request, embeds)
        self.cache.crop(-1)  # the last prompt token's K/V: it is fed again as the first root
        if features is None:
            return None
        drop = lambda t: None if t is None else t[:, :-1]  # noqa: E731 (features cover the prefilled tokens)
        return Features(drop(features.hidden), {i: drop(t) for i, t in features.layers.items()})

    def _empty_features(self, b: int, request: FeatureRequest) -> Features:
        empty = torch.zeros(b, 0, self.hidden_size, dtype=self.dtype, device=self.device)
        return Features(empty if request.hidden else None, {i: empty for i in request.layers})

    def new_cache(self) -> DynamicCache:
        return DynamicCache()

    @property
    def hidden_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[1])

    def run_forward(self, request: FeatureRequest, **kwargs):
        """Call the model; return its output and the requested features, captured by hooks so every
        position is kept even when only the last logits are computed: the decoder's final (normed) hidden
        state, and the residual stream entering each requested layer."""
        with captured_features(self.model.get_decoder(), request) as captured, tall_lm_head(self.model):
            out = self.model(past_key_values=self.cache, use_cache=True, **kwargs)
        if request.empty:
            return out, None
        return out, Features(captured.get("hidden"), {i: captured[i] for i in request.layers})

    def _rotating(self):
        """Dynamic NTK RoPE per token within the block (`dynamic_rope`); nothing for other models. Around the
        forward's call, outside a compiled step (the patch is a module attribute)."""
        return nullcontext() if self._ntk is None else self._ntk.rotating()

    @torch.no_grad()
    def prefill_forward(self, ids: torch.Tensor, mask2d: torch.Tensor, request: FeatureRequest = NO_FEATURES,
                 inputs_embeds: torch.Tensor | None = None) -> Features | None:
        n = ids.shape[1]
        pos = (mask2d.long().cumsum(-1) - 1).clamp(min=0)
        q = torch.arange(n, device=self.device)
        causal = q[None, :, None] >= q[None, None, :]
        allowed = causal & mask2d.bool()[:, None, :]
        # fully padded query rows attend to themselves only (their output is never used)
        allowed = allowed | torch.eye(n, dtype=torch.bool, device=self.device)[None]
        blocks = self.prefill_blocks(ids, mask2d)
        crossing = blocks if self.blocks_cross_windows else None
        if blocks is not None and crossing is None:
            allowed = allowed | blocks
        masks = self._layer_masks(allowed, pos[:, :, None] - pos[:, None, :], unwindowed=crossing)
        tokens = dict(input_ids=ids) if inputs_embeds is None else dict(inputs_embeds=inputs_embeds)
        with self._rotating():
            _, features = self.run_forward(request, attention_mask=masks, position_ids=self.prefill_positions(pos),
                                    cache_position=q, logits_to_keep=1, **tokens, **self.prefill_extra_inputs())
        return features

    def prefill_extra_inputs(self) -> dict:
        """Further keyword arguments of the prefill's forward (e.g. a vision-language model's encoder outputs
        that its own forward places); none by default."""
        return {}

    # Whether sliding windows leave `prefill_blocks` whole: `transformers` composes the masks per model,
    # Gemma 3 as AND(window, OR(causal, blocks)), PaliGemma as OR(AND(window, causal), prefix)
    blocks_cross_windows = False

    def prefill_blocks(self, ids: torch.Tensor, mask2d: torch.Tensor) -> torch.Tensor | None:
        """Pairs of prompt tokens [B, L, L] that attend to each other both ways besides the causal mask (None: no
        such pairs). Adapters whose model attends so in the prompt (within an image, over a prefix) give them
        here."""
        return None

    def prefill_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The position ids the model reads for the prefilled tokens, given each token's index among its
        row's real tokens [B, L-1] (adapters with their own scheme override this and `node_positions`)."""
        return positions

    def _reset_pending(self, b: int) -> None:
        z = torch.zeros(b, 0, dtype=torch.long, device=self.device)
        self.pending = PendingNodes(z, z.clone(), torch.zeros(b, 0, 0, dtype=torch.bool, device=self.device))

    @property
    def batch_size(self) -> int:
        return int(self.length.shape[0])

    @property
    def num_pending(self) -> int:
        return int(self.pending.parents.shape[1])

    # ---- scoring --------------------------------------------------------------------------------------
    def score(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None,
              request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        """Logits [B, T, V] (float32) after every node of one draft tree (node 0 = each row's root,
        `parents[b, t]` < t its parent's tree index, -1 for the root) and the requested features there."""
        if self.num_pending:
            raise RuntimeError("score: commit or discard the previous tree first (one tree per step)")
        return self.feed(tokens, parents, valid, request=request)

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None, *,
             inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        """Feed M new nodes per row and return their logits [B, M, V] (float32).

        `parents[b, m]` is the pending index of node m's parent (-1 = the committed prefix); new node m
        gets pending index `num_pending + m`. Invalid nodes (`valid` False) are fed for shape's sake,
        attend only to themselves and must never become parents of valid nodes.
        """
        b, m = tokens.shape
        if parents.shape != (b, m):
            raise ValueError(f"parents: expected shape {(b, m)}, got {tuple(parents.shape)}")
        if b != self.batch_size:
            raise ValueError(f"tokens: batch {b} does not match the {self.batch_size} active rows")
        tokens, parents = tokens.to(self.device), parents.to(self.device)
        valid = torch.ones(b, m, dtype=torch.bool, device=self.device) if valid is None else valid.to(self.device)
        p0 = self.num_pending
        # ancestry and positions of the new nodes (parents precede children)
        anc = torch.zeros(b, p0 + m, p0 + m, dtype=torch.bool, device=self.device)
        anc[:, :p0, :p0] = self.pending.ancestors
        pos = torch.cat([self.pending.positions, torch.zeros(b, m, dtype=torch.long, device=self.device)], 1)
        own_len = self.length - self.start_col
        if (parents >= p0 + torch.arange(m, device=self.device)).any():
            raise ValueError("parents: a node's parent must be fed before it")
        has_parent = (parents >= 0) & valid
        kept_parents = torch.cat([self.pending.parents, torch.where(has_parent, parents, -1)], 1)
        from_earlier = bool((parents < p0).all())
        if m and from_earlier:
            # every parent was fed by an earlier call (e.g. a tree's next depth): one gather for all nodes
            pidx = parents.clamp(min=0)
            anc[:, p0:] = anc.gather(1, pidx[..., None].expand(-1, -1, p0 + m)) & has_parent[..., None]
            anc[:, p0:, p0:] |= torch.eye(m, dtype=torch.bool, device=self.device)
            pos[:, p0:] = torch.where(has_parent, pos.gather(1, pidx) + 1, own_len[:, None])
        elif m:  # some parents are among the new nodes: the pending forest's ancestry from scratch
            anc = ancestor_mask_from_parents(kept_parents)
            pos = own_len[:, None] + anc.sum(dim=-1) - 1  # a pending root sits at the row's length
        new_anc = anc[:, p0:]  # [B, M, P0+M]
        # the committed columns this call reads (an engine with an attention window skips the oldest)
        cols = torch.arange(self._first_read_column(), self.width, device=self.device)
        prefix = (cols[None, :] >= self.start_col[:, None]) & (cols[None, :] < self.length[:, None])
        prefix = prefix[:, None, :] & valid[:, :, None]  # [B, M, W]
        allowed = torch.cat([prefix, new_anc], dim=2)
        new_pos = pos[:, p0:]
        key_pos = torch.cat([(cols[None, :] - self.start_col[:, None]).expand(b, -1), pos], dim=1)
        masks = self._layer_masks(allowed, new_pos[:, :, None] - key_pos[:, None, :],
                                  unwindowed=self.feed_unwindowed(allowed, cols, p0))
        cache_position = torch.arange(self.width + p0, self.width + p0 + m, device=self.device)
        if self._ntk is not None:
            self._ntk.cover_columns(self.width + p0 + m)
        inputs = dict(input_ids=tokens) if inputs_embeds is None else dict(inputs_embeds=inputs_embeds.to(self.device))
        logits, features = self.score_forward(inputs, masks, self.node_positions(new_pos), cache_position, request,
                                       torch.where(valid, parents, -1))
        self.pending = PendingNodes(kept_parents, pos, anc)
        return TargetOutput(logits, features)

    def node_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The position ids the model reads for nodes at `positions` [B, M] (each row's own token count:
        committed tokens + depth). Adapters whose model numbers positions otherwise (e.g. Qwen2-VL's 3-axis
        rotary positions after an image) map them here."""
        return positions

    def feed_unwindowed(self, allowed: torch.Tensor, cols: torch.Tensor, p0: int) -> torch.Tensor | None:
        """Pairs of a feed's mask [B, M, W + P0 + M] that sliding windows do not cut (see `_layer_masks`): none,
        unless the model attends otherwise (a prefix LM's last prompt token, fed as the first root)."""
        return None

    def _first_read_column(self) -> int:
        """The first cache column the next scoring call attends to; masks start there (all: 0)."""
        return 0

    def score_forward(self, inputs: dict, masks, positions: torch.Tensor, cache_position: torch.Tensor,
               request: FeatureRequest, parents: torch.Tensor) -> tuple[torch.Tensor, Features | None]:
        """Run the model over the new nodes (their K/V appended to the cache after `width`): float32 logits
        and, if asked, final hidden states. `parents`: pending parent indices, -1 for roots and invalid
        nodes (adapters that mix attention with recurrent layers need the tree itself)."""
        with self._rotating():
            out, features = self.run_forward(request, attention_mask=masks, position_ids=positions,
                                      cache_position=cache_position, **inputs)
        return out.logits.float(), features

    def _layer_masks(self, allowed: torch.Tensor, distance: torch.Tensor, unwindowed: torch.Tensor | None = None
                     ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive float masks [B, 1, Q, K]: one when every layer attends alike, else a dict per layer type.
        `unwindowed`: pairs every layer attends, sliding or not (a model's bidirectional blocks)."""
        neg = torch.finfo(self.dtype).min
        if unwindowed is not None:
            allowed_sliding_extra, allowed = unwindowed, allowed | unwindowed
        if self.sliding_window is not None:
            allowed_sliding = allowed & (distance < self.sliding_window)
            if unwindowed is not None:
                allowed_sliding = allowed_sliding | allowed_sliding_extra
            sliding = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~allowed_sliding, neg)[:, None]
            if set(self.layer_types) == {"sliding_attention"}:
                return sliding
        full = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(~allowed, neg)[:, None]
        if self.sliding_window is None:
            return full
        return {t: (sliding if t == "sliding_attention" else full) for t in set(self.layer_types)}

    # ---- commit / rollback ----------------------------------------------------------------------------
    # `commit` takes the kept counts as the host read them (no read of its own)
    accepts_host_counts = True

    @torch.no_grad()
    def commit(self, path: torch.Tensor, counts: Sequence[int] | None = None) -> None:
        """Keep the pending nodes `path[b, :]` (pending indices in order, -1 padded) of each row as
        committed tokens, drop every other pending node. `counts[b]`: how many entries row b keeps, when the
        caller has read them on the host already (then this commit reads nothing back from the device)."""
        b = self.batch_size
        path = path.to(self.device)
        if path.dim() != 2 or path.shape[0] != b:
            raise ValueError(f"path: expected [{b}, A], got shape {tuple(path.shape)}")
        if counts is not None and len(counts) != b:
            raise ValueError(f"counts: expected {b} entries, got {len(counts)}")
        # left-pack the kept entries so that row b's j-th kept node lands at length[b] + j
        order = torch.sort((path < 0).to(torch.int8), dim=1, stable=True).indices
        path = path.gather(1, order)
        kept = (path >= 0).sum(dim=1)
        if counts is None:
            counts = kept.tolist()
        elif self.device.type not in DEFERRED_DEVICE_TYPES and kept.tolist() != list(counts):
            raise ValueError(f"counts: {list(counts)} do not match the path's kept entries {kept.tolist()}")
        a = max(counts, default=0)
        path = path[:, :a]
        if a and self.cache is not None and self.num_pending:
            rows = torch.arange(b, device=self.device)[:, None].expand(b, a)
            dest = self.length[:, None] + torch.arange(a, device=self.device)[None, :]
            keep = path >= 0
            # padded slots copy their own (stale, past the new length) column onto itself; they must
            # not share a destination with a real entry, or index_put may keep the wrong write
            src = torch.where(keep, self.width + path, dest)
            self._move_columns(rows, dest, src)
        self.length = self.length + kept
        self.host_length = [n + c for n, c in zip(self.host_length, counts)]
        self.width = max(self.host_length, default=0)
        self._crop(self.width)
        self._reset_pending(b)
        if self._ntk is not None:
            self._ntk.committed(self.width)

    def _move_columns(self, rows: torch.Tensor, dest: torch.Tensor, src: torch.Tensor) -> None:
        """Copy each layer's K/V cache column `src[b, j]` of row `rows[b, j]` to column `dest[b, j]`."""
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t[rows, :, dest] = t[rows, :, src]

    def checkpoint(self) -> tuple:
        """The committed lengths: columns below them are never written again, so going back is a crop."""
        if self.num_pending:
            raise RuntimeError("checkpoint: commit or discard pending nodes first")
        return self.start_col.clone(), self.length.clone(), self.width

    def rollback(self, state: tuple) -> None:
        start_col, length, width = state
        if length.shape != self.length.shape or not torch.equal(start_col, self.start_col):
            raise ValueError("state: a checkpoint from another batch (rows were selected since)")
        if bool((length > self.length).any()):
            raise ValueError("state: a checkpoint from later than the current state")
        self.length, self.width = length.clone(), width
        self.host_length = self.length.tolist()
        self._crop(width)
        self._reset_pending(self.batch_size)

    def discard(self) -> None:
        """Drop all pending nodes (nothing committed)."""
        self._crop(self.width)
        self._reset_pending(self.batch_size)

    def _crop(self, width: int) -> None:
        if self.cache is None:
            return
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel() and layer.keys.shape[-2] > width:
                layer.keys = layer.keys[:, :, :width]
                layer.values = layer.values[:, :, :width]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current batch), e.g. after some rows finished."""
        rows = rows.to(self.device)
        if self.num_pending:
            raise RuntimeError("select: commit or discard pending nodes first")
        self.start_col, self.length = self.start_col[rows], self.length[rows]
        if self.cache is not None:
            for layer in self.cache.layers:
                if getattr(layer, "keys", None) is not None and layer.keys.numel():
                    layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        # the kept rows may all be shorter than the old width: trim the common dead columns
        lead = int(self.start_col.min()) if len(rows) else 0
        if lead and self.cache is not None:
            for layer in self.cache.layers:
                if getattr(layer, "keys", None) is not None and layer.keys.numel():
                    layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
            self.start_col, self.length = self.start_col - lead, self.length - lead
        if self._ntk is not None:
            self._ntk.select(rows, lead)
        self.host_length = self.length.tolist()
        self.width = max(self.host_length, default=0)
        self._crop(self.width)
        self._reset_pending(len(rows))
