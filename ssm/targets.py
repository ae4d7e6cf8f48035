"""The shared target adapter for `transformers` state-space LMs: a whole draft tree per forward, a state
commit after verification.

The prompt is prefilled by the model itself (its own scan); afterwards the adapter owns, per layer, the
conv state [B, C, K] (the last K pre-conv inputs) and the SSM state of every row. A step feeds the full
tree [root, drafts]; each mixer computes every node as if its root path were decoded alone; nothing is
written until `commit`, which moves each row's states past its last accepted node (the conv state is
that node's conv window; the SSM state comes from the mixer family's `_committed_state`). Rows are
independent, so ragged batches need nothing beyond the prefill's attention mask. Subclasses supply the
mixer: `Mamba2Target` (SSD tree scan), `MambaTarget` (Mamba-1, per-node selective scan).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from multispec.plugin import (FeatureRequest, Features, NO_FEATURES, PrefillOutput, Prompt, Target, TargetOutput,
                              ancestor_mask_from_parents, require_version)

from .tree_scan import conv_sources, gather_windows
from .versions import SSM_TRANSFORMERS


def mamba_ssm_prefill(device: torch.device) -> bool:
    """Whether the model's own prefill is the fast one: on CUDA with `mamba_ssm` importable,
    `transformers` runs its fused chunked-scan kernels (untested here: no GPU); elsewhere ours wins."""
    return device.type == "cuda" and importlib.util.find_spec("mamba_ssm") is not None


def rms_norm(norm, hidden: torch.Tensor) -> torch.Tensor:
    """`Mamba2RMSNorm` / `MambaRMSNorm` (float32 statistics, weight times the input-dtype result) as one
    fused op."""
    return norm.weight * F.rms_norm(hidden.float(), (hidden.shape[-1],), eps=norm.variance_epsilon).to(hidden.dtype)


def accepted_nodes(path: torch.Tensor, batch: int, t: int,
                   checked: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From accepted paths [B, A] (tree indices, -1 padded) over a T-node tree: the on-path mask [B, T],
    whether a row accepted anything [B], and its last (deepest) accepted node [B] (0 where none).
    `checked=False` skips the range check, a host read (for a caller whose path is in range)."""
    if path.dim() != 2 or path.shape[0] != batch:
        raise ValueError(f"path: expected [{batch}, A], got shape {tuple(path.shape)}")
    if not checked:  # an out-of-range index drops out rather than indexing past the tree
        path = torch.where(path < t, path, -1)
    elif (path >= t).any():
        raise ValueError(f"path: node index out of range for a {t}-node tree")
    on_path = torch.zeros(batch, t + 1, dtype=torch.bool, device=path.device)
    on_path.scatter_(1, torch.where(path >= 0, path, t), True)
    on_path = on_path[:, :t]
    last = torch.where(path >= 0, path, -1).amax(dim=1).clamp(min=0)  # topological order: the deepest
    return on_path, on_path.any(dim=1), last


def commit_layer_states(conv: torch.Tensor, ssm: torch.Tensor, new_ssm: torch.Tensor, xbc: torch.Tensor,
                        sources: torch.Tensor, has: torch.Tensor, last: torch.Tensor):
    """One layer's (conv state, SSM state) after the accepted nodes: the conv state becomes the last
    accepted node's conv window (`sources`: the tree's `conv_sources`), the SSM state `new_ssm`; rows that
    accepted nothing keep theirs."""
    rows = torch.arange(conv.shape[0], device=conv.device)
    window = gather_windows(xbc, conv, sources[rows, last][:, None])[:, 0]
    shape = (-1,) + (1,) * (new_ssm.dim() - 1)
    return (torch.where(has[:, None, None], window.to(conv.dtype), conv),
            torch.where(has.view(shape), new_ssm, ssm))


class SSMTarget(Target):
    """Prefill / score a tree / commit over a `transformers` *ForCausalLM whose blocks are
    `norm -> mixer -> residual` (Mamba, Mamba-2). Pure PyTorch plus `multispec.ssm.kernels`."""

    model_type = ""  # config.model_type this adapter serves
    provides = FeatureRequest(hidden=True)  # the final normed hidden state (an EAGLE head's input)
    check_paths = True  # `commit` checks the path's range (a host read; the fixed-shape step trusts the rule's)

    def __init__(self, model: PreTrainedModel, replay: bool = False):
        """`replay=True` is the baseline STree compares with ("vanilla" speculative decoding for SSMs): the
        commit forgets the verification pass and re-runs the accepted tokens from the step's initial
        states (one more pass over the layers, without the LM head) instead of using the closed form."""
        if not (isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) == self.model_type):
            raise TypeError(f"model: expected a transformers {self.model_type} causal LM, got {type(model).__name__}")
        require_version(SSM_TRANSFORMERS, "multispec.ssm")
        if model.get_output_embeddings() is None:
            raise TypeError(f"model: {type(model).__name__} has no language-model head")
        self.model = model.eval()
        self.backbone = model.backbone
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.conv: list[torch.Tensor] = []
        self.ssm: list[torch.Tensor] = []
        self.replay = bool(replay)
        self._step: list[Any] | None = None
        self._sources: torch.Tensor | None = None  # the scored tree's conv sources, shared by all layers
        self._tokens: torch.Tensor | None = None

    # ---- what a mixer family provides ------------------------------------------------------------------
    def _ssm_state_shape(self, mixer) -> tuple[int, ...]:
        raise NotImplementedError

    def _mixer(self, mixer, h: torch.Tensor, layer: int, parents: torch.Tensor, ancestors: torch.Tensor):
        """(output [B, T, hidden], what the commit needs; must hold `.xbc`, the pre-conv inputs)."""
        raise NotImplementedError

    def _committed_state(self, layer: int, saved, on_path: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # ---- lifecycle ----------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return int(self.conv[0].shape[0]) if self.conv else 0

    @property
    def num_pending(self) -> int:
        return 0 if self._step is None else int(self._step[0].xbc.shape[1])

    @torch.no_grad()
    def prefill(self, prompt: Prompt, request: FeatureRequest = NO_FEATURES) -> PrefillOutput:
        """Prefill all prompt tokens but the last (the first root)."""
        self.check_prompt(prompt)
        self.check_request(request)
        input_ids, attention_mask = prompt.input_ids, prompt.attention_mask
        b, length = input_ids.shape
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        layers = self.backbone.layers
        mixer = layers[0].mixer
        channels = mixer.conv1d.weight.shape[0]
        width = mixer.conv1d.weight.shape[-1]
        self.conv = [torch.zeros(b, channels, width, dtype=self.dtype, device=self.device) for _ in layers]
        self.ssm = [torch.zeros(b, *self._ssm_state_shape(mixer), dtype=torch.float32, device=self.device)
                    for _ in layers]
        hidden = None
        if length > 1:
            hidden = self.prefill_forward(input_ids[:, :-1], attention_mask[:, :-1])
        self._step = None
        features = None
        if request.hidden:
            width = self.model.get_output_embeddings().weight.shape[1]
            features = Features(hidden if hidden is not None else
                                torch.zeros(b, 0, width, dtype=self.dtype, device=self.device))
        return PrefillOutput(input_ids[:, -1], features)

    def prefill_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompt from zero states and keep every layer's final states (default: the model's own
        forward; mixer families may bring a faster scan); returns the final normed hidden states [B, L, H]."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
        cache = out["cache"] if "cache" in out else out.cache_params  # `cache_params` before transformers 5.24
        for i in range(len(self.backbone.layers)):
            self.conv[i] = cache.get_conv_state(i).clone()
            self.ssm[i] = cache.get_recurrent_state(i).float().clone()
        return out.last_hidden_state

    # ---- scoring --------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None,
              request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        """Logits [B, T, V] (float32) of a whole tree: node 0 is each row's root, `parents[b, t]` < t the
        tree index of node t's parent (-1 for the root). Invalid nodes are computed as roots and ignored."""
        self.check_request(request)
        if self._step is not None:
            raise RuntimeError("score: commit or discard the previous tree first (one tree per step)")
        b, t = tokens.shape
        if parents.shape != (b, t):
            raise ValueError(f"parents: expected shape {(b, t)}, got {tuple(parents.shape)}")
        if b != self.batch_size:
            raise ValueError(f"tokens: batch {b} does not match the {self.batch_size} active rows")
        tokens, parents = tokens.to(self.device), parents.to(self.device)
        valid = torch.ones(b, t, dtype=torch.bool, device=self.device) if valid is None else valid.to(self.device)
        parents = torch.where(valid, parents, -1)
        if t and (parents >= torch.arange(t, device=self.device)).any():
            raise ValueError("parents: a node's parent must come before it")
        hidden = self._layers(tokens, parents)
        self._tokens = tokens
        hidden = rms_norm(self.backbone.norm_f, hidden)
        logits = self.model.lm_head(hidden.to(self.model.lm_head.weight.dtype)).float()
        return TargetOutput(logits, Features(hidden) if request.hidden else None)

    def _layers(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Run every block over the tree; keep what the commit needs in `_step`."""
        ancestors = ancestor_mask_from_parents(parents)
        width = self.backbone.layers[0].mixer.conv1d.weight.shape[-1]
        self._sources = conv_sources(parents, width, depth=ancestors.sum(-1) - 1)
        hidden = self.backbone.embeddings(tokens)
        self._step = []
        for i, block in enumerate(self.backbone.layers):
            residual = hidden.float() if block.residual_in_fp32 else hidden
            h = rms_norm(block.norm, hidden.to(block.norm.weight.dtype))
            h, saved = self._mixer(block.mixer, h, i, parents, ancestors)
            self._step.append(saved)
            hidden = residual + h
        return hidden

    # ---- commit ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def commit(self, path: torch.Tensor) -> None:
        """Advance every row past the tree nodes `path[b]` (tree indices from the root, -1 padded): the
        row's states become those after its last accepted node."""
        if self._step is None:
            raise RuntimeError("commit: no tree was scored since the last commit")
        path = path.to(self.device)
        on_path, has, last = accepted_nodes(path, self.batch_size, self.num_pending, checked=self.check_paths)
        if self.replay:
            path, on_path, last = self._replay(path, has)
        self._commit_all(on_path, has, last)
        self._step = None

    def _commit_all(self, on_path: torch.Tensor, has: torch.Tensor, last: torch.Tensor) -> None:
        """Every layer's states after the accepted nodes (mixer families may batch this across layers)."""
        for i, saved in enumerate(self._step):
            new_ssm = self._committed_state(i, saved, on_path, last)
            self.conv[i], self.ssm[i] = commit_layer_states(self.conv[i], self.ssm[i], new_ssm, saved.xbc,
                                                            self._sources, has, last)

    def _replay(self, path: torch.Tensor, has: torch.Tensor):
        """Re-run the accepted tokens (left-packed, as a chain) from the step's initial states."""
        order = torch.sort((path < 0).to(torch.int8), dim=1, stable=True).indices
        path = path.gather(1, order)
        keep = path >= 0
        tokens = self._tokens.gather(1, path.clamp(min=0))
        a = path.shape[1]
        chain = torch.arange(-1, a - 1, device=self.device).expand(path.shape[0], a)
        self._layers(tokens, torch.where(keep, chain, -1))
        return path, keep, (keep.sum(dim=1) - 1).clamp(min=0)

    def discard(self) -> None:
        self._step = None

    def checkpoint(self) -> tuple:
        """Every layer's states (copies: a later commit must not reach them)."""
        if self._step is not None:
            raise RuntimeError("checkpoint: commit or discard the scored tree first")
        return [c.clone() for c in self.conv], [h.clone() for h in self.ssm]

    def rollback(self, state: tuple) -> None:
        conv, ssm = state
        if conv and conv[0].shape[0] != self.batch_size:
            raise ValueError("state: a checkpoint from another batch (rows were selected since)")
        self.conv, self.ssm = [c.clone() for c in conv], [h.clone() for h in ssm]
        self._step = None

    def select(self, rows: torch.Tensor) -> None:
        if self._step is not None:
            raise RuntimeError("select: commit or discard the scored tree first")
        rows = rows.to(self.device)
        self.conv = [c[rows] for c in self.conv]
        self.ssm = [s[rows] for s in self.ssm]
