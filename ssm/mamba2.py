"""`transformers`' Mamba-2 as a speculative target: a whole draft tree per forward, state commit after.

The prompt is prefilled by the model itself (its chunked scan); afterwards this adapter owns, per layer,
the conv state [B, C, K] (last K pre-conv inputs) and the SSM state [B, H, P, N] of every row. A step
feeds the full tree [root, drafts]; every node is computed as if its root path were decoded alone
(`tree_scan`); nothing is written until `commit`, which sets each row's states to those after its last
accepted node: the SSM state in closed form over the accepted path (one small product per layer, no
per-node state copies), the conv state from that node's conv window. Rows are independent, so ragged
batches need no padding logic beyond the prefill's attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from multispec.tree import ancestor_mask_from_parents

from .kernels import tree_conv1d_dispatch, tree_ssd_dispatch
from .tree_scan import tree_conv_windows, tree_state


def is_mamba2(model: object) -> bool:
    return isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) == "mamba2"


@dataclass
class _LayerStep:
    """What a tree forward keeps per layer for the commit."""

    xbc: torch.Tensor  # [B, T, C] pre-conv inputs (the conv state after a node is its conv window)
    x: torch.Tensor  # [B, T, H, P]
    dt: torch.Tensor  # [B, T, H] discretised step
    B: torch.Tensor  # [B, T, G, N]


class Mamba2Target:
    """Prefill / score a tree / commit adapter for `Mamba2ForCausalLM` (pure PyTorch on any device)."""

    def __init__(self, model: PreTrainedModel):
        if not is_mamba2(model):
            raise TypeError(f"model: expected a transformers Mamba2ForCausalLM, got {type(model).__name__}")
        if model.get_output_embeddings() is None:
            raise TypeError(f"model: {type(model).__name__} has no language-model head")
        self.model = model.eval()
        self.backbone = model.backbone
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.conv: list[torch.Tensor] = []
        self.ssm: list[torch.Tensor] = []
        self._step: list[_LayerStep] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.conv[0].shape[0]) if self.conv else 0

    @property
    def num_pending(self) -> int:
        return 0 if self._step is None else int(self._step[0].x.shape[1])

    # ---- lifecycle ----------------------------------------------------------------------------------
    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_hidden_states: bool = False):
        """Prefill all prompt tokens but the last (the first root); return the roots [B]."""
        if output_hidden_states:
            raise ValueError("output_hidden_states: feature-level drafters are not supported for SSM targets yet")
        b, length = input_ids.shape
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        cfg = self.model.config
        layers = self.backbone.layers
        mixer = layers[0].mixer
        self.conv = [torch.zeros(b, mixer.conv_dim, cfg.conv_kernel, dtype=self.dtype, device=self.device)
                     for _ in layers]
        self.ssm = [torch.zeros(b, mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, dtype=torch.float32,
                                device=self.device) for _ in layers]
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
            raise ValueError("output_hidden_states: feature-level drafters are not supported for SSM targets yet")
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

    def _mixer(self, mixer, h: torch.Tensor, layer: int, parents: torch.Tensor, ancestors: torch.Tensor):
        b, t, _ = h.shape
        dtype = h.dtype
        proj = mixer.in_proj(h)
        gate, xbc, dt = proj.split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
        conv = mixer.act(tree_conv1d_dispatch(xbc, self.conv[layer], parents, mixer.conv1d.weight.squeeze(1),
                                              mixer.conv1d.bias)).to(dtype)
        gn = mixer.n_groups * mixer.ssm_state_size
        x, B, C = conv.split([mixer.intermediate_size, gn, gn], dim=-1)
        dt = F.softplus(dt + mixer.dt_bias)
        lo, hi = mixer.time_step_limit
        dt = dt.clamp(min=lo, max=hi)
        A = -torch.exp(mixer.A_log.float())
        x = x.reshape(b, t, mixer.num_heads, mixer.head_dim)
        B = B.reshape(b, t, mixer.n_groups, mixer.ssm_state_size)
        C = C.reshape(b, t, mixer.n_groups, mixer.ssm_state_size)
        y = tree_ssd_dispatch(x, dt, A, B, C, mixer.D, ancestors, self.ssm[layer])
        y = mixer.norm(y.reshape(b, t, -1).to(dtype), gate)
        return mixer.out_proj(y.to(dtype)), _LayerStep(xbc, x, dt, B)

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
        t = self._step[0].x.shape[1]
        on_path = torch.zeros(b, t + 1, dtype=torch.bool, device=self.device)
        on_path.scatter_(1, torch.where(path >= 0, path, t), True)
        on_path = on_path[:, :t]
        has = on_path.any(dim=1)
        last = torch.where(path >= 0, path, -1).amax(dim=1).clamp(min=0)  # topological: the deepest node
        rows = torch.arange(b, device=self.device)
        for i, s in enumerate(self._step):
            new_ssm = tree_state(s.x, s.dt, -torch.exp(self.backbone.layers[i].mixer.A_log.float()), s.B, on_path,
                                 self.ssm[i])
            window = tree_conv_windows(s.xbc, self.conv[i], self._parents)[rows, last]
            self.ssm[i] = torch.where(has[:, None, None, None], new_ssm, self.ssm[i])
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
