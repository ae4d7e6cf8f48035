"""SSM targets (Mamba-2, Mamba-1, the Bamba hybrid): tree logits equal per-path decoding; speculative output equals greedy
decoding; deep accepted paths commit the right states."""

import functools

import pytest
import torch

from multispec import (DraftTree, Drafter, DynamicTree, NGramDrafter, StaticTree, StoppingConfig, speculative_generate,
                       zoo)
from multispec.prompt import Prompt
from multispec.ssm import (BambaTarget, FalconH1Target, FalconMambaTarget, GraniteMoeHybridTarget, JambaTarget,
                          Lfm2Target, Mamba2Target, MambaTarget, NemotronHTarget, Qwen3NextTarget,
                          Zamba2Target)
from multispec.ssm.testing import (make_bamba, make_falcon_h1, make_falcon_mamba, make_granite_hybrid, make_jamba,
                                   make_lfm2, make_mamba, make_mamba2, make_nemotron_h, make_qwen3_next,
                                   make_zamba2)
from multispec.testing import (greedy_rows_alone, make_perturbed_copy, make_target, ragged_prompts,
                               source_prompts)

from test_tree_scan import path_of, random_parents


ADAPTERS = {"mamba2": Mamba2Target, "mamba": MambaTarget, "falcon_mamba": FalconMambaTarget, "bamba": BambaTarget,
            "granitemoehybrid": GraniteMoeHybridTarget, "nemotron_h": NemotronHTarget, "jamba": JambaTarget,
            "falcon_h1": FalconH1Target, "lfm2": Lfm2Target, "zamba2": Zamba2Target,
            "qwen3_next": Qwen3NextTarget}
# granite: Granite 4.0-H's class (Mamba-2 + NoPE attention, experts + shared MLP, scaled branches)
# falcon_h1: Falcon-H1's class (Mamba-2 and attention side by side in every layer, muP multipliers)
# nemotron: Nemotron-H's class (single-mixer blocks: Mamba-2, NoPE attention, MLP, experts)
MAKERS = {"mamba2": make_mamba2, "mamba": make_mamba, "falcon_mamba": make_falcon_mamba, "bamba": make_bamba,
          "granite": make_granite_hybrid, "nemotron": make_nemotron_h, "jamba": make_jamba,
          "falcon_h1": make_falcon_h1, "lfm2": make_lfm2, "zamba2": make_zamba2,
          "qwen3_next": make_qwen3_next}


# Commit strategies per family: the replay baseline exists for the pure SSM targets only.
COMMITS = [(kind, False) for kind in MAKERS] + [("mamba2", True), ("mamba", True)]
COMMIT_IDS = [f"{kind}-{'replay' if replay else 'closed-form'}" for kind, replay in COMMITS]


@functools.cache
def model_of(kind):
    return MAKERS[kind]()


@pytest.fixture(scope="module", params=list(MAKERS))
def mamba(request):
    return model_of(request.param)


def adapter(model, replay=False):
    if replay:
        return ADAPTERS[model.config.model_type](model, replay=True)
    return ADAPTERS[model.config.model_type](model)


@pytest.mark.parametrize("batch,backend", [(1, "torch"), (3, "torch"), (3, "triton")])
def test_tree_logits_equal_each_path_decoded_alone(mamba, batch, backend, monkeypatch):
    monkeypatch.setenv("MULTISPEC_KERNELS", backend)  # triton: the kernels through the interpreter
    ids, mask = ragged_prompts(batch, seed=batch)
    t = 8
    parents = random_parents(batch, t, seed=11)
    g = torch.Generator().manual_seed(5)
    tree_tokens = torch.randint(3, 128, (batch, t), generator=g)
    target = adapter(mamba)
    roots = target.prefill(Prompt(ids, mask)).roots
    tree_tokens[:, 0] = roots
    logits = target.score(tree_tokens, parents).logits
    with torch.no_grad():
        for r in range(batch):
            prompt = ids[r, mask[r].bool()]
            for node in range(t):
                seq = torch.cat([prompt[:-1], tree_tokens[r, path_of(parents[r], node)]])
                want = mamba(seq[None]).logits[0, -1]
                assert torch.allclose(logits[r, node], want, atol=1e-4, rtol=1e-4), (r, node)


@pytest.mark.parametrize("rms_norm,before", [(False, False), (True, True)], ids=["no-norm", "norm-before-gate"])
def test_falcon_h1_mixer_variants_tree_logits(rms_norm, before):
    """Falcon-H1's optional mixer norm (`mamba_rms_norm`; the gate before or after it): tree logits of every
    node equal its path decoded alone (the other variant runs in every test above)."""
    model = make_falcon_h1(seed=2, rms_norm=rms_norm, norm_before_gate=before)
    ids, mask = ragged_prompts(2, seed=3)
    parents = random_parents(2, 6, seed=4)
    tokens = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(6))
    target = FalconH1Target(model)
    tokens[:, 0] = target.prefill(Prompt(ids, mask)).roots
    logits = target.score(tokens, parents).logits
    with torch.no_grad():
        for r in range(2):
            prompt = ids[r, mask[r].bool()]
            for node in range(6):
                seq = torch.cat([prompt[:-1], tokens[r, path_of(parents[r], node)]])
                assert torch.allclose(logits[r, node], model(seq[None]).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind,replay", COMMITS, ids=COMMIT_IDS)
def test_commit_equals_decoding_the_accepted_path(kind, replay):
    mamba = model_of(kind)
    ids, mask = ragged_prompts(2, seed=4)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3], [-1, 0, 1, 1, 3, 4]])
    tokens = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(2))
    target = adapter(mamba, replay)
    tokens[:, 0] = target.prefill(Prompt(ids, mask)).roots
    target.score(tokens, parents).logits
    path = torch.tensor([[0, 2, 4, -1], [0, 1, 3, 4]])  # accepted: node 4 in row 0, node 4 in row 1
    target.commit(path)
    nxt = torch.tensor([[17, 23], [5, 9]])  # two more tokens as a chain after the accepted nodes
    after = target.score(nxt, torch.tensor([[-1, 0], [-1, 0]])).logits
    with torch.no_grad():
        for r in range(2):
            prompt = ids[r, mask[r].bool()]
            seq = torch.cat([prompt[:-1], tokens[r, [p for p in path[r].tolist() if p >= 0]], nxt[r]])
            want = mamba(seq[None]).logits[0, -2:]
            assert torch.allclose(after[r], want, atol=1e-4, rtol=1e-4), r


CASES = {"chain": 3, "static": StaticTree.full([2, 2]), "dynamic": DynamicTree(depth=3, topk=2, total=6)}


@pytest.mark.parametrize("tree", list(CASES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_speculation_equals_greedy_decoding(mamba, tree, batch):
    """A perturbed copy of the target drafts (a state-space draft model: agrees often, not always)."""
    ids, mask = ragged_prompts(batch, seed=7)
    drafter = make_perturbed_copy(mamba, noise=0.05, seed=batch)
    out = speculative_generate(mamba, drafter, ids, attention_mask=mask, max_new_tokens=20, tree=CASES[tree],
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -20:], greedy_rows_alone(mamba, ids, mask, 20))
    assert out.stats.mean_accepted_length >= 1.8, out.stats


@functools.cache
def _zoo_pair(name):
    return zoo.load(name)


@pytest.mark.parametrize("drafter,tree", [("llama", "chain"), ("llama", "dynamic"), ("lookup", "chain")])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", ["stdlib-mamba2", "stdlib-bamba"])
def test_trained_ssm_targets_with_llama_and_lookup_drafts(name, drafter, tree, batch):
    """The zoo's trained SSM targets with their byte-level Llama draft (and prompt lookup, which drafts
    chains) on held-out source: lossless, batch 1 and ragged 3, and the drafts are accepted."""
    pair = _zoo_pair(name)
    ids, mask = source_prompts((420, 260, 330)[:batch])
    source = pair.drafter if drafter == "llama" else NGramDrafter()
    n = 32
    out = speculative_generate(pair.target, source, ids, attention_mask=mask, max_new_tokens=n, tree=CASES[tree],
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -n:], greedy_rows_alone(pair.target, ids, mask, n))
    assert out.stats.mean_accepted_length >= (2.0 if drafter == "llama" else 1.2), out.stats


class OracleTreeDrafter(Drafter):
    """Trees whose nodes are random decoys except one branch that follows the known greedy output for a
    random number of tokens: every step accepts a path of random depth at a random place in the tree."""

    def __init__(self, expected: torch.Tensor, prompt_lengths: torch.Tensor, seed: int = 0):
        self.expected, self.g = expected, torch.Generator().manual_seed(seed)
        self.done = torch.zeros(expected.shape[0], dtype=torch.long)
        self.rows = torch.arange(expected.shape[0])

    def start(self, input_ids, attention_mask, features=None):
        pass

    def propose(self, roots, spec, sampling, generator=None):
        b, n = len(self.rows), 7
        parents = torch.stack([torch.tensor([-1] + [int(torch.randint(-1, i, (1,), generator=self.g))
                                                     for i in range(1, n)]) for _ in range(b)])
        tokens = torch.randint(3, 128, (b, n), generator=self.g)
        for r in range(b):  # overwrite one random root-to-node path with the true continuation
            node = int(torch.randint(0, n, (1,), generator=self.g))
            path = []
            while node >= 0:
                path.append(node)
                node = int(parents[r, node])
            truth = self.expected[self.rows[r], self.done[self.rows[r]]:]
            for depth, node in enumerate(reversed(path)):
                if depth < len(truth) and bool(torch.rand(1, generator=self.g) < 0.85):
                    tokens[r, node] = truth[depth]
                else:
                    break
        return DraftTree(tokens, parents, torch.ones(b, n, dtype=torch.bool))

    def commit(self, draft, verdict, features=None):
        self.done[self.rows] += verdict.num_accepted + 1

    def select(self, rows):
        self.rows = self.rows[rows]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind,replay", COMMITS, ids=COMMIT_IDS)
def test_deep_accepted_paths_commit_the_right_state(kind, batch, replay):
    mamba = model_of(kind)
    ids, mask = ragged_prompts(batch, seed=8)
    n = 30
    expected = greedy_rows_alone(mamba, ids, mask, n)
    drafter = OracleTreeDrafter(expected, mask.sum(1), seed=batch)
    out = speculative_generate(adapter(mamba, replay), drafter, ids, attention_mask=mask, max_new_tokens=n, tree=3,
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences[:, -n:], expected)
    assert out.stats.mean_accepted_length > 2.0  # deep paths were accepted and committed


def test_bad_use_is_refused(mamba):
    with pytest.raises(TypeError, match="model: expected a transformers mamba2 causal LM"):
        Mamba2Target(make_target("llama"))
    with pytest.raises(TypeError, match="model: expected a transformers mamba causal LM"):
        MambaTarget(make_mamba2())
    with pytest.raises(TypeError, match="model: expected a transformers bamba causal LM"):
        BambaTarget(make_mamba2())
    target = adapter(mamba)
    ids, mask = ragged_prompts(1)
    roots = target.prefill(Prompt(ids, mask)).roots
    target.score(roots[:, None], torch.tensor([[-1]])).logits
    with pytest.raises(RuntimeError, match="score: commit or discard"):
        target.score(roots[:, None], torch.tensor([[-1]])).logits
    target.discard()
    with pytest.raises(ValueError, match="parents: a node's parent must (come|be fed) before it"):
        target.score(torch.tensor([[5, 6]]), torch.tensor([[-1, 1]])).logits


def test_rows_that_stop_early_leave_the_others_exact(mamba):
    """EOS in one row drops it from the batch (`select`): the other rows' states must follow."""
    ids, mask = ragged_prompts(3, seed=9)
    n = 16
    free = greedy_rows_alone(mamba, ids, mask, n)
    eos = int(free[1, 4])  # row 1 stops at its 5th token; others stop wherever that token appears
    out = speculative_generate(mamba, make_perturbed_copy(mamba, noise=0.02), ids, attention_mask=mask,
                               max_new_tokens=n, tree=3,
                               stopping=StoppingConfig(eos_token_id=eos, pad_token_id=0))
    new = out.sequences[:, ids.shape[1]:]
    for r in range(3):
        hits = (free[r] == eos).nonzero()
        stop = int(hits[0]) + 1 if len(hits) else n
        assert torch.equal(new[r, :stop], free[r, :stop]), r
        assert (new[r, stop:] == 0).all(), r
    assert out.stats.mean_accepted_length >= 2.0, out.stats  # rows dropped after accepted runs, not plain steps


@pytest.mark.parametrize("length", [2, 3, 40, 70])
def test_mamba2_prefill_states_equal_the_model_own(length):
    """Our prefill (conv1d + chunked SSD) leaves the states `transformers`' own forward leaves."""
    from multispec.ssm.targets import SSMTarget

    model = model_of("mamba2")
    ids = torch.randint(3, 128, (2, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones_like(ids)
    ours, theirs = Mamba2Target(model), Mamba2Target(model)
    ours.prefill(Prompt(ids, mask)).roots
    theirs.prefill_forward = SSMTarget.prefill_forward.__get__(theirs)  # the model's own forward (as for padded rows)
    theirs.prefill(Prompt(ids, mask)).roots
    for a, b in zip(ours.conv + ours.ssm, theirs.conv + theirs.ssm):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)


def test_bamba_unpadded_prefill_equals_the_model_forward():
    """The hybrid's own prefill (our scan for Mamba layers) leaves the model's states and KV entries."""
    from transformers import DynamicCache

    model = model_of("bamba")
    ids = torch.randint(3, 128, (2, 45), generator=torch.Generator().manual_seed(3))
    ours = BambaTarget(model)
    ours.prefill(Prompt(ids, torch.ones_like(ids))).roots
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.model(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True)
    for i in ours.mamba_layers:
        assert torch.allclose(ours.conv[i], cache.get_conv_state(i), atol=1e-4, rtol=1e-3)
        assert torch.allclose(ours.ssm[i], cache.get_recurrent_state(i).float(), atol=1e-4, rtol=1e-3)
    attention = [i for i in range(len(model.model.layers)) if i not in ours.mamba_layers]
    assert attention
    for i in attention:
        assert torch.allclose(ours.cache.layers[i].keys, cache.layers[i].keys, atol=1e-4, rtol=1e-3)
        assert torch.allclose(ours.cache.layers[i].values, cache.layers[i].values, atol=1e-4, rtol=1e-3)


def test_prefill_routes_to_the_model_forward_where_mamba_ssm_runs(monkeypatch):
    """On CUDA with `mamba_ssm` the model's own (fused-kernel) prefill is used; the routing is checked here
    on the CPU by pretending, and both prefills must leave the same states."""
    import multispec.ssm.mamba2 as m2

    model = model_of("mamba2")
    ids = torch.randint(3, 128, (1, 30), generator=torch.Generator().manual_seed(9))
    ours = Mamba2Target(model)
    ours.prefill(Prompt(ids, torch.ones_like(ids))).roots
    called = []
    monkeypatch.setattr(m2, "mamba_ssm_prefill", lambda device: called.append(device) or True)
    theirs = Mamba2Target(model)
    monkeypatch.setattr(model.backbone, "forward", _counting(model.backbone.forward, called))
    theirs.prefill(Prompt(ids, torch.ones_like(ids))).roots
    assert len(called) == 2  # asked, then the model's forward ran
    for a, b in zip(ours.conv + ours.ssm, theirs.conv + theirs.ssm):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)


def _counting(fn, calls):
    def wrapped(*args, **kwargs):
        calls.append("forward")
        return fn(*args, **kwargs)
    return wrapped


@pytest.mark.parametrize("batch", [1, 3])
def test_granite_hybrid_with_rope_equals_generate(batch):
    """Granite's other position mode (RoPE; the NoPE default runs through every test above), with rejections."""
    model = make_granite_hybrid(seed=2, rope=True)
    ids, mask = ragged_prompts(batch, seed=4)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    out = speculative_generate(model, make_perturbed_copy(model, noise=0.1), ids, attention_mask=mask,
                               max_new_tokens=16,
                               tree=DynamicTree(depth=3, topk=2, total=6), stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length > 1.5 and out.stats.acceptance_rate < 1.0
