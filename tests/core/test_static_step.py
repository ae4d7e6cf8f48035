"""The static-shape step (`multispec.targets.static_step`): the same tokens as the eager lean engines and as
the target's own `generate`, under `torch.compile`, with a number of compiled graphs that does not grow
with the number of steps (what lets a CUDA graph be captured once and replayed)."""

import copy

import pytest
import torch

from multispec import EngineConfig, SamplingConfig, Session, StaticTree, StoppingConfig, speculative_generate, zoo
from multispec.drafters.eagle import EagleDrafter
from multispec.drafters.model import ModelDrafter
from multispec.targets.lean import LeanCausalLM
from multispec.targets.static import static_engines
from multispec.targets.static_step import StaticLeanCausalLM, node_buckets, static_pair
from multispec.testing import compare_tree_feeds, make_perturbed_copy, make_target, ragged_prompts, source_prompts

TREES = {"chain": 4, "tree": StaticTree.full([2, 2])}


class CountingBackend:
    """A `torch.compile` backend that runs the captured graph as it is and counts the graphs."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.fixture(scope="module")
def byte_pair():
    """The zoo's byte-level pair, a source-code prompt, and the target's own greedy continuation."""
    pair = zoo.load("stdlib-bytes")
    ids, mask = source_prompts((160,))  # longer than the head's attention window (128)
    expected = pair.target.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=0,
                                    eos_token_id=None)
    return pair, ids, mask, expected


def _spec(target, drafter, ids, mask, n, tree, **kw):
    return speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=n, tree=tree,
                                stopping=StoppingConfig.never(), **kw)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_static_feed_logits_equal_lean(kind):
    """Feeding trees node by node: parents fed earlier and within the call, invalid nodes, a call wider
    than the budget (eager fallback), commits, a row dropped."""
    model = make_target(kind, seed=1)
    ids, mask = ragged_prompts(3, seed=7)
    b = StaticLeanCausalLM(model, capacity=64, node_budget=(2, 4))
    compare_tree_feeds(LeanCausalLM(model), b, ids, mask)
    assert b.static_calls == 5  # the 5-node calls ran eagerly (wider than the budget)


@pytest.mark.parametrize("tree", list(TREES))
def test_static_eagle_greedy_equals_eager_and_generate(byte_pair, tree):
    pair, ids, mask, expected = byte_pair
    eager = _spec(pair.target, pair.drafter, ids, mask, 32, TREES[tree])
    backend = CountingBackend()
    target, drafter = static_pair(pair.target, pair.drafter, capacity=256, node_budget=8, compile=backend)
    out = _spec(target, drafter, ids, mask, 32, TREES[tree])
    assert torch.equal(eager.sequences, expected)
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length > 2  # a trained pair: chains and trees are accepted
    steps = len(out.stats.steps)
    assert target.static_calls == steps  # every verification ran the static step
    assert drafter.lm.static_calls >= steps  # and every draft forward of the EAGLE head
    assert type(pair.drafter.lm) is not StaticLeanCausalLM  # the given drafter is left as it was
    # one graph per (engine, padded width): the head's catch-up and per-depth widths, the target's tree
    assert backend.graphs <= 4
    # every layer's K/V are views of one tensor per engine, which a commit moves in one copy
    for engine in (target, drafter.lm):
        joint = engine._joint[1]
        assert all(layer._keys.untyped_storage().data_ptr() == joint.untyped_storage().data_ptr()
                   for layer in engine.cache.layers)


def test_graphs_do_not_grow_with_steps(byte_pair):
    pair, ids, mask, _ = byte_pair
    backend = CountingBackend()
    target, drafter = static_pair(pair.target, pair.drafter, capacity=256, node_budget=8, compile=backend)
    _spec(target, drafter, ids, mask, 16, 4)
    graphs, calls = backend.graphs, target.static_calls + drafter.lm.static_calls
    out = _spec(target, drafter, ids, mask, 60, 4)  # a new generation, many more steps
    assert target.static_calls + drafter.lm.static_calls > calls + 20
    assert backend.graphs == graphs, "a step recompiled: its shapes, strides or constants changed"
    assert len(out.stats.steps) > 10


def test_static_sampling_equals_eager(byte_pair):
    pair, ids, mask, _ = byte_pair
    target, drafter = static_pair(pair.target, pair.drafter, capacity=256, node_budget=8)
    kw = dict(sampling=SamplingConfig(do_sample=True, temperature=0.8, top_p=0.95))
    eager = _spec(pair.target, pair.drafter, ids, mask, 32, TREES["tree"],
                  generator=torch.Generator().manual_seed(3), **kw)
    static = _spec(target, drafter, ids, mask, 32, TREES["tree"], generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(static.sequences, eager.sequences)
    assert target.static_calls > 0


def test_static_model_drafter_ragged_rows_that_stop():
    """A batch of ragged rows through a static target and a static draft model (sliding-window attention
    in every layer, a window shorter than the rows); rows stop at an EOS at different steps and leave the
    batch (the fixed buffers of the smaller batch take over)."""
    model = make_target("mistral", seed=1)
    draft = ModelDrafter(make_perturbed_copy(model, noise=0.05))
    ids, mask = ragged_prompts(3, seed=2)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
                          eos_token_id=None)
    eos = int(free[0, ids.shape[1] + 5])  # row 0 stops after 6 new tokens, the others later or never
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
                              eos_token_id=eos)
    for tree in TREES.values():
        target, drafter = static_pair(model, draft, capacity=64, node_budget=8)
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=24, tree=tree,
                                   stopping=StoppingConfig(eos_token_id=eos, pad_token_id=0))
        assert torch.equal(out.sequences, expected)
        assert target.static_calls == len(out.stats.steps) and drafter.lm.static_calls > 0
        assert min(step.rows for step in out.stats.steps) < 3  # some rows left the batch


def test_session_rollback_and_skipped_steps_on_static_engines():
    """Appending text the drafter did not draft, scoring and rolling back keep the static caches right."""
    model = make_target("qwen2", seed=3)  # q/k/v biases
    draft = ModelDrafter(make_perturbed_copy(model, noise=0.05))
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    results = []
    for static in (False, True):
        target, drafter = static_pair(model, draft, capacity=96, node_budget=8) if static else (model, draft)
        session = Session(target, drafter, tree=4)
        session.append(ids)
        first = session.generate(6)[0]
        mark = session.checkpoint()
        span = session.score(torch.tensor([[5, 6, 7]]))
        session.append(torch.tensor([[8, 9]]))
        second = session.generate(6)[0]
        session.rollback(mark)
        third = session.generate(10)[0]
        results.append((first, span.logprobs, second, third))
    (a1, a2, a3, a4), (b1, b2, b3, b4) = results
    assert a1 == b1 and a3 == b3 and a4 == b4
    assert torch.allclose(a2, b2, atol=1e-4)


@pytest.mark.slow  # inductor's C++ build: about 10 s with a warm compile cache, a minute without one
def test_inductor_compiled_step_equals_eager():
    """The default `torch.compile` backend (inductor) on a one-layer model: one graph per engine."""
    model = make_target("llama", seed=4, layers=1, hidden=32)
    draft = ModelDrafter(make_perturbed_copy(model, noise=0.05))
    ids, mask = ragged_prompts(1, seed=5)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    target, drafter = static_pair(model, draft, capacity=48, node_budget=(8,), compile=True)
    out = _spec(target, drafter, ids, mask, 16, 3)
    assert torch.equal(out.sequences, expected)
    assert target.static_calls == len(out.stats.steps)


def test_bad_settings_are_refused():
    model = make_target("llama", seed=1)
    with pytest.raises(ValueError, match="capacity"):
        StaticLeanCausalLM(model, capacity=8, node_budget=16)
    with pytest.raises(ValueError, match="node_budget"):
        node_buckets(0)
    assert node_buckets(12) == (1, 2, 4, 8, 12) and node_buckets([8, 2]) == (2, 8)
    with pytest.raises(ValueError, match="cuda_graphs"):
        StaticLeanCausalLM(model, capacity=64, cuda_graphs=True)
    ids = torch.randint(3, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    target, drafter = static_pair(model, ModelDrafter(make_perturbed_copy(model)), capacity=40, node_budget=8)
    assert target.capacity == 48  # rounded up to a multiple of 16
    with pytest.raises(ValueError, match="capacity"):  # 29 prefilled + 20 new + padded nodes > 48
        _spec(target, drafter, ids, None, 20, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "compiled+graphs"])
@pytest.mark.parametrize("tree", list(TREES))
def test_cuda_graphs_equal_eager(byte_pair, compile, tree):
    """On CUDA each static shape is captured once in a CUDA graph and replayed: the same tokens as eager."""
    pair, ids, mask, _ = byte_pair
    model = copy.deepcopy(pair.target).cuda()
    drafter = EagleDrafter(copy.deepcopy(pair.drafter.head).cuda(), model)
    ids, mask = ids.cuda(), mask.cuda()
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    eager = _spec(model, drafter, ids, mask, 32, TREES[tree])
    assert torch.equal(eager.sequences, expected)
    target, static_drafter = static_pair(model, drafter, capacity=256, node_budget=8, compile=compile)
    assert target.cuda_graphs and static_drafter.lm.cuda_graphs
    graphs = []
    for _ in range(2):  # the second generation replays the graphs the first one captured
        out = _spec(target, static_drafter, ids, mask, 32, TREES[tree])
        assert torch.equal(out.sequences, eager.sequences)
        graphs.append(len(target._graphs) + len(static_drafter.lm._graphs))
    # one graph per feed shape (padded width, new nodes, pending nodes): a handful, none new the second time
    assert graphs[1] == graphs[0] and 2 <= graphs[0] <= 16
    assert target.static_calls + static_drafter.lm.static_calls > 2 * graphs[0]


def test_step_switch_builds_static_engines_once_and_keeps_them(byte_pair):
    """`speculative_generate(engine=EngineConfig(step="static"))`: the same tokens as `generate`, the engines
    built on the first call and kept on the models (a later call reuses them; a longer one rebuilds with more
    columns)."""
    pair, ids, mask, expected = byte_pair
    out = _spec(pair.target, pair.drafter, ids, mask, 32, 4, engine=EngineConfig(step="static"))
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length > 2
    kept = pair.target.__dict__["_multispec_static_engines"]
    (engine,) = kept.values()
    head_engine = next(iter(pair.drafter.lm.model.__dict__["_multispec_static_engines"].values()))
    assert engine.static_calls == len(out.stats.steps) and head_engine.static_calls >= len(out.stats.steps)
    _spec(pair.target, pair.drafter, ids, mask, 16, 4, engine=EngineConfig(step="static"))
    assert next(iter(kept.values())) is engine
    _spec(pair.target, pair.drafter, ids, mask, engine.capacity, 4, engine=EngineConfig(step="static"))
    assert next(iter(kept.values())).capacity > engine.capacity
    assert type(pair.drafter.lm) is LeanCausalLM  # the caller's drafter is left as it was


def test_a_session_runs_the_step_its_engine_config_names(byte_pair):
    """`Session(engine=EngineConfig(step="static"))` builds and runs the static engines itself (it once ran the
    eager step silently): the target's own greedy tokens, every verification and head forward on the fixed-shape
    step, a second turn appended into the same caches, and a clear error past `session_tokens`."""
    pair, ids, mask, expected = byte_pair
    session = Session(pair.target, pair.drafter, tree=4, engine=EngineConfig(step="static", session_tokens=320),
                      stopping=StoppingConfig.never())
    assert isinstance(session.target, StaticLeanCausalLM) and isinstance(session.drafter.lm, StaticLeanCausalLM)
    calls = session.target.static_calls, session.drafter.lm.static_calls  # engines kept from earlier tests
    session.append(ids, mask)
    new = session.generate(32)[0]
    assert torch.equal(torch.tensor(new), expected[0, ids.shape[1]:])
    assert session.stats.mean_accepted_length > 2  # drafts accepted: not plain decoding in disguise
    steps = len(session.stats.steps)
    assert session.target.static_calls - calls[0] == steps and session.drafter.lm.static_calls - calls[1] >= steps
    session.append(torch.tensor([new[:3]]))  # another turn: appended, not prefilled again
    session.generate(8)
    assert session.target.static_calls - calls[0] > steps
    with pytest.raises(ValueError, match=r"session_tokens=320"):
        session.generate(200)
    assert type(pair.drafter.lm) is LeanCausalLM  # the caller's drafter is left as it was


def test_step_switch_refuses_what_it_cannot_run(byte_pair):
    pair, ids, mask, _ = byte_pair
    with pytest.raises(ValueError, match="step: expected one of 'eager', 'static', 'compiled'"):
        _spec(pair.target, pair.drafter, ids, mask, 4, 4, engine=EngineConfig(step="graphs"))
    with pytest.raises(ValueError, match="step: 'static' runs `transformers` decoders; this target is a str"):
        speculative_generate("not a model", "ngram", torch.tensor([[5, 6, 7]]), max_new_tokens=4,
                             engine=EngineConfig(step="static"))
    target, _ = static_engines(pair.target, pair.drafter, "compiled", ids.shape[1], 8, 4)
    assert target.compiled
