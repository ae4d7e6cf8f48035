"""`transformers`' Mamba (Mamba-1) as a speculative target.

Mamba-1's decay exp(dt * A) differs per channel and state entry, so the SSD matrix form (a scalar decay
per head) does not apply. The tree is scanned node by node in topological order, each node stepping
from its parent's state: T small recurrent steps per layer, chains and trees alike. Those per-node
states are the forward's own by-product, so the commit simply keeps the accepted node's state: no
replay, and the extra memory is T states per layer only until the commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kernels import tree_conv1d_dispatch
from .targets import SSMTarget


def tree_selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                        D: torch.Tensor | None, parents: torch.Tensor,
                        initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-1 over a tree: x, dt [B, T, D] (dt softplus-ed), A [D, N], B, C [B, T, N], parents [B, T]
    (tree indices in topological order, -1 = from `initial_state` [B, D, N]). Returns y [B, T, D] (before
    the gate) and every node's state [B, T, D, N] (float32)."""
    b, t, d = x.shape
    rows = torch.arange(b, device=x.device)
    states = torch.empty(b, t, d, A.shape[1], dtype=torch.float32, device=x.device)
    ys = []
    for i in range(t):
        par = parents[:, i]
        prev = torch.where((par >= 0)[:, None, None], states[rows, par.clamp(min=0)], initial_state.float())
        step = dt[:, i].float()[..., None]
        h = torch.exp(step * A.float()) * prev + step * B[:, i].float()[:, None, :] * x[:, i].float()[..., None]
        states[:, i] = h
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, i].float()))
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(b, 0, d, dtype=torch.float32)
    if D is not None:
        y = y + D.float() * x.float()
    return y, states


def mamba1_tree_mix(mixer, h: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor, parents: torch.Tensor,
                    sources: torch.Tensor, normed=None) -> tuple[torch.Tensor, "_MambaStep"]:
    """A Mamba-1 mixer (`MambaMixer` or a hybrid's of the same parameter names, e.g. Jamba's) over the tree's
    nodes from the committed states: (output [B, T, hidden], the step the commit reads). `normed(mixer, dt, B,
    C)`: the mixer's norms on the input-dependent time step, B and C (FalconMamba, Jamba), if any."""
    dtype = h.dtype
    xbc, gate = mixer.in_proj(h).chunk(2, dim=-1)
    x = mixer.act(tree_conv1d_dispatch(xbc, conv_state, parents, mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias,
                                       sources=sources)).to(dtype)
    step, B, C = torch.split(mixer.x_proj(x), [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size],
                             dim=-1)
    if normed is not None:
        step, B, C = normed(mixer, step, B, C)
    dt = F.softplus(mixer.dt_proj(step).float())
    A = -torch.exp(mixer.A_log.float())
    y, states = tree_selective_scan(x, dt, A, B, C, mixer.D, parents, ssm_state)
    y = y * mixer.act(gate.float())
    return mixer.out_proj(y.to(dtype)), _MambaStep(xbc, states)


@dataclass
class _MambaStep:
    xbc: torch.Tensor  # [B, T, D] pre-conv inputs
    states: torch.Tensor  # [B, T, D, N] state after each node


class MambaTarget(SSMTarget):
    """Target adapter for `MambaForCausalLM` (chains and trees)."""

    model_type = "mamba"

    def _ssm_state_shape(self, mixer) -> tuple[int, ...]:
        return (mixer.intermediate_size, mixer.ssm_state_size)

    def _mixer(self, mixer, h, layer, parents, ancestors):
        return mamba1_tree_mix(mixer, h, self.conv[layer], self.ssm[layer], parents, self._sources, self._normed)

    def _normed(self, mixer, step: torch.Tensor, B: torch.Tensor, C: torch.Tensor):
        """The time step, B and C as the mixer uses them (Mamba: as projected)."""
        return step, B, C

    def _committed_state(self, layer, saved, on_path, last):
        return saved.states[torch.arange(saved.states.shape[0], device=last.device), last]


class FalconMambaTarget(MambaTarget):
    """Target adapter for `FalconMambaForCausalLM`: Mamba-1 with weightless RMS norms on the time step, B and
    C after the input-dependent projection."""

    model_type = "falcon_mamba"

    def _normed(self, mixer, step: torch.Tensor, B: torch.Tensor, C: torch.Tensor):
        return mixer.dt_layernorm(step), mixer.b_layernorm(B), mixer.c_layernorm(C)
