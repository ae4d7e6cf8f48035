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

from typing import Any

import torch
from transformers import PreTrainedModel

from multispec.tree import ancestor_mask_from_parents

from .tree_scan import tree_conv_windows

NO_FEATURES = "output_hidden_states: feature-level drafters are not supported for SSM targets yet"


class SSMTarget:
    """Prefill / score a tree / commit over a `transformers` *ForCausalLM whose blocks are
    `norm -> mixer -> residual` (Mamba, Mamba-2). Pure PyTorch plus `multispec.ssm.kernels`."""

    model_type = ""  # config.model_type this adapter serves

    def __init__(self, model: PreTrainedModel):
        if not (isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) == self.model_type):
            raise TypeError(f"model: expected a transformers {self.model_type} causal LM, got {type(model).__name__}")
        if model.get_output_embeddings() is None:
            raise TypeError(f"model: {type(model).__name__} has no language-model head")
        self.model = model.eval()
        self.backbone = model.backbone
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.conv: list[torch.Tensor] = []
        self.ssm: list[torch.Tensor] = []
        self._step: list[Any] | None = None
        self._parents: torch.Tensor | None = None

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
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_hidden_states: bool = False):
        """Prefill all prompt tokens but the last (the first root); return the roots [B]."""
        if output_hidden_states:
            raise ValueError(NO_FEATURES)
        b, length = input_ids.shape
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        layers = self.backbone.layers
        mixer = layers[0].mixer
        channels = mixer.conv1d.weight.shape[0]
        width = mixer.conv1d.weight.shape[-1]
        self.conv = [torch.zeros(b, channels, width, dtype=self.dtype, device=self.device) for _ in layers]
        self.ssm = [torch.zeros(b, *self._ssm_state_shape(mixer), dtype=torch.float32, device=self.device)
                    for _ in layers]
        if length > 1:
            out = self.backbone(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1], use_cache=True)
            cache = out.cache_params
            for i in range(len(layers)):
                self.conv[i] = cache.get_conv_state(i).clone()
                self.ssm[i] = cache.get_recurrent_state(i).float().clone()
        self._step = None
        return input_ids[:, -1]

    # ---- scoring --------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None,
                output_hidden_states: bool = False) -> torch.Tensor:
        """Logits [B, T, V] (float32) of a whole tree: node 0 is each row's root, `parents[b, t]` < t the
        tree index of node t's parent (-1 for the root). Invalid nodes are computed as roots and ignored."""
        if output_hidden_states:
            raise ValueError(NO_FEATURES)
        if self._step is not None:
            raise RuntimeError("forward: commit or discard the previous tree first (one tree per step)")
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
        ancestors = ancestor_mask_from_parents(parents)
        self._parents = parents
        hidden = self.backbone.embeddings(tokens)
        self._step = []
        for i, block in enumerate(self.backbone.layers):
            residual = hidden.float() if block.residual_in_fp32 else hidden
            h = block.norm(hidden.to(block.norm.weight.dtype))
            h, saved = self._mixer(block.mixer, h, i, parents, ancestors)
            self._step.append(saved)
            hidden = residual + h
        hidden = self.backbone.norm_f(hidden)
        return self.model.lm_head(hidden.to(self.model.lm_head.weight.dtype)).float()

    # ---- commit ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def commit(self, path: torch.Tensor) -> None:
        """Advance every row past the tree nodes `path[b]` (tree indices from the root, -1 padded): the
        row's states become those after its last accepted node."""
        if self._step is None:
            raise RuntimeError("commit: no tree was scored since the last commit")
        path = path.to(self.device)
        b = self.batch_size
        if path.dim() != 2 or path.shape[0] != b:
            raise ValueError(f"path: expected [{b}, A], got shape {tuple(path.shape)}")
        t = self.num_pending
        on_path = torch.zeros(b, t + 1, dtype=torch.bool, device=self.device)
        on_path.scatter_(1, torch.where(path >= 0, path, t), True)
        on_path = on_path[:, :t]
        has = on_path.any(dim=1)
        last = torch.where(path >= 0, path, -1).amax(dim=1).clamp(min=0)  # topological order: the deepest
        rows = torch.arange(b, device=self.device)
        for i, saved in enumerate(self._step):
            new_ssm = self._committed_state(i, saved, on_path, last)
            window = tree_conv_windows(saved.xbc, self.conv[i], self._parents)[rows, last]
            shape = (-1,) + (1,) * (new_ssm.dim() - 1)
            self.ssm[i] = torch.where(has.view(shape), new_ssm, self.ssm[i])
            self.conv[i] = torch.where(has[:, None, None], window.to(self.conv[i].dtype), self.conv[i])
        self._step = None

    def discard(self) -> None:
        self._step = None

    def select(self, rows: torch.Tensor) -> None:
        if self._step is not None:
            raise RuntimeError("select: commit or discard the scored tree first")
        rows = rows.to(self.device)
        self.conv = [c[rows] for c in self.conv]
        self.ssm = [s[rows] for s in self.ssm]
