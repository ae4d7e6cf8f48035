"""The fixed-shape tree step of the state-space targets (`multispec.ssm.static`), per class (Mamba-2, Mamba-1,
FalconMamba): its logits and features equal the eager adapter's on every node of random trees across commits
(a ragged batch, trees under and over the node budget); greedy output equals `generate` at B = 1 and a ragged
B = 3 with drafts accepted, chains and dynamic trees; `torch.compile(fullgraph=True)` traces the step without a
graph break; a step reads the device once; sampled output passes the chi-square test and a broken commit on
the same engine fails it; the hybrids are still refused by name."""

from __future__ import annotations

import pytest
import torch

from multispec import DynamicTree, EngineConfig, SamplingConfig, StoppingConfig, speculative_generate
from multispec.drafters import ModelDrafter
from multispec.prompt import Prompt
from multispec.session import Session
from multispec.ssm import FalconMambaTarget, Mamba2Target, MambaTarget
from multispec.ssm.static import StaticSSM
from multispec.ssm.testing import make_bamba, make_falcon_mamba, make_mamba, make_mamba2
from multispec.targets import FeatureRequest
from multispec.targets.static import fixed_shape_class
from multispec.testing import (CountReads, chi_square_pvalue, first_two_token_dists, greedy_rows_alone,
                               make_perturbed_copy, ragged_prompts, step_read_line)

from test_tree_scan import path_of, random_parents

CLASSES = {"mamba2": (make_mamba2, Mamba2Target), "mamba": (make_mamba, MambaTarget),
           "falcon_mamba": (make_falcon_mamba, FalconMambaTarget)}
HIDDEN = FeatureRequest(hidden=True)


@pytest.mark.parametrize("kind", list(CLASSES))
def test_static_scores_equal_the_eager_adapters_on_every_node(kind):
    make, adapter = CLASSES[kind]
    model = make(seed=1)
    eager, static = adapter(model), fixed_shape_class(model)(model, node_budget=8)
    assert isinstance(static, StaticSSM) and isinstance(static, adapter)
    ids, mask = ragged_prompts(2, seed=3)
    roots = eager.prefill(Prompt(ids, mask)).roots
    assert torch.equal(static.prefill(Prompt(ids, mask)).roots, roots)
    g = torch.Generator().manual_seed(7)
    for step, t in enumerate((5, 8, 1, 11, 3)):  # 11: over the budget, the eager step
        parents = random_parents(2, t, seed=step)
        tokens = torch.randint(3, 128, (2, t), generator=g)
        tokens[:, 0] = roots
        valid = torch.ones(2, t, dtype=torch.bool)
        valid[1, t // 2 + 1:] = False  # row 1 a smaller tree
        want, got = eager.score(tokens, parents, valid, HIDDEN), static.score(tokens, parents, valid, HIDDEN)
        assert got.logits.shape == want.logits.shape
        assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=1e-4), (kind, step)
        assert torch.allclose(got.features.hidden, want.features.hidden, atol=1e-4, rtol=1e-4), (kind, step)
        node = [int(torch.randint(0, t, (1,), generator=g)), int(torch.randint(0, t // 2 + 1, (1,), generator=g))]
        paths = [path_of(parents[r], node[r]) for r in range(2)]
        path = torch.full((2, max(map(len, paths))), -1)
        for r, p in enumerate(paths):
            path[r, : len(p)] = torch.tensor(p)
        eager.commit(path)
        static.commit(path)
        roots = tokens.gather(1, torch.tensor(node)[:, None])[:, 0]
        for a, b in zip(eager.ssm + eager.conv, static.ssm + static.conv):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (kind, step)
    assert static.static_calls == 4


@pytest.mark.parametrize("kind", list(CLASSES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_static_speculation_equals_generate(kind, batch):
    model = CLASSES[kind][0](seed=1)
    draft = ModelDrafter(make_perturbed_copy(model, noise=0.05))
    ids, mask = ragged_prompts(batch, seed=batch)
    for tree in (4, DynamicTree(depth=3, topk=2, total=6)):
        out = speculative_generate(model, draft, ids, mask, max_new_tokens=20, tree=tree,
                                   stopping=StoppingConfig.never(), engine=EngineConfig(step="static"))
        assert torch.equal(out.sequences[:, -20:], greedy_rows_alone(model, ids, mask, 20)), (kind, tree)
        assert out.stats.mean_accepted_length > 1.5, out.stats  # drafts accepted: not plain decoding
    engine = next(iter(model.__dict__["_multispec_static_engines"].values()))
    assert engine.static_calls > 0


@pytest.mark.parametrize("kind", ["mamba2", "mamba"])
def test_the_compiled_step_has_no_graph_break(kind):
    """`torch.compile(fullgraph=True)` (dynamo, eager backend) raises on a graph break."""
    model = CLASSES[kind][0](seed=1)
    engine = fixed_shape_class(model)(model, node_budget=8, compile="eager")
    ids, mask = ragged_prompts(2, seed=5)
    out = speculative_generate(engine, ModelDrafter(make_perturbed_copy(model, noise=0.05)), ids, mask,
                               max_new_tokens=12, tree=4, stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -12:], greedy_rows_alone(model, ids, mask, 12))
    assert engine.static_calls > 0


def test_a_step_reads_the_device_once(as_on_cuda):
    model = make_mamba2(seed=1)
    engine = fixed_shape_class(model)(model, node_budget=8)
    drafter = ModelDrafter(make_perturbed_copy(model, noise=0.05))
    ids, mask = ragged_prompts(1, seed=4)
    session = Session(engine, drafter, tree=4, rollback=False, stopping=StoppingConfig.never())
    session.append(ids, mask)
    with CountReads() as loop:
        session.generate(24)
    steps = len(session.stats.steps)
    assert session.stats.mean_accepted_length > 1.5 and engine.static_calls == steps
    target_reads = {k: v for k, v in loop.where.items() if k.startswith(("static.py", "targets.py", "mamba"))}
    assert not target_reads, target_reads  # the engine's own code reads nothing; the drafter's model may
    assert loop.where[step_read_line()] == steps, dict(loop.where)


N = 4000
SETTINGS = dict(temperature=0.9, top_k=12)
PROMPT = torch.tensor([5, 17, 42, 9, 77])


class DropsRootUpdate(fixed_shape_class(make_mamba2(seed=0))):
    """A broken commit on the static engine: the accepted path loses its root."""

    def commit(self, path):
        super().commit(torch.where(path == 0, -1, path))


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True], ids=["static", "negative-control"])
def test_sampled_static_speculation_follows_the_target(broken):
    """Power as `tests/ssm/test_ssm_sampling.py` (N = 4,000, level 1e-3): a 0.10 token moved by 2.8 points."""
    model = make_mamba2(seed=1)
    engine = (DropsRootUpdate if broken else fixed_shape_class(model))(model, node_budget=8)
    out = speculative_generate(engine, make_perturbed_copy(model, noise=0.1, seed=3), PROMPT.expand(N, -1).contiguous(),
                               max_new_tokens=2, tree=DynamicTree(depth=2, topk=3, total=6),
                               generator=torch.Generator().manual_seed(0),
                               sampling=SamplingConfig(do_sample=True, **SETTINGS), stopping=StoppingConfig.never())
    p1, p2 = first_two_token_dists(model, PROMPT, SamplingConfig(do_sample=True, **SETTINGS))
    if broken:
        assert chi_square_pvalue(out.sequences[:, -1], p2) < 1e-6
        return
    assert chi_square_pvalue(out.sequences[:, -2], p1) > 1e-3
    assert chi_square_pvalue(out.sequences[:, -1], p2) > 1e-3
    assert out.stats.mean_accepted_length >= 1.3 and engine.static_calls > 0


def test_the_hybrids_are_refused_by_name():
    with pytest.raises(ValueError, match="step: 'static' cannot run this target .*keeps a recurrent state"):
        speculative_generate(make_bamba(), "ngram", torch.tensor([[5, 6, 7]]), max_new_tokens=4,
                             engine=EngineConfig(step="static"))
