"""Dynamic NTK RoPE, token by token as `generate` rotates it.

`transformers`' dynamic rotary embedding keeps a state (its frequencies and the longest sequence it has seen,
`max_seq_len_cached`) and updates it before each forward from the call's longest position: it grows the
frequencies to the call's length ("growth") or restores the original ones when a call is shorter than the
original context again ("reset"), and rotates every token of the call with the one result. `generate` calls it
once for the prompt and then once per token, so the prompt is rotated with the frequencies of the prompt's
length and each new token with those of its own length: the token at column c of the left-padded batch (the
longest prompt's row sets the call's length) gets the frequencies of length max(S, c + 1), S the state after
the prompt. A verification pass of k + 1 nodes would make the module grow to its deepest node for all of them,
and the committed keys would differ from `generate`'s cache.

`DynamicNTK` gives each token its own frequencies instead: the prompt's update runs as `generate`'s does (the
module's own code, once, at the prompt's length), then every forward of the adapter rotates token (b, t) at
position p with

    inv(b, t) = table[L] if L > S else inv_S,   L = p + offset[b] + 1,

`offset[b]` the row's distance from the longest prompt, `inv_S` the frequencies after the prompt, and
`table[L]` the module's own growth function evaluated at L exactly as its update evaluates it (one 0-d call per
length: the vectorised formula differs from it in the last bit). After each commit the module's state is what
`generate` leaves after writing as many tokens, so a later `generate` (or prefill) starts where it would.
The same tensor rule runs inside the fixed-shape step (`static_hf`), whose graphs read the state as inputs.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

try:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
except ImportError:  # pragma: no cover - every supported transformers has it
    ROPE_INIT_FUNCTIONS = {}


def dynamic_rotary(model: PreTrainedModel) -> torch.nn.Module | None:
    """The model's one dynamic-NTK rotary embedding module, or None; ValueError naming what cannot be made exact."""
    typed = [m for m in model.modules() if isinstance(getattr(m, "rope_type", None), dict)
             and any("dynamic" in str(v) for v in m.rope_type.values())]
    if typed:
        raise ValueError(f"{type(model).__name__}: rope_type 'dynamic' per layer type (one state per type) is not "
                         f"served losslessly: its tokens cannot be rotated as `generate` rotates them")
    found = [m for m in model.modules() if getattr(m, "rope_type", None) == "dynamic"]
    if len(found) > 1:
        raise ValueError(f"{type(model).__name__}: {len(found)} dynamic rotary embeddings (one state each) are not "
                         f"served losslessly")
    return found[0] if found else None


# the growth function's values by module and device: they depend on the config alone, so they outlive a generation
_TABLES: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
_CHUNK = 256  # lengths filled at a time: the growth function copies host numbers in, so it runs between steps


class DynamicNTK:
    """One dynamic rotary embedding's frequencies per token (see the module docstring). Lifecycle: `start` at the
    prefill, `rotating` around every forward (after `cover`), `committed` after every commit, `select` with the
    rows."""

    def __init__(self, rotary: torch.nn.Module, name: str = "target"):
        self.rotary = rotary
        self.original = int(rotary.original_max_seq_len)
        self.growth = ROPE_INIT_FUNCTIONS.get("dynamic")
        if self.growth is None:
            raise ValueError(f"{name}: this transformers has no dynamic NTK growth function to follow")
        self.device = rotary.inv_freq.device
        self.longest = torch.full((), self.original, dtype=torch.long, device=self.device)  # S, after the prompt
        self.inv = rotary.inv_freq.detach().float()  # inv_S
        self.offset = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] distance from the longest prompt
        self.host_offset: list[int] = []
        self.host_longest = self.original
        self.base = 0  # a cache column c holds a token of length c + 1 + base (the prompt's common padding, < 0)
        self.host_longest_fed = 0  # the longest length (as `generate` counts it) a cached token has
        self._entry = self._shared(_CHUNK)
        self._check_forward(name)

    # ---- the growth table ---------------------------------------------------------------------------------
    def _shared(self, rows: int, fixed: bool = False) -> dict:
        """The table entry for this module and device, with room for `rows` lengths (allocated once when
        `fixed`: a captured graph reads the table's address)."""
        per_device = _TABLES.setdefault(self.rotary, {})
        entry = per_device.get(self.device)
        if entry is None or entry["table"].shape[0] < rows or (fixed and not entry["fixed"]):
            size = max(rows, 0 if entry is None else entry["table"].shape[0])
            table = self.rotary.original_inv_freq.to(self.device).float()[None].repeat(size, 1)
            filled = 0 if entry is None else entry["filled"]
            if entry is not None:
                table[: entry["table"].shape[0]] = entry["table"]
            entry = per_device[self.device] = {"table": table, "filled": filled, "fixed": fixed}
        return entry

    def reserve(self, rows: int) -> None:
        """A table of `rows` lengths allocated now and never again (a fixed-shape engine's graphs read it)."""
        self._entry = self._shared(rows, fixed=True)

    @property
    def table(self) -> torch.Tensor:
        """[N, dim / 2] float32: row L holds the frequencies of length L (rows up to the original context unused)."""
        return self._entry["table"]

    def cover(self, length: int) -> None:
        """Fill the table for every length up to `length` (host arithmetic: the caller bounds it, nothing is
        read), a chunk at a time; a fixed table is filled whole at once."""
        entry = self._entry
        if entry["filled"] > length:
            return
        rows = entry["table"].shape[0]
        upto = length + _CHUNK
        if entry["fixed"]:
            if rows <= length:
                raise ValueError(f"length: {length} is past the {rows} lengths this fixed-shape engine reserved for "
                                 f"its rotary table")
            upto = rows - 1
        elif rows <= upto:
            entry = self._entry = self._shared(max(upto + 1, 2 * rows))
        first = max(entry["filled"], self.original + 1)
        if first <= upto:
            entry["table"][first: upto + 1] = self._grown(first, upto)
        entry["filled"] = max(entry["filled"], upto + 1)

    def _grown(self, first: int, last: int) -> torch.Tensor:
        """[last - first + 1, dim / 2]: the module's own growth function at each length, as its update calls it (a
        0-d int64 length on the module's device). On CUDA one call over a column of lengths gives the same bits
        (an elementwise kernel computes each element alike; tests/gpu checks it); on the CPU a vector takes
        another code path than a 0-d tensor and differs in the last bit, so each length is its own call."""
        config = self.rotary.config
        if self.device.type == "cuda":
            lengths = torch.arange(first, last + 1, dtype=torch.long, device=self.device)[:, None]
            return self.growth(config, self.device, seq_len=lengths)[0]
        return torch.stack([self.growth(config, self.device, seq_len=torch.full(
            (), n, dtype=torch.long, device=self.device))[0] for n in range(first, last + 1)])

    def fill(self) -> None:
        """Fill the whole table now (a fixed-shape engine at its prefill: no growth call inside its steps)."""
        self.cover(self._entry["table"].shape[0] - 1)

    # ---- the schedule ---------------------------------------------------------------------------------------
    def start(self, attention_mask: torch.Tensor) -> None:  # [B, W] the prompt's mask, 1 = real token
        """The prompt's update, as `generate`'s prefill runs it: the module's own update at the longest prompt."""
        lengths = attention_mask.long().sum(dim=1).tolist()
        longest_prompt = max(lengths, default=1)
        probe = torch.zeros(1, 1, dtype=torch.float32, device=self.device)
        self.rotary(probe, torch.full((1, 1), max(longest_prompt - 1, 0), dtype=torch.long, device=self.device))
        cached = self.rotary.max_seq_len_cached
        self.host_longest = int(cached.item() if isinstance(cached, torch.Tensor) else cached)
        self.longest = torch.full((), self.host_longest, dtype=torch.long, device=self.device)
        self.inv = self.rotary.inv_freq.detach().float().clone()
        self.host_offset = [longest_prompt - n for n in lengths]
        self.offset = torch.tensor(self.host_offset, dtype=torch.long, device=self.device)
        self.base = longest_prompt - int(attention_mask.shape[1])
        self.host_longest_fed = self.host_longest

    def select(self, rows: torch.Tensor, lead: int) -> None:
        """Keep `rows`; `lead` dead columns were trimmed off the front of the cache."""
        self.host_offset = [self.host_offset[i] for i in rows.tolist()]
        self.offset = self.offset[rows.to(self.device)]
        self.base += lead

    def cover_columns(self, columns: int) -> None:
        """Fill the table for every token a forward writing cache columns below `columns` can hold."""
        self.cover(columns + self.base + max(self.host_offset, default=0) + 1)

    def committed(self, width: int) -> None:
        """After a commit (`width`: the longest row's cached columns), the module's state becomes `generate`'s after
        as many tokens: the longest length fed so far when past the prompt's state, else the prompt's state."""
        self.host_longest_fed = max(self.host_longest_fed, width + self.base)
        if self.host_longest_fed > self.host_longest:
            self.cover(self.host_longest_fed)
            inv = self.table[self.host_longest_fed].clone()
        else:
            inv = self.inv.clone()
        self.rotary.register_buffer("inv_freq", inv.to(self.rotary.inv_freq.dtype), persistent=False)
        self.rotary.max_seq_len_cached = self.host_longest_fed

    @staticmethod
    def frequencies(position_ids: torch.Tensor, offset: torch.Tensor, longest: torch.Tensor | int,
                    inv: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """[B, T, dim / 2] each token's inverse frequencies: `table[L]` past the prompt's state `longest`, else
        `inv`, L = position + offset + 1 (tensors only: the fixed-shape step runs it inside a graph)."""
        length = position_ids + offset[:, None] + 1
        grown = table[length.clamp(min=0, max=table.shape[0] - 1)]
        return torch.where((length > longest)[..., None], grown, inv.float())

    def cos_sin(self, x: torch.Tensor, position_ids: torch.Tensor, inv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The module's forward with per-token frequencies `inv` [B, T, dim / 2] (its float32 arithmetic)."""
        with torch.autocast(device_type=x.device.type if x.device.type != "mps" else "cpu", enabled=False):
            freqs = inv * position_ids[..., None].float()
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.rotary.attention_scaling
            sin = emb.sin() * self.rotary.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)

    @contextmanager
    def rotating(self) -> Iterator[None]:
        """Within the block the module rotates each token with its own frequencies (from `offset`, `longest`, `inv`
        and the table as they are when it runs: a fixed-shape step swaps its graph's inputs in) and keeps its
        state."""

        def forward(x, position_ids, **kwargs):
            if position_ids.dim() != 2:
                raise ValueError(f"position_ids: dynamic NTK RoPE is served for [B, T] positions, got "
                                 f"{tuple(position_ids.shape)}")
            inv = self.frequencies(position_ids, self.offset, self.longest, self.inv, self.table)
            return self.cos_sin(x, position_ids, inv)

        self.rotary.forward = forward
        try:
            yield
        finally:
            del self.rotary.forward

    def _check_forward(self, name: str) -> None:
        """Refuse a rotary module whose own forward this schedule does not reproduce bit for bit (a class that
        lays out cos/sin otherwise): compared at one length on a few positions, state kept."""
        rotary = self.rotary
        kept = (rotary.inv_freq, rotary.max_seq_len_cached)
        try:
            x = torch.zeros(1, 1, dtype=torch.float32, device=self.device)
            pos = torch.tensor([[0, 1, 5, 7]], device=self.device)
            want = rotary(x, pos)  # below the original context: the current frequencies, no growth
            got = self.cos_sin(x, pos, rotary.inv_freq.float()[None, None].expand(1, 4, -1))
        finally:
            rotary.register_buffer("inv_freq", kept[0], persistent=False)
            rotary.max_seq_len_cached = kept[1]
        if not (isinstance(want, tuple) and len(want) == 2 and all(
                w.shape == g.shape and torch.equal(w, g) for w, g in zip(want, got))):
            raise ValueError(f"{name}: {type(rotary).__name__} (dynamic NTK RoPE) computes its rotation otherwise than "
                             f"the Llama layout multispec rotates per token; it cannot be served losslessly")


__all__ = ["DynamicNTK", "dynamic_rotary"]
