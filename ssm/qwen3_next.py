"""`transformers`' `Qwen3NextForCausalLM` (Qwen3-Next) as a speculative target and draft: Gated DeltaNet
linear-attention layers and gated full-attention layers, each followed by an MLP or a mixture of experts.

A Gated DeltaNet layer over a tree: q, k, v from one projection pass a short depthwise conv read along each
node's path (the Mamba layers' tree conv), then the gated delta rule runs node by node from each node's
parent's state (`delta_rule.tree_gated_delta_rule`, Triton or PyTorch), keeping every node's state; the
commit keeps the last accepted node's state and conv window. Attention layers read the committed K/V plus
the tree through the ancestor mask (queries carry a sigmoid output gate; per-head q/k norms; partial RoPE).
Prompts prefill through the model's own forward (its chunked delta rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .delta_rule import tree_gated_delta_rule
from .hybrid import MAMBA, BambaTarget, kept_node_states, rotate_heads
from .kernels import tree_conv1d_dispatch


@dataclass
class _DeltaStep:
    xbc: torch.Tensor  # [B, T, C] pre-conv inputs (q, k, v)
    states: torch.Tensor  # [B, T, Hv, Dk, Dv] every node's state


def delta_net_tree_mix(mixer, h: torch.Tensor, conv_state: torch.Tensor, state: torch.Tensor,
                       parents: torch.Tensor, sources: torch.Tensor) -> tuple[torch.Tensor, _DeltaStep]:
    """`Qwen3NextGatedDeltaNet` over the tree's nodes: output [B, T, hidden] of each node as if its path were
    decoded alone, and what the commit needs."""
    b, t, _ = h.shape
    query, key, value, z, beta_in, a = mixer.fix_query_key_value_ordering(mixer.in_proj_qkvz(h), mixer.in_proj_ba(h))
    xbc = torch.cat([x.reshape(b, t, -1) for x in (query, key, value)], dim=-1)
    bias = mixer.conv1d.bias
    conv = F.silu(tree_conv1d_dispatch(xbc, conv_state, parents, mixer.conv1d.weight.squeeze(1), bias,
                                       sources=sources)).to(h.dtype)
    query, key, value = conv.split([mixer.key_dim, mixer.key_dim, mixer.value_dim], dim=-1)
    g = -mixer.A_log.float().exp() * F.softplus(a.float() + mixer.dt_bias)
    out, states = tree_gated_delta_rule(query.reshape(b, t, -1, mixer.head_k_dim), key.reshape(b, t, -1, mixer.head_k_dim),
                                        value.reshape(b, t, -1, mixer.head_v_dim), g, beta_in.sigmoid(), parents,
                                        state)
    out = mixer.norm(out.to(h.dtype).reshape(-1, mixer.head_v_dim), z.reshape(-1, mixer.head_v_dim))
    return mixer.out_proj(out.reshape(b, t, -1)), _DeltaStep(xbc, states)


def gated_tree_attention(attn, h: torch.Tensor, rotary, mask: torch.Tensor, cache_layer) -> torch.Tensor:
    """`Qwen3NextAttention` over the tree nodes, appending their K/V to `cache_layer`: the query projection
    holds each head's query and output gate side by side; per-head q/k norms before the (partial) RoPE."""
    b, m, _ = h.shape
    d = attn.head_dim
    query, gate = attn.q_proj(h).view(b, m, -1, 2 * d).chunk(2, dim=-1)
    q = attn.q_norm(query).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(b, m, -1, d)).transpose(1, 2)
    v = attn.v_proj(h).view(b, m, -1, d).transpose(1, 2)
    keys, values = cache_layer.update(rotate_heads(k, rotary), v, None)
    out = F.scaled_dot_product_attention(rotate_heads(q, rotary), keys, values, attn_mask=mask, scale=attn.scaling,
                                         enable_gqa=q.shape[1] != k.shape[1])
    out = out.transpose(1, 2).reshape(b, m, -1) * torch.sigmoid(gate.reshape(b, m, -1))
    return attn.o_proj(out)


class Qwen3NextTarget(BambaTarget):
    """Target adapter for `Qwen3NextForCausalLM` (see the module's docstring)."""

    model_type = "qwen3_next"
    own_prefill = False
    state_kinds = (MAMBA,)

    def _mamba(self, i: int):
        return self.decoder.layers[i].linear_attn  # `conv_kernel_size`: the window `score_forward` computes sources for

    def _zero_states(self, mixer, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(b, mixer.conv_dim, mixer.conv_kernel_size, dtype=self.dtype, device=self.device),
                torch.zeros(b, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim, device=self.device))

    def _tree_layer(self, i: int, layer, hidden: torch.Tensor, rotary, masks, parents, ancestors, sources,
                    step: dict) -> torch.Tensor:
        h = layer.input_layernorm(hidden)
        if i in self.conv:
            h, step[i] = delta_net_tree_mix(layer.linear_attn, h, self.conv[i], self.ssm[i], parents, sources)
        else:
            h = gated_tree_attention(layer.self_attn, h, rotary, masks, self.cache.layers[i])
        hidden = hidden + h
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def _committed_states(self, layers: list[int], on_path, has, last) -> tuple[list, list]:
        return kept_node_states(self, layers, has, last)

    def _normed(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder.norm(hidden)  # Qwen3-Next's RMS norms scale by (1 + weight)
