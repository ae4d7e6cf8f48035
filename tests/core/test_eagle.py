"""The EAGLE drafter: lossless with every tree shape, trainable, persistent."""

import pytest
import torch

from multispec import DynamicTree, Features, Prompt, SamplingConfig, StaticTree, StoppingConfig, speculative_generate
from multispec.drafters.eagle import EagleConfig, EagleDrafter, EagleHead
from multispec.drafters.eagle_train import EagleTrainConfig, EagleTrainer, chunk_tokens, top_token_map
from multispec.testing import make_eagle_head, make_target, ragged_prompts, source_prompts


@pytest.fixture(scope="module")
def trained():
    """A gemma3-class target and an EAGLE head trained briefly on the target's own samples."""
    target = make_target("gemma3")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        text = target.generate(torch.randint(3, 128, (24, 4), generator=g), max_new_tokens=60, do_sample=True,
                               pad_token_id=0, eos_token_id=None)
    chunks = chunk_tokens(text.flatten(), 64)
    d2t = top_token_map(chunks, 96, 128)  # a reduced draft vocabulary
    head = make_eagle_head(d2t)
    history = EagleTrainer(target, head, EagleTrainConfig(epochs=25, batch_size=8, warmup_steps=5, lr=2e-3)).fit(chunks)
    return target, head, history


def test_training_reduces_the_loss(trained):
    _, _, history = trained
    assert history[-1]["total"] < 0.7 * history[0]["total"]
    assert history[-1]["acc"] > history[0]["acc"] + 0.1


@pytest.mark.parametrize("tree", [4, StaticTree.full([2, 2]), DynamicTree(depth=3, topk=3, total=10)],
                         ids=["chain", "static", "dynamic"])
@pytest.mark.parametrize("batch", [1, 3])
def test_eagle_greedy_matches_generate(trained, tree, batch):
    target, head, _ = trained
    ids, mask = ragged_prompts(batch, seed=9)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
                               eos_token_id=None)
    out = speculative_generate(target, EagleDrafter(head, target), ids, attention_mask=mask, max_new_tokens=24,
                               tree=tree,
                               stopping=StoppingConfig.never())
    assert torch.equal(out.sequences, expected)
    assert out.stats.mean_accepted_length > 1.2  # the trained head gets drafts accepted


def test_eagle_sampling_uses_full_vocabulary_probabilities(trained):
    target, head, _ = trained
    drafter = EagleDrafter(head, target)
    ids = torch.tensor([[5, 17, 42, 9]])
    drafter.start(Prompt.build(ids), Features(hidden=torch.zeros(1, 3, 64)))
    tree = drafter.propose(ids[:, -1], __import__("multispec").Chain(3), SamplingConfig(do_sample=True),
                           torch.Generator().manual_seed(0))
    assert tree.draft_probs.shape == (1, 3, 128)
    assert torch.allclose(tree.draft_probs.sum(-1), torch.ones(1, 3))
    outside = torch.ones(128, dtype=torch.bool)
    outside[head.d2t] = False
    assert (tree.draft_probs[..., outside] == 0).all()  # tokens outside the draft vocabulary get q = 0
    assert torch.isin(tree.tokens, head.d2t).all()


def test_save_load_round_trip(trained, tmp_path):
    target, head, _ = trained
    head.save(tmp_path)
    loaded = EagleHead.load(tmp_path)
    assert torch.equal(loaded.d2t, head.d2t)
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        a, _ = head(x)
        b, _ = loaded(x)
    assert torch.allclose(a, b, atol=2e-2)  # stored in fp16


def test_mismatched_head_is_refused(trained):
    target, _, _ = trained
    wrong = EagleHead(EagleConfig(hidden_size=64, draft_vocab_size=32, target_vocab_size=512))
    with pytest.raises(ValueError, match="head: trained for a vocabulary of 512"):
        EagleDrafter(wrong, target)
    with pytest.raises(FileNotFoundError, match="folder"):
        EagleHead.load("/nonexistent")


@pytest.mark.parametrize("d2t,message", [
    (torch.tensor([0, 1, 1, 3]), "repeated: \\[1\\]"),  # a repeat would drop probability mass
    (torch.tensor([0, 1, 2, 128]), "vocabulary \\[0, 128\\)"),
    (torch.tensor([0, -1, 2, 3]), "vocabulary"),
    (torch.tensor([0, 1, 2]), "shape \\(4,\\)"),
    (torch.tensor([0.0, 1.0, 2.0, 3.0]), "integer"),
])
def test_bad_d2t_maps_are_refused(d2t, message):
    config = EagleConfig(hidden_size=64, draft_vocab_size=4, target_vocab_size=128, intermediate_size=32,
                         num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="d2t: .*" + message):
        EagleHead(config, d2t)


def test_sliding_window_head_is_lossless_past_its_window():
    """The zoo's trained head attends to its last 128 positions only; ragged prompts of 200-330 bytes plus 40
    new tokens run it far past its window: lossless, with most drafts accepted."""
    from multispec import zoo

    pair = zoo.load("stdlib-bytes")
    assert pair.drafter.head.config.sliding_window == 128
    ids, mask = source_prompts()
    expected = pair.target.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0,
                                    eos_token_id=None)
    for tree in (3, DynamicTree(depth=3, topk=2, total=6)):
        out = speculative_generate(pair.target, pair.drafter, ids, attention_mask=mask, max_new_tokens=40, tree=tree,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences, expected)
        assert out.stats.mean_accepted_length >= 2.0, out.stats


def test_skipped_steps_catch_up_to_a_fresh_start(trained):
    """After steps drafted by someone else, the head's state equals one started on the whole text."""
    from multispec import Chain, DraftTree, Greedy, HFCausalLM

    target, head, _ = trained
    ids = torch.tensor([[7, 21, 33, 5, 90, 12, 64]])
    mask = torch.ones_like(ids)
    full = target.generate(ids, max_new_tokens=9, do_sample=False, pad_token_id=0, eos_token_id=None)
    greedy = SamplingConfig()
    tgt, skipping = HFCausalLM(target), EagleDrafter(head, target)
    request = skipping.feature_request
    prefilled = tgt.prefill(Prompt(ids, mask), request)
    roots = prefilled.roots
    skipping.start(Prompt(ids, mask), prefilled.features)
    done = ids.shape[1]
    for k in (3, 2):  # two steps whose drafts come from elsewhere (the target's own continuation)
        draft = DraftTree.chain(full[:, done:done + k])
        scored = tgt.score(torch.cat([roots[:, None], draft.tokens], 1), draft.full_parents(), draft.full_valid(),
                           request)
        verdict = Greedy().accept(draft, scored.logits, greedy)
        assert int(verdict.num_accepted) == k
        tgt.commit(verdict.path)
        skipping.commit(draft, verdict, scored.features)
        roots = verdict.tokens[:, k]
        done += k + 1
    fresh_target, fresh = HFCausalLM(target), EagleDrafter(head, target)
    prefix = full[:, :done]  # the prompt, every committed token and the pending root
    fresh.start(Prompt.build(prefix), fresh_target.prefill(Prompt.build(prefix), request).features)
    assert torch.equal(roots, prefix[:, -1])
    sample = SamplingConfig(do_sample=True)
    a = skipping.propose(roots, Chain(4), sample, torch.Generator().manual_seed(5))
    b = fresh.propose(roots, Chain(4), sample, torch.Generator().manual_seed(5))
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.draft_probs, b.draft_probs, atol=1e-4)


def test_hybrid_drafter_is_lossless_and_uses_both_sources(trained):
    """On the zoo's trained byte pair and real source code (which repeats itself), both the lookup and the
    EAGLE head draft, and both get drafts accepted."""
    from multispec import HybridDrafter, zoo

    pair = zoo.load("stdlib-bytes")
    ids, mask = source_prompts()
    expected = pair.target.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0,
                                    eos_token_id=None)
    for tree in (3, DynamicTree(depth=3, topk=2, total=6)):
        hybrid = HybridDrafter(pair.drafter, lookup_k=4, min_ngram=2)
        out = speculative_generate(pair.target, hybrid, ids, attention_mask=mask, max_new_tokens=40, tree=tree,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences, expected)
        assert hybrid.lookup_steps > 0 and hybrid.model_steps > 0
        assert out.stats.mean_accepted_length >= 2.0, out.stats
    target, head, _ = trained
    from multispec import Drafter

    class Stubborn(Drafter):  # a drafter that must see every step it is committed
        pass

    with pytest.raises(TypeError, match="model: Stubborn cannot skip steps"):
        HybridDrafter(Stubborn())
    with pytest.raises(ValueError, match="min_draft"):
        HybridDrafter(EagleDrafter(head, target), lookup_k=2, min_draft=3)
