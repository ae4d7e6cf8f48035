"""Token Recycling and SuffixDecoding: their data structures do what the papers say, and speculation with
them is lossless (greedy equals `generate`; sampling passes chi-square) with drafts really accepted, on
attention and state-space targets, alone and inside `HybridDrafter`."""

import numpy as np
import pytest
import torch

from multispec.prompt import Prompt
from multispec import (DynamicTree, HybridDrafter, SamplingConfig, StaticTree, StoppingConfig, SuffixDecodingDrafter,
                       TokenRecyclingDrafter, speculative_generate, zoo)
from multispec.drafters.recycling import cpu_tree, paper_tree, tree_from_text, tree_to_text
from multispec.drafters.suffix import CorpusIndex, TextIndex, best_speculation, speculate, suffix_array
from multispec.testing import chi_square_pvalue, first_two_token_dists, greedy_rows_alone, source_prompts


# ---- Token Recycling ------------------------------------------------------------------------------------


def test_recycling_reads_trees_out_of_its_matrix_and_overwrites_rows():
    d = TokenRecyclingDrafter(k=3, seed_from_prompt=False)
    ids = torch.tensor([[4, 5, 6]])
    d.start(Prompt(ids, torch.ones_like(ids)))
    d.matrix = torch.full((10, 3), -1)
    d.matrix[6] = torch.tensor([7, 8, -1])
    d.matrix[7] = torch.tensor([9, 1, 2])
    tree = d.propose(torch.tensor([6]), StaticTree([[0], [1], [2], [0, 0], [0, 1], [1, 0]]), SamplingConfig())
    # root 6 -> ranks 0, 1, 2 = 7, 8, (none); 7 -> 9, 1; 8 -> (none yet)
    assert tree.tokens[0, [0, 1, 3, 4]].tolist() == [7, 8, 9, 1]
    assert tree.valid[0].tolist() == [True, True, False, True, True, False]
    assert tree.parents[0].tolist() == [-1, -1, -1, 0, 0, 1]
    # verification's logits after every node: token 7 appears twice (last occurrence wins), 3 is invalid
    tokens = torch.tensor([[6, 7, 3, 7]])
    logits = torch.zeros(1, 4, 10)
    for node, best in enumerate([[1, 2, 3], [4, 5, 6], [7, 8, 9], [5, 0, 9]]):
        logits[0, node, best] = torch.tensor([3.0, 2.0, 1.0])
    d.observe(tokens, logits, torch.tensor([[True, True, False, True]]))
    assert d.matrix[6].tolist() == [1, 2, 3] and d.matrix[7].tolist() == [5, 0, 9]
    assert d.matrix[3].tolist() == [-1, -1, -1]  # an invalid node writes nothing
    with pytest.raises(ValueError, match="tree: a rank of 3 needs more than the k=3"):
        d.propose(torch.tensor([6]), StaticTree([[3]]), SamplingConfig())
    with pytest.raises(TypeError, match="tree: Token Recycling reads static trees"):
        d.propose(torch.tensor([6]), DynamicTree(2, 2, 3), SamplingConfig())


def test_recycling_prompt_seeding_fills_only_empty_rows():
    d = TokenRecyclingDrafter(k=2)
    ids = torch.tensor([[0, 3, 4, 3, 5]])
    d.start(Prompt(ids, torch.tensor([[0, 1, 1, 1, 1]])))  # the padded first token is no bigram
    assert d.matrix[3, 0] == 5 and d.matrix[4, 0] == 3 and d.matrix[0, 0] == -1
    d.matrix[4] = torch.tensor([9, 8])
    d.start(Prompt(torch.tensor([[4, 1]]), torch.ones(1, 2, dtype=torch.long)))
    assert d.matrix[4].tolist() == [9, 8]  # observed candidates are kept


def test_paper_template_shape():
    tree = paper_tree()
    depths = [len(c) for c in tree.choices]
    assert [depths.count(d) for d in range(1, 7)] == [8, 21, 25, 15, 8, 3]


def test_recycling_tree_text_round_trips_and_refuses_bad_text():
    """The form a pair's draft_shape.json stores its chosen tree in."""
    tree = tree_from_text("0,1,0.0,0.0.1")
    assert tree.choices == ((0,), (1,), (0, 0), (0, 0, 1))
    assert tree_from_text(tree_to_text(tree)) == tree
    assert tree_from_text("cpu") == cpu_tree() and tree_from_text(tree_to_text(cpu_tree())) == cpu_tree()
    for bad in ("", "0,a", "0.0"):  # empty, not a rank, a path without its parent
        with pytest.raises(ValueError, match="tree|choices"):
            tree_from_text(bad)


# ---- SuffixDecoding -------------------------------------------------------------------------------------


def test_suffix_array_sorts_suffixes():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 64, 500):
        text = rng.integers(0, 3, n)
        assert suffix_array(text).tolist() == sorted(range(n), key=lambda i: text[i:].tolist())


def test_speculation_scores_are_empirical_probabilities():
    # after "ab": "c" twice, "d" twice; after "abc" always " "; after "abc " always "a"
    text = np.array([ord(c) for c in "abc abd abc abd ab"])
    index = TextIndex(text)
    matches = index.matches(text, exclude_end=True)  # the final "ab" is the pattern, not an occurrence
    assert [len(m) for m in matches[:3]] == [4, 4, 3]  # "b", "ab", " ab"
    tree = speculate(index, index.root(matches[1]), budget=3, min_prob=0.1, tree=True)
    assert [chr(t) for t in tree.tokens] == ["c", "d", " "]  # best first: c .5, d .5, then "c " .5
    assert tree.parents == [-1, -1, 0]
    assert tree.score == pytest.approx(1.5)
    path = speculate(index, index.root(matches[1]), budget=3, min_prob=0.1, tree=False)
    assert [chr(t) for t in path.tokens] == ["c", " ", "a"] and path.parents == [-1, 0, 1]
    assert speculate(index, index.root(matches[1]), budget=3, min_prob=0.6, tree=True).tokens == []
    # the same counts through a suffix array over the text without its final "ab"
    corpus = CorpusIndex(text[:-2], cache_dir=None)
    c_matches = corpus.matches(np.array([ord("a"), ord("b")]))
    c_tree = speculate(corpus, corpus.root(c_matches[1]), budget=3, min_prob=0.1, tree=True)
    assert c_tree.tokens == tree.tokens and c_tree.parents == tree.parents
    assert c_tree.score == pytest.approx(tree.score)


def test_adaptive_length_and_source_choice():
    text = np.array([1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3, 4])
    own = TextIndex(text)
    best = best_speculation([(own, True)], text, cap=16, alpha=1.0, min_prob=0.1, tree=True)
    assert best.match_length == 4 and best.tokens == [5, 6, 9, 9]  # a 4-token match earns 4 tokens
    half = best_speculation([(own, True)], text, cap=16, alpha=0.5, min_prob=0.1, tree=True)
    assert half.tokens == [5, 6]
    capped = best_speculation([(own, True)], text, cap=1, alpha=1.0, min_prob=0.1, tree=True)
    assert capped.tokens == [5]


# ---- lossless end to end --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def byte_pair():
    return zoo.load("stdlib-bytes")


def _drafters():
    from multispec.zoo.data import read_source, stdlib_files

    corpus = [list(read_source(f).encode()) for f in stdlib_files("train")[:40]]
    return {
        "recycling-static": (lambda: TokenRecyclingDrafter(), StaticTree.full([4, 2, 1, 1])),
        "recycling-paper-tree": (lambda: TokenRecyclingDrafter(), paper_tree()),
        "suffix-chain": (lambda: SuffixDecodingDrafter(), 8),
        "suffix-tree-corpus": (lambda: SuffixDecodingDrafter(corpus=corpus), DynamicTree(depth=4, topk=4, total=16)),
        "hybrid-suffix-recycling": (lambda: HybridDrafter(TokenRecyclingDrafter(), lookup=SuffixDecodingDrafter()),
                                    StaticTree.full([3, 2, 1])),
        # prompt lookup first, the corpus suffix chain where it finds nothing (bench text's hybrid_ngram_suffix)
        "hybrid-ngram-suffix-corpus": (lambda: HybridDrafter(SuffixDecodingDrafter(corpus=corpus), lookup_k=6), 6),
    }


DRAFTERS = list(_drafters())


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", DRAFTERS)
def test_training_free_drafters_are_lossless_and_accepted(byte_pair, name, batch):
    make, tree = _drafters()[name]
    drafter = make()
    ids, mask = source_prompts((400, 260, 330)[:batch])
    want = greedy_rows_alone(byte_pair.target, ids, mask, 40)
    steps = [0, 0]  # a hybrid's lookup and model steps over both generations
    for _ in range(2):  # the second generation starts from what the first left (hot start / history)
        out = speculative_generate(byte_pair.target, drafter, ids, attention_mask=mask, max_new_tokens=40, tree=tree,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences[:, -40:], want)
        if isinstance(drafter, HybridDrafter):
            steps = [steps[0] + drafter.lookup_steps, steps[1] + drafter.model_steps]
    assert out.stats.mean_accepted_length >= 1.5, out.stats
    if name.startswith("hybrid-ngram"):  # both parts drafted, and verification kept the output
        assert steps[0] > 0 and steps[1] > 0, steps


@pytest.mark.parametrize("name", ["recycling-static", "suffix-chain"])
def test_training_free_drafters_on_an_ssm_target(name):
    """The zoo's trained byte-level Mamba-2 target, batch 2 of held-out source."""
    target = zoo.load("stdlib-mamba2").target
    make, tree = _drafters()[name]
    ids, mask = source_prompts((300, 200))
    want = greedy_rows_alone(target, ids, mask, 30)
    drafter = make()
    for _ in range(2):
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=30, tree=tree,
                                   stopping=StoppingConfig.never())
        assert torch.equal(out.sequences[:, -30:], want)
    assert out.stats.mean_accepted_length >= 1.5, out.stats


@pytest.mark.slow
@pytest.mark.parametrize("name", ["recycling-static", "suffix-chain"])
def test_sampling_with_training_free_drafts_reproduces_the_target(byte_pair, name):
    """2,000 rows, two tokens each (a 10% token moved by 4.1 points is caught with 90% power: these check
    the plumbing, tests/kernels the rule's fine-grained power), on the trained byte target and a prompt
    that repeats itself, so both drafters have something to draft."""
    target = byte_pair.target
    text = "x = 1\nx = 1\nx = 1\nx ="
    prompt = torch.tensor(list(text.encode()))
    settings = dict(temperature=0.9, top_k=12)
    make, tree = _drafters()[name]
    drafter = make()
    # a first generation fills the recycling matrix with the target's candidates (a hot start)
    speculative_generate(target, drafter, prompt[None], max_new_tokens=16, tree=tree,
                         stopping=StoppingConfig.never())
    out = speculative_generate(target, drafter, prompt.expand(2000, -1).contiguous(), max_new_tokens=2, tree=tree,
                               generator=torch.Generator().manual_seed(0),
                               sampling=SamplingConfig(do_sample=True, **settings), stopping=StoppingConfig.never())
    p1, p2 = first_two_token_dists(target, prompt, SamplingConfig(do_sample=True, **settings))
    assert chi_square_pvalue(out.sequences[:, -2], p1) > 1e-3
    assert chi_square_pvalue(out.sequences[:, -1], p2) > 1e-3
    assert out.stats.accepted > 0.3 * 2000  # one-hot drafts, accepted with the target's probability


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="k"):
        TokenRecyclingDrafter(k=0)
    with pytest.raises(ValueError, match="alpha"):
        SuffixDecodingDrafter(alpha=0)
    with pytest.raises(ValueError, match="min_token_prob"):
        SuffixDecodingDrafter(min_token_prob=1.5)
    with pytest.raises(ValueError, match="max_depth"):
        SuffixDecodingDrafter(max_depth=0)
    with pytest.raises(TypeError, match="lookup"):
        HybridDrafter(TokenRecyclingDrafter(), lookup="ngram")
