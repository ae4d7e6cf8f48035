"""`transformers`' Mamba-2 as a speculative target (STree): every tree node in one SSD pass, with the
causal mask replaced by the tree's ancestor mask (`tree_scan.tree_ssd`), and the committed SSM state in
closed form over the accepted path (`tree_scan.tree_state`: one (P x T)(T x N) product per head, no
per-node state copies and no replay)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kernels import tree_conv1d_dispatch, tree_ssd_dispatch
from .target import SSMTarget
from .tree_scan import tree_state


@dataclass
class _Mamba2Step:
    xbc: torch.Tensor  # [B, T, C] pre-conv inputs
    x: torch.Tensor  # [B, T, H, P]
    dt: torch.Tensor  # [B, T, H] discretised step
    B: torch.Tensor  # [B, T, G, N]


def mamba2_tree_mix(mixer, h: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor,
                    parents: torch.Tensor, ancestors: torch.Tensor,
                    sources: torch.Tensor | None = None) -> tuple[torch.Tensor, _Mamba2Step]:
    """A Mamba-2 mixer (`transformers`' Mamba2Mixer, or a hybrid's, e.g. BambaMixer: same parameter names)
    over a whole tree: output [B, T, hidden] of every node as if its path were decoded alone, and what the
    commit needs. `sources`: the tree's conv sources (`tree_scan.conv_sources`), shared by all layers."""
    b, t, _ = h.shape
    dtype = h.dtype
    gate, xbc, dt = mixer.in_proj(h).split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
    conv = mixer.act(tree_conv1d_dispatch(xbc, conv_state, parents, mixer.conv1d.weight.squeeze(1),
                                          mixer.conv1d.bias, sources=sources)).to(dtype)
    gn = mixer.n_groups * mixer.ssm_state_size
    x, B, C = conv.split([mixer.intermediate_size, gn, gn], dim=-1)
    lo, hi = mixer.time_step_limit
    dt = F.softplus(dt + mixer.dt_bias).clamp(min=lo, max=hi)
    A = -torch.exp(mixer.A_log.float())
    x = x.reshape(b, t, mixer.num_heads, mixer.head_dim)
    B = B.reshape(b, t, mixer.n_groups, mixer.ssm_state_size)
    C = C.reshape(b, t, mixer.n_groups, mixer.ssm_state_size)
    y = tree_ssd_dispatch(x, dt, A, B, C, mixer.D, ancestors, ssm_state)
    y = mixer.norm(y.reshape(b, t, -1).to(dtype), gate)
    return mixer.out_proj(y.to(dtype)), _Mamba2Step(xbc, x, dt, B)


def mamba2_committed_state(mixer, step: _Mamba2Step, on_path: torch.Tensor, ssm_state: torch.Tensor) -> torch.Tensor:
    """The SSM state after the accepted nodes (`on_path` [B, T]), in closed form."""
    return tree_state(step.x, step.dt, -torch.exp(mixer.A_log.float()), step.B, on_path, ssm_state)


class Mamba2Target(SSMTarget):
    """Target adapter for `Mamba2ForCausalLM`."""

    model_type = "mamba2"

    def _ssm_state_shape(self, mixer) -> tuple[int, ...]:
        return (mixer.num_heads, mixer.head_dim, mixer.ssm_state_size)

    def _mixer(self, mixer, h, layer, parents, ancestors):
        return mamba2_tree_mix(mixer, h, self.conv[layer], self.ssm[layer], parents, ancestors, self._sources)

    def _committed_state(self, layer, saved, on_path, last):
        return mamba2_committed_state(self.backbone.layers[layer].mixer, saved, on_path, self.ssm[layer])
