"""The gated delta rule over a tree (Qwen3-Next's linear attention): on a chain it is `transformers`' own
recurrence; every tree node equals its root path run as a chain; the Triton kernel (interpreted on CPU)
equals the PyTorch reference."""

import os

import pytest
import torch
from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

from multispec.ssm.delta_rule import tree_gated_delta_rule, tree_gated_delta_rule_triton

from test_tree_scan import path_of, random_parents


def inputs(b, t, hk=2, hv=4, dk=16, dv=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return dict(query=r(b, t, hk, dk), key=r(b, t, hk, dk), value=r(b, t, hv, dv),
                g=-torch.rand(b, t, hv, generator=g) * 2, beta=torch.rand(b, t, hv, generator=g),
                initial_state=r(b, hv, dk, dv) * 0.3)


@pytest.mark.parametrize("hk,hv", [(2, 4), (3, 3)])
def test_chain_equals_transformers_recurrence(hk, hv):
    x = inputs(2, 9, hk=hk, hv=hv)
    parents = random_parents(2, 9, seed=0, shape="chain")
    out, states = tree_gated_delta_rule(parents=parents, backend="torch", **x)
    want, final = torch_recurrent_gated_delta_rule(x["query"], x["key"], x["value"], g=x["g"], beta=x["beta"],
                                                   initial_state=x["initial_state"], output_final_state=True,
                                                   use_qk_l2norm_in_kernel=True)
    assert torch.allclose(out, want, atol=1e-5)
    assert torch.allclose(states[:, -1], final, atol=1e-5)


def test_every_tree_node_equals_its_path_run_as_a_chain():
    b, t = 3, 12
    x = inputs(b, t, seed=1)
    parents = random_parents(b, t, seed=4)
    out, states = tree_gated_delta_rule(parents=parents, backend="torch", **x)
    for r in range(b):
        for node in range(t):
            path = path_of(parents[r], node)
            pick = lambda v: v[r:r + 1, path]  # noqa: E731
            want, final = torch_recurrent_gated_delta_rule(
                pick(x["query"]), pick(x["key"]), pick(x["value"]), g=pick(x["g"]), beta=pick(x["beta"]),
                initial_state=x["initial_state"][r:r + 1], output_final_state=True, use_qk_l2norm_in_kernel=True)
            assert torch.allclose(out[r, node], want[0, -1], atol=1e-5), (r, node)
            assert torch.allclose(states[r, node], final[0], atol=1e-5), (r, node)


def test_a_wrong_parent_changes_the_outputs():
    """Negative control: the comparison above sees a tree read as a chain."""
    x = inputs(1, 8, seed=2)
    tree = torch.tensor([[-1, 0, 0, 1, 2, 2, 3, 4]])
    out_tree, _ = tree_gated_delta_rule(parents=tree, backend="torch", **x)
    out_chain, _ = tree_gated_delta_rule(parents=random_parents(1, 8, seed=0, shape="chain"), backend="torch", **x)
    assert torch.allclose(out_tree[:, :2], out_chain[:, :2], atol=1e-6)  # nodes 0, 1: the same paths
    assert not torch.allclose(out_tree[:, 2], out_chain[:, 2], atol=1e-3)


def test_shape_errors_name_the_argument():
    x = inputs(1, 4)
    parents = random_parents(1, 4, seed=0)
    with pytest.raises(ValueError, match="value"):
        tree_gated_delta_rule(parents=parents, **{**x, "value": x["value"][:, :, :3]})
    with pytest.raises(ValueError, match="beta"):
        tree_gated_delta_rule(parents=parents, **{**x, "beta": x["beta"][:, :3]})
    with pytest.raises(ValueError, match="initial_state"):
        tree_gated_delta_rule(parents=parents, **{**x, "initial_state": x["initial_state"][:, :2]})
    with pytest.raises(ValueError, match="parents"):
        tree_gated_delta_rule(parents=parents[:, :3], **x)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton on CPU needs TRITON_INTERPRET=1 (set by tests/conftest.py)")
@pytest.mark.parametrize("shape,t,b,dv,block_v", [("random", 11, 3, 12, None), ("chain", 9, 2, 40, 16),
                                                  ("star", 6, 2, 16, 8), ("random", 1, 1, 16, None)])
def test_triton_kernel_equals_reference(shape, t, b, dv, block_v):
    x = inputs(b, t, dv=dv, seed=t)
    parents = random_parents(b, t, seed=t, shape=shape)
    want, want_states = tree_gated_delta_rule(parents=parents, backend="torch", **x)
    got, got_states = tree_gated_delta_rule(parents=parents, backend="triton", **x)
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(got_states, want_states, atol=1e-5)
    # the kernel itself with value blocks narrower than Dv (several programs per head)
    q = torch.nn.functional.normalize(x["query"], dim=-1).repeat_interleave(2, dim=2) * 16 ** -0.5
    k = torch.nn.functional.normalize(x["key"], dim=-1).repeat_interleave(2, dim=2)
    direct, _ = tree_gated_delta_rule_triton(q, k, x["value"], x["g"], x["beta"], parents, x["initial_state"],
                                             block_v=block_v)
    assert torch.allclose(direct, want, atol=1e-4)
