"""Dynamic NTK RoPE lossless on every step (`multispec.targets.dynamic_rope`): each token rotated with the
frequencies `generate` used at its position, the committed cache equal to `generate`'s, the module's state left as
`generate` leaves it.

The model is the one `make_decoder("llama-rope-dynamic")` builds: original context 16, queries and keys scaled by 6
so that attention is sharp and the logits depend on the frequencies. Mutation each test must catch (checked by
hand): rotating every node of a verify with its deepest node's frequencies (the module's own update, as before
this schedule) differed from `generate` on 4 of 10 seeds at B = 1, both steps; prefilling the prompt minus its
last token at that shorter length (the first version's prefill) differed on the cache test; leaving the module's
state at the verify's deepest node differed on the state test."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from multispec import EngineConfig, Session, StoppingConfig, speculative_generate
from multispec.drafters.controlled import ControlledDrafter
from multispec.targets.dynamic_rope import DynamicNTK
from multispec.targets.hf import HFCausalLM
from multispec.tree import StaticTree
from multispec.testing import make_decoder, ragged_prompts, sharpen_attention

NEW = 40  # new tokens: generation runs to 2.5-3.5x the original context


def _generate(model, ids, mask, new=NEW):
    return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=None,
                          pad_token_id=0)


def _speculative(model, ids, mask, step, tree=4, new=NEW):
    drafter = ControlledDrafter(model, acceptance=0.8, horizon=new)
    return speculative_generate(model, drafter, ids, attention_mask=mask, max_new_tokens=new, tree=tree,
                                stopping=StoppingConfig.never(), engine=EngineConfig(step=step))


@pytest.mark.parametrize("step", ["eager", "static"])
def test_ten_seeds_of_the_sharp_model_equal_generate(step):
    """The done-when of issue 64: 0 of 10 seeds differ from `generate` (B = 1, chains, drafts accepted)."""
    differ, accepted = [], []
    for seed in range(10):
        model = make_decoder("llama-rope-dynamic", seed=seed)
        ids, mask = ragged_prompts(1, seed=seed)
        want = _generate(model, ids, mask)
        got = _speculative(model, ids, mask, step)
        if not torch.equal(got.sequences[:, : want.shape[1]], want):
            differ.append(seed)
        accepted.append(got.stats.mean_accepted_length)
    assert differ == [], f"{step}: seeds {differ} differ from generate"
    assert min(accepted) > 2.0, accepted  # drafts accepted on every seed: not plain decoding in disguise


@pytest.mark.parametrize("step", ["eager", "static"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_ragged_batches_chains_and_trees_equal_generate(step, shape):
    """Ragged B = 3 (rows 7, 3 and 5 tokens long: their frequencies follow the longest row, as `generate`'s do)."""
    tree = 4 if shape == "chain" else StaticTree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])
    for seed in range(4):
        model = make_decoder("llama-rope-dynamic", seed=seed)
        ids, mask = ragged_prompts(3, seed=seed)
        want = _generate(model, ids, mask)
        got = _speculative(model, ids, mask, step, tree=tree)
        assert torch.equal(got.sequences[:, : want.shape[1]], want), (seed, step, shape)
        assert got.stats.mean_accepted_length > 2.0, got.stats


def test_the_committed_cache_is_generates_cache():
    """After a generation the target's committed keys and values are those of `generate`'s cache, column for
    column (a key rotated with another length's frequencies differs by far more than the tolerance)."""
    model = make_decoder("llama-rope-dynamic", seed=3)
    ids, mask = ragged_prompts(1, seed=3, lengths=(21,))  # past the original context: the prefill grows
    ref = copy.deepcopy(model)
    out = ref.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                       pad_token_id=0, return_dict_in_generate=True)
    target = HFCausalLM(model)
    session = Session(target, ControlledDrafter(model, acceptance=0.8, horizon=NEW), tree=4,
                      stopping=StoppingConfig.never())
    session.append(ids, mask)
    session.generate(NEW)
    assert session.tokens[0] == out.sequences[0].tolist()
    for ours, theirs in zip(target.cache.layers, out.past_key_values.layers):
        n = theirs.keys.shape[2]  # the prompt and every new token but the last
        assert target.width == n
        torch.testing.assert_close(ours.keys[:, :, :n], theirs.keys, rtol=0, atol=2e-5)
        torch.testing.assert_close(ours.values[:, :, :n], theirs.values, rtol=0, atol=2e-5)


@pytest.mark.parametrize("step", ["eager", "static"])
def test_the_module_state_is_left_as_generate_leaves_it(step):
    """Two generations in a row: the second starts from the state the first left (a prompt shorter than the
    grown state rotates with the grown frequencies), so each of ours equals `generate`'s in the same order, and
    the rotary module ends where `generate`'s does."""
    model = make_decoder("llama-rope-dynamic", seed=5)
    ref = copy.deepcopy(model)
    first, second = ragged_prompts(1, seed=5, lengths=(9,)), ragged_prompts(2, seed=6, lengths=(17, 12))
    for ids, mask in (first, second):
        want = _generate(ref, ids, mask, new=24)
        got = _speculative(model, ids, mask, step, new=24)
        assert torch.equal(got.sequences[:, : want.shape[1]], want), step
        ours, theirs = model.model.rotary_emb, ref.model.rotary_emb
        assert int(ours.max_seq_len_cached) == int(theirs.max_seq_len_cached)
        assert torch.equal(ours.inv_freq, theirs.inv_freq)


def test_the_growth_table_is_transformers_own_at_a_real_size():
    """Every length's frequencies equal `transformers`' growth function bit for bit at Llama-3's head size and
    theta (the vectorised formula differs from it in the last bit for about a third of the entries: a 0-d call per
    length is what the update makes)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(vocab_size=32, hidden_size=1024, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64,
                         rope_parameters=dict(rope_type="dynamic", rope_theta=500000.0, factor=4.0))
    ntk = DynamicNTK(LlamaForCausalLM(config).model.rotary_emb)
    ntk.cover(600)
    for n in (65, 100, 333, 600):
        want, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=torch.tensor(n))
        assert torch.equal(ntk.table[n], want), n


def test_a_hybrid_with_dynamic_rope_equals_generate_on_the_eager_step():
    """Bamba's attention layers rotate through the hybrid's own layer loop: per token there too; its fixed-shape
    step refuses the class by name."""
    from transformers import BambaConfig, BambaForCausalLM

    from multispec.ssm.testing import randomised

    torch.manual_seed(0)
    config = BambaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1, 3], mamba_n_heads=8,
                         mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         max_position_embeddings=16, rope_parameters=dict(
                             rope_type="dynamic", rope_theta=10000.0, factor=2.0, partial_rotary_factor=0.5))
    model = BambaForCausalLM(config)
    model = sharpen_attention(randomised(model, 8.0, [l.mamba for l in model.model.layers if hasattr(l, "mamba")]),
                              6.0)
    for rows in (1, 3):
        ids, mask = ragged_prompts(rows, seed=rows)
        want = _generate(model, ids, mask, new=30)
        got = _speculative(model, ids, mask, "eager", new=30)
        assert torch.equal(got.sequences[:, : want.shape[1]], want), rows
        assert got.stats.mean_accepted_length > 2.0
    with pytest.raises(ValueError, match="dynamic NTK RoPE on a hybrid's fixed-shape step is not served"):
        _speculative(model, ids, mask, "static", new=4)


def test_what_cannot_be_made_exact_is_refused_by_name_on_both_steps():
    model = make_decoder("llama-rope-dynamic")
    model.model.second_rope = copy.deepcopy(model.model.rotary_emb)  # two states
    for step in ("eager", "static"):
        with pytest.raises(ValueError, match="2 dynamic rotary embeddings .* not served losslessly"):
            speculative_generate(model, "ngram", torch.tensor([[5, 6, 7]]), max_new_tokens=4,
                                 engine=EngineConfig(step=step))
    model = make_decoder("llama-rope-dynamic")

    class Transposed(type(model.model.rotary_emb)):  # a class that lays its rotation out otherwise
        def forward(self, x, position_ids):
            cos, sin = super().forward(x, position_ids)
            return cos.flip(-1), sin.flip(-1)

    model.model.rotary_emb.__class__ = Transposed
    with pytest.raises(ValueError, match="Transposed .* computes its rotation otherwise"):
        speculative_generate(model, "ngram", torch.tensor([[5, 6, 7]]), max_new_tokens=4)
