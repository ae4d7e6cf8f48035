import torch

from multispec.prompt import Prompt
from multispec import Chain, NGramDrafter, SamplingConfig, StoppingConfig, speculative_generate
from multispec.rules import Verdict
from multispec.testing import make_perturbed_copy, make_target, ragged_prompts


def test_stats_account_for_every_token():
    target = make_target("qwen2")
    ids, mask = ragged_prompts(3, seed=2)
    out = speculative_generate(target, make_perturbed_copy(target), ids, attention_mask=mask, max_new_tokens=17, tree=3,
                               stopping=StoppingConfig.never())
    st = out.stats
    assert st.committed == 3 * 17 == sum(out.num_new_tokens)
    assert st.target_forwards == len(st.steps)
    assert 1.8 <= st.mean_accepted_length <= 4.0
    assert st.mean_accepted_length == st.committed / sum(s.rows for s in st.steps)
    assert 0.0 <= st.acceptance_rate <= 1.0 and st.accepted <= st.drafted
    assert all(s.committed <= s.accepted + s.rows for s in st.steps)
    assert st.total_s > 0 and st.tokens_per_s > 0
    assert set(st.summary()) >= {"mean_accepted_length", "acceptance_rate", "draft_s", "verify_s", "commit_s"}


def test_ngram_lookup_is_ragged_and_most_recent():
    d = NGramDrafter(max_ngram=2)
    ids = torch.tensor([[0, 0, 7, 8, 9, 7, 8, 4, 7, 8], [0, 0, 0, 0, 0, 0, 0, 1, 2, 3]])
    mask = torch.tensor([[0, 0] + [1] * 8, [0] * 7 + [1] * 3])
    d.start(Prompt(ids, mask))
    tree = d.propose(ids[:, -1], Chain(3), SamplingConfig())
    assert tree.tokens[0].tolist() == [4, 7, 8]  # the latest "7 8" continues with 4
    assert tree.valid.sum(1).tolist() == [3, 0]  # row 1 has no repeated n-gram
    d.commit(tree, Verdict(torch.tensor([[4, 7, -1, -1], [5, -1, -1, -1]]), torch.tensor([1, 0]),
                           torch.tensor([[0, 1, -1, -1], [0, -1, -1, -1]])))
    assert d.history[0][-2:] == [4, 7] and d.history[1][-1] == 5
