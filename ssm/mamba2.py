"""`transformers`' Mamba-2 as a speculative target (STree): every tree node in one SSD pass, with the
causal mask replaced by the tree's ancestor mask (`tree_scan.tree_ssd`), and the committed SSM state in
closed form over the accepted path (`tree_scan.tree_state`: one (P x T)(T x N) product per head, no
per-node state copies and no replay)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kernels import tree_conv1d_dispatch, tree_ssd_dispatch
from .targets import SSMTarget, commit_layer_states, mamba_ssm_prefill, rms_norm
from .tree_scan import chunked_ssd, tree_state


@dataclass
class Mamba2Step:
    xbc: torch.Tensor  # [B, T, C] pre-conv inputs
    x: torch.Tensor  # [B, T, H, P]
    dt: torch.Tensor  # [B, T, H] discretised step
    B: torch.Tensor  # [B, T, G, N]


@dataclass
class _Mamba2Consts:
    """What the tree mixer derives from a layer's parameters, once per parameter version."""

    A: torch.Tensor  # [H] float32, negative
    conv_weight: torch.Tensor  # [C, K]
    act: object  # the conv activation


_CONSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _consts(mixer) -> _Mamba2Consts:
    act = F.silu if getattr(mixer, "activation", None) in ("silu", "swish") else mixer.act
    if torch.compiler.is_compiling():  # traced into the graph: the cache's pointer check cannot be
        return _Mamba2Consts(-torch.exp(mixer.A_log.float()), mixer.conv1d.weight.squeeze(1), act)
    key = (mixer.A_log.data_ptr(), mixer.A_log._version, mixer.conv1d.weight._version)
    hit = _CONSTS.get(mixer)
    if hit is None or hit[0] != key:
        hit = (key, _Mamba2Consts(-torch.exp(mixer.A_log.float()), mixer.conv1d.weight.squeeze(1), act))
        _CONSTS[mixer] = hit
    return hit[1]


def _in_proj(mixer, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate, pre-conv inputs, raw dt) of every position; `F.linear`: no module-call overhead. Falcon-H1's
    mixer scales its input (`ssm_in_multiplier`) and each section of the projection (`mup_vector`)."""
    scale = getattr(mixer, "ssm_in_multiplier", 1.0)
    proj = F.linear(h * scale if scale != 1.0 else h, mixer.in_proj.weight, mixer.in_proj.bias)
    mup = getattr(mixer, "mup_vector", None)
    if mup is not None:
        proj = proj * mup.to(proj.dtype)
    return proj.split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)


def _scan_inputs(mixer, conv: torch.Tensor, dt: torch.Tensor):
    """x [B, T, H, P], dt [B, T, H] (softplus, clamped), B and C [B, T, G, N] from the activated conv."""
    b, t, _ = conv.shape
    gn = mixer.n_groups * mixer.ssm_state_size
    x, B, C = conv.split([mixer.intermediate_size, gn, gn], dim=-1)
    lo, hi = mixer.time_step_limit
    groups = (b, t, mixer.n_groups, mixer.ssm_state_size)
    return (x.reshape(b, t, mixer.num_heads, mixer.head_dim), F.softplus(dt + mixer.dt_bias).clamp(min=lo, max=hi),
            B.reshape(groups), C.reshape(groups))


def _out_proj(mixer, y: torch.Tensor, gate: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    y = y.reshape(*gate.shape[:2], -1).to(dtype)
    if getattr(mixer, "mamba_rms_norm", True) is False:  # Falcon-H1 without its norm: the gate alone
        y = y * F.silu(gate)
    elif hasattr(mixer.norm, "norm_before_gate"):  # Falcon-H1's gated norm: groups, gate before or after
        y = falcon_gated_rms_norm(mixer.norm, y, gate)
    else:
        y = gated_rms_norm(mixer.norm, y, gate)
    return F.linear(y.to(dtype), mixer.out_proj.weight, mixer.out_proj.bias)


def mamba2_tree_mix(mixer, h: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor,
                    parents: torch.Tensor, ancestors: torch.Tensor,
                    sources: torch.Tensor | None = None) -> tuple[torch.Tensor, Mamba2Step]:
    """A Mamba-2 mixer (`transformers`' Mamba2Mixer, or a hybrid's, e.g. BambaMixer: same parameter names)
    over a whole tree: output [B, T, hidden] of every node as if its path were decoded alone, and what the
    commit needs. `sources`: the tree's conv sources (`tree_scan.conv_sources`), shared by all layers."""
    k = _consts(mixer)
    gate, xbc, dt = _in_proj(mixer, h)
    conv = k.act(tree_conv1d_dispatch(xbc, conv_state, parents, k.conv_weight, mixer.conv1d.bias,
                                      sources=sources)).to(h.dtype)
    x, dt, B, C = _scan_inputs(mixer, conv, dt)
    y = tree_ssd_dispatch(x, dt, k.A, B, C, mixer.D, ancestors, ssm_state)
    return _out_proj(mixer, y, gate, h.dtype), Mamba2Step(xbc, x, dt, B)


def mamba2_prefill_mix(mixer, h: torch.Tensor, chunk: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Mamba-2 mixer over an unpadded prompt [B, L, hidden] from zero states: (output, conv state
    [B, C, K] = the last K pre-conv inputs, SSM state [B, H, P, N] float32). The causal conv is one
    `conv1d`, the scan `tree_scan.chunked_ssd`."""
    length = h.shape[1]
    k = _consts(mixer)
    width = k.conv_weight.shape[1]
    gate, xbc, dt = _in_proj(mixer, h)
    xbc_t = xbc.transpose(1, 2)  # [B, C, L]
    conv = F.conv1d(xbc_t, k.conv_weight[:, None], mixer.conv1d.bias, padding=width - 1, groups=xbc.shape[-1])
    conv = k.act(conv[..., :length].transpose(1, 2)).to(h.dtype)
    conv_state = F.pad(xbc_t, (max(0, width - length), 0))[..., -width:].contiguous()
    x, dt, B, C = _scan_inputs(mixer, conv, dt)
    y, state = chunked_ssd(x, dt, k.A, B, C, mixer.D, chunk)
    return _out_proj(mixer, y, gate, h.dtype), conv_state, state


def gated_rms_norm(norm, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`MambaRMSNormGated(y, gate)` (per-group RMS norm of y * silu(gate), times the weight) in three fused
    ops instead of the module's ten; the tree mixer runs it once per layer per step."""
    z = y.float() * F.silu(gate.float())
    groups = z.shape[-1] // norm.group_size
    z = F.rms_norm(z.view(*z.shape[:-1], groups, norm.group_size), (norm.group_size,), eps=norm.variance_epsilon)
    return norm.weight * z.view_as(y).to(y.dtype)


def falcon_gated_rms_norm(norm, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`FalconH1RMSNormGated(y, gate)`: a per-group RMS norm (`n_groups` groups), the silu gate applied
    before it or, with `norm_before_gate`, after it."""
    z, silu = y.float(), F.silu(gate.float())
    if not norm.norm_before_gate:
        z = z * silu
    size = z.shape[-1] // norm.n_groups
    z = F.rms_norm(z.view(*z.shape[:-1], norm.n_groups, size), (size,), eps=norm.variance_epsilon)
    z = norm.weight.float() * z.view_as(y)
    if norm.norm_before_gate:
        z = z * silu
    return z.to(y.dtype)


def mamba2_committed_state(mixer, step: Mamba2Step, on_path: torch.Tensor, ssm_state: torch.Tensor) -> torch.Tensor:
    """The SSM state after the accepted nodes (`on_path` [B, T]), in closed form."""
    return tree_state(step.x, step.dt, _consts(mixer).A, step.B, on_path, ssm_state)


def mamba2_commit_layers(mixers: list, steps: list[Mamba2Step], convs: list[torch.Tensor],
                         ssms: list[torch.Tensor], sources: torch.Tensor, on_path: torch.Tensor,
                         has: torch.Tensor, last: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's committed (conv, SSM) states in one batched pass: the layers' tensors are stacked
    along the batch, so the closed form and the window gather run once instead of once per layer (the
    commit is op-count bound on a CPU). Same result as `commit_layer_states` per layer."""
    n, b = len(steps), on_path.shape[0]
    if n == 0:
        return [], []
    if len({(s.x.shape, s.B.shape, s.xbc.shape) for s in steps}) > 1:  # layers of different shapes: one by one
        out = [commit_layer_states(c, h, mamba2_committed_state(m, s, on_path, h), s.xbc, sources, has, last)
               for m, s, c, h in zip(mixers, steps, convs, ssms)]
        return [c for c, _ in out], [h for _, h in out]
    stack = lambda ts: torch.cat(ts, dim=0)  # noqa: E731 - [L*B, ...], layer-major
    A = torch.stack([_consts(m).A for m in mixers])  # [L, H]
    A = A.repeat_interleave(b, dim=0)[:, None, :]  # [L*B, 1, H]
    ssm = stack(ssms)
    new_ssm = tree_state(stack([s.x for s in steps]), stack([s.dt for s in steps]), A,
                         stack([s.B for s in steps]), on_path.repeat(n, 1), ssm)
    conv, ssm = commit_layer_states(stack(convs), ssm, new_ssm, stack([s.xbc for s in steps]),
                                    sources.repeat(n, 1, 1), has.repeat(n), last.repeat(n))
    return list(conv.split(b)), list(ssm.split(b))


class Mamba2Target(SSMTarget):
    """Target adapter for `Mamba2ForCausalLM`."""

    model_type = "mamba2"

    def _ssm_state_shape(self, mixer) -> tuple[int, ...]:
        return (mixer.num_heads, mixer.head_dim, mixer.ssm_state_size)

    def _mixer(self, mixer, h, layer, parents, ancestors):
        return mamba2_tree_mix(mixer, h, self.conv[layer], self.ssm[layer], parents, ancestors, self._sources)

    def _committed_state(self, layer, saved, on_path, last):
        return mamba2_committed_state(self.backbone.layers[layer].mixer, saved, on_path, self.ssm[layer])

    def prefill_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if not bool(attention_mask.all()) or mamba_ssm_prefill(self.device):
            return super().prefill_forward(input_ids, attention_mask)  # left padding, or `mamba_ssm` on CUDA
        hidden = self.backbone.embeddings(input_ids)
        for i, block in enumerate(self.backbone.layers):
            residual = hidden.float() if block.residual_in_fp32 else hidden
            h = rms_norm(block.norm, hidden.to(block.norm.weight.dtype))
            h, self.conv[i], self.ssm[i] = mamba2_prefill_mix(block.mixer, h)
            hidden = residual + h
        return rms_norm(self.backbone.norm_f, hidden)

    def _commit_all(self, on_path, has, last):
        mixers = [block.mixer for block in self.backbone.layers]
        self.conv, self.ssm = mamba2_commit_layers(mixers, self._step, self.conv, self.ssm, self._sources,
                                                   on_path, has, last)
