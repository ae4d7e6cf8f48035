"""The fixed-shape tree steps of the state-space targets, per class: the pure ones (`multispec.ssm.static`:
Mamba-2, Mamba-1, FalconMamba) and the hybrids (`multispec.ssm.static_hybrid`: Bamba, GraniteMoeHybrid,
NemotronH, Jamba, FalconH1, LFM2, Zamba2, Qwen3-Next). Their logits, features and committed states equal the
eager adapter's on every node of random trees across commits (a ragged batch, trees under and over the node
budget); greedy output equals `generate` at B = 1 and a ragged B = 3 with drafts accepted, chains and dynamic
trees; `torch.compile(fullgraph=True)` traces the step without a graph break; a step reads the device once;
sampled output passes the chi-square test and a broken commit on the same engine fails it."""

from __future__ import annotations

import pytest
import torch

from multispec import DynamicTree, EngineConfig, SamplingConfig, StoppingConfig, speculative_generate
from multispec.drafters import ModelDrafter
from multispec.drafters.controlled import ControlledDrafter
from multispec.prompt import Prompt
from multispec.session import Session
from multispec.ssm import (BambaTarget, FalconH1Target, FalconMambaTarget, GraniteMoeHybridTarget, JambaTarget,
                          Lfm2Target, Mamba2Target, MambaTarget, NemotronHTarget, Qwen3NextTarget, Zamba2Target)
from multispec.ssm.static import StaticSSM
from multispec.ssm.static_hybrid import StaticHybrid
from multispec.ssm.testing import (make_bamba, make_falcon_h1, make_falcon_mamba, make_granite_hybrid, make_jamba,
                                   make_lfm2, make_mamba, make_mamba2, make_nemotron_h, make_qwen3_next,
                                   make_zamba2)
from multispec.targets import FeatureRequest
from multispec.targets.static import fixed_shape_class
from multispec.testing import (CountReads, assert_one_read_per_step, chi_square_pvalue, first_two_token_dists,
                               greedy_rows_alone, make_perturbed_copy, ragged_prompts)

from test_tree_scan import path_of, random_parents

CLASSES = {"mamba2": (make_mamba2, Mamba2Target), "mamba": (make_mamba, MambaTarget),
           "falcon_mamba": (make_falcon_mamba, FalconMambaTarget), "bamba": (make_bamba, BambaTarget),
           "granite": (make_granite_hybrid, GraniteMoeHybridTarget), "nemotron": (make_nemotron_h, NemotronHTarget),
           "jamba": (make_jamba, JambaTarget), "falcon_h1": (make_falcon_h1, FalconH1Target),
           "lfm2": (make_lfm2, Lfm2Target), "zamba2": (make_zamba2, Zamba2Target),
           "qwen3_next": (make_qwen3_next, Qwen3NextTarget)}
HIDDEN = FeatureRequest(hidden=True)


@pytest.mark.parametrize("kind", list(CLASSES))
def test_static_scores_equal_the_eager_adapters_on_every_node(kind):
    make, adapter = CLASSES[kind]
    model = make(seed=1)
    eager, static = adapter(model), fixed_shape_class(model)(model, node_budget=8)
    assert isinstance(static, (StaticSSM, StaticHybrid)) and isinstance(static, adapter)
    ids, mask = ragged_prompts(2, seed=3)
    roots = eager.prefill(Prompt(ids, mask)).roots
    assert torch.equal(static.prefill(Prompt(ids, mask)).roots, roots)
    g = torch.Generator().manual_seed(7)
    for step, t in enumerate((5, 8, 1, 11, 3)):  # 11: over the budget (the pure ones' eager step)
        parents = random_parents(2, t, seed=step)
        tokens = torch.randint(3, 128, (2, t), generator=g)
        tokens[:, 0] = roots
        valid = torch.ones(2, t, dtype=torch.bool)
        valid[1, t // 2 + 1:] = False  # row 1 a smaller tree
        parents[1] = torch.where(valid[1], parents[1], -1)
        want, got = eager.score(tokens, parents, valid, HIDDEN), static.score(tokens, parents, valid, HIDDEN)
        assert got.logits.shape == want.logits.shape
        keep = valid[..., None]
        assert torch.allclose(got.logits * keep, want.logits * keep, atol=1e-4, rtol=1e-4), (kind, step)
        assert torch.allclose(got.features.hidden * keep, want.features.hidden * keep, atol=1e-4, rtol=1e-4)
        node = [int(torch.randint(0, t, (1,), generator=g)), int(torch.randint(0, t // 2 + 1, (1,), generator=g))]
        paths = [path_of(parents[r], node[r]) for r in range(2)]
        path = torch.full((2, max(map(len, paths))), -1)
        for r, p in enumerate(paths):
            path[r, : len(p)] = torch.tensor(p)
        eager.commit(path)
        static.commit(path)
        roots = tokens.gather(1, torch.tensor(node)[:, None])[:, 0]
        for a, b in zip(_states(eager), _states(static)):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (kind, step)
    assert static.static_calls == (4 if isinstance(static, StaticSSM) else 5)


def _states(target) -> list[torch.Tensor]:
    """Every recurrent state of a pure SSM target (lists) or a hybrid (dicts by layer)."""
    conv, ssm = target.conv, target.ssm
    if isinstance(conv, dict):
        conv, ssm = [conv[i] for i in sorted(conv)], [ssm[i] for i in sorted(ssm)]
    return [*conv, *ssm]


@pytest.mark.parametrize("kind", list(CLASSES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_static_speculation_equals_generate(kind, batch):
    model = CLASSES[kind][0](seed=1)
    draft = ModelDrafter(make_perturbed_copy(model, noise=0.05))
    ids, mask = ragged_prompts(batch, seed=batch)
    for tree in (4, DynamicTree(depth=3, topk=2, total=6)):
        out = speculative_generate(model, draft, ids, attention_mask=mask, max_new_tokens=20, tree=tree,
                                   stopping=StoppingConfig.never(), engine=EngineConfig(step="static"))
        assert torch.equal(out.sequences[:, -20:], greedy_rows_alone(model, ids, mask, 20)), (kind, tree)
        assert out.stats.mean_accepted_length > 1.5, out.stats  # drafts accepted: not plain decoding
    engine = next(iter(model.__dict__["_multispec_static_engines"].values()))
    assert engine.static_calls > 0


@pytest.mark.parametrize("kind", ["mamba2", "mamba", "bamba", "qwen3_next"])
def test_the_compiled_step_has_no_graph_break(kind):
    """`torch.compile(fullgraph=True)` (dynamo, eager backend) raises on a graph break."""
    model = CLASSES[kind][0](seed=1)
    engine = fixed_shape_class(model)(model, node_budget=8, compile="eager")
    ids, mask = ragged_prompts(2, seed=5)
    out = speculative_generate(engine, ModelDrafter(make_perturbed_copy(model, noise=0.05)), ids, attention_mask=mask,
                               max_new_tokens=12, tree=4, stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -12:], greedy_rows_alone(model, ids, mask, 12))
    assert engine.static_calls > 0


@pytest.mark.parametrize("kind", ["mamba2", "bamba"])
def test_a_step_reads_the_device_once(kind, as_on_cuda):
    model = CLASSES[kind][0](seed=1)
    engine = fixed_shape_class(model)(model, node_budget=8)
    drafter = ControlledDrafter(model, acceptance=0.8, horizon=24)  # reads nothing itself
    ids, mask = ragged_prompts(1, seed=4)
    session = Session(engine, drafter, tree=4, rollback=False, stopping=StoppingConfig.never())
    session.append(ids, mask)
    with CountReads() as loop:
        session.generate(24)
    steps = len(session.stats.steps)
    assert session.stats.mean_accepted_length > 1.5 and engine.static_calls == steps
    assert_one_read_per_step(loop, steps)


N = 4000
SETTINGS = dict(temperature=0.9, top_k=12)
PROMPT = torch.tensor([5, 17, 42, 9, 77])


def _drops_root_update(engine_class: type) -> type:
    """A broken commit on a static engine: the accepted path loses its root."""

    class DropsRootUpdate(engine_class):
        def commit(self, path, **counts):  # the host's counts no longer hold: the engine counts itself
            super().commit(torch.where(path == 0, -1, path))

    return DropsRootUpdate


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mamba2", "bamba"])
@pytest.mark.parametrize("broken", [False, True], ids=["static", "negative-control"])
def test_sampled_static_speculation_follows_the_target(kind, broken):
    """Power as `tests/ssm/test_ssm_sampling.py` (N = 4,000, level 1e-3): a 0.10 token moved by 2.8 points."""
    model = CLASSES[kind][0](seed=1)
    engine_class = fixed_shape_class(model)
    engine = (_drops_root_update(engine_class) if broken else engine_class)(model, node_budget=8)
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


