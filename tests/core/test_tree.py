import pytest
import torch

from multispec.sampling import SamplingConfig
from multispec.tree import (Chain, DraftTree, DynamicTree, StaticTree, ancestor_mask_from_parents, as_tree_spec,
                            grow_tree)


def _tree():
    # root -> 0 -> 2 ; root -> 1 -> 3 -> 4 ; 0 -> 5
    parents = torch.tensor([[-1, -1, 0, 1, 3, 0]])
    return DraftTree(torch.arange(10, 16)[None], parents, torch.ones(1, 6, dtype=torch.bool))


def test_derived_encodings():
    t = _tree()
    assert t.full_parents().tolist() == [[-1, 0, 0, 1, 2, 4, 1]]
    assert t.depths().tolist() == [[0, 1, 1, 2, 2, 3, 2]]
    fc, ns = t.linked()
    assert fc.tolist() == [[1, 3, 4, -1, 5, -1, -1]]
    assert ns.tolist() == [[-1, 2, -1, 6, -1, -1, -1]]
    anc = t.ancestor_mask()[0]
    assert anc[5].nonzero().flatten().tolist() == [0, 2, 4, 5]
    assert anc[6].nonzero().flatten().tolist() == [0, 1, 6]
    paths = t.paths()[0].tolist()
    assert sorted(paths) == sorted([[0, 1, 3, -1], [0, 2, 4, 5], [0, 1, 6, -1]])


def test_invalid_nodes_are_not_linked():
    t = DraftTree.chain(torch.tensor([[4, 5, 6], [7, 8, 9]]), lengths=torch.tensor([3, 1]))
    fc, _ = t.linked()
    assert fc.tolist() == [[1, 2, 3, -1], [1, -1, -1, -1]]


def test_bad_parents_rejected():
    with pytest.raises(ValueError, match="parents"):
        DraftTree(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-1, 1]]), torch.ones(1, 2, dtype=torch.bool))


def test_static_tree_spec_validation():
    with pytest.raises(ValueError, match="choices"):
        StaticTree([(0, 1)])
    assert StaticTree.full([2, 2]).max_nodes == 6
    with pytest.raises(ValueError, match="tree: the one named shape is 'auto'"):
        as_tree_spec("wide")
    with pytest.raises(TypeError, match="tree"):
        as_tree_spec(2.5)
    assert as_tree_spec(5) == Chain(5)


def _feed_from_table(table):
    """A fake drafter whose next-token logits depend only on the fed token."""
    def feed(ids, tokens, parents):
        return table[tokens]
    return feed


def test_dynamic_tree_keeps_best_nodes_and_is_ancestor_closed():
    torch.manual_seed(0)
    v = 11
    table = torch.randn(v, v) * 3
    root = table[3][None].repeat(2, 1)
    spec = DynamicTree(depth=3, topk=3, total=7)
    tree = grow_tree(spec, root, _feed_from_table(table), SamplingConfig())
    assert tree.tokens.shape == (2, 7)
    # brute force: all nodes of the expansion with their cumulative log-probs
    logp = torch.log_softmax(table, -1)
    first = torch.topk(logp[3], 3)
    cands = [((int(t),), float(s)) for t, s in zip(first.indices, first.values)]
    frontier = cands
    for _ in range(2):
        children = []
        for path, score in frontier:
            top = torch.topk(logp[path[-1]], 3)
            children += [(path + (int(t),), score + float(s)) for t, s in zip(top.indices, top.values)]
        cands += children
        frontier = sorted(children, key=lambda c: -c[1])[:3]
    best = sorted(cands, key=lambda c: -c[1])[:7]
    got = set()
    par = tree.parents[0].tolist()
    for i in range(7):
        path, j = [], i
        while j >= 0:
            assert j < i or j == i
            path.append(int(tree.tokens[0, j]))
            j = par[j]
        got.add(tuple(path[::-1]))
    assert got == {p for p, _ in best}


def test_static_tree_uses_ranks():
    table = torch.arange(6.0).repeat(6, 1)  # token 5 is best, then 4, ...
    tree = grow_tree(StaticTree([(0,), (1,), (0, 0), (0, 2)]), table[0][None], _feed_from_table(table),
                     SamplingConfig())
    assert tree.tokens.tolist() == [[5, 4, 5, 3]]
    assert tree.parents.tolist() == [[-1, -1, 0, 0]]


def test_chain_growth_samples_with_probs():
    table = torch.randn(7, 7)
    g = torch.Generator().manual_seed(0)
    tree = grow_tree(Chain(4), table[0][None].repeat(5, 1), _feed_from_table(table),
                     SamplingConfig(do_sample=True, temperature=0.7), g)
    assert tree.is_chain and tree.draft_probs.shape == (5, 4, 7)
    assert torch.allclose(tree.draft_probs[:, 0], torch.softmax(table[0] / 0.7, -1).expand(5, -1))


def test_trimmed_drops_only_columns_invalid_in_every_row():
    tokens = torch.tensor([[4, 5, 6, 7], [8, 9, 1, 2]])
    tree = DraftTree.chain(tokens, torch.tensor([2, 1]), draft_probs=torch.rand(2, 4, 10))
    cut = tree.trimmed()
    assert cut.num_nodes == 2 and torch.equal(cut.tokens, tokens[:, :2])
    assert torch.equal(cut.valid, tree.valid[:, :2]) and cut.draft_probs.shape == (2, 2, 10)
    assert DraftTree.chain(tokens, torch.tensor([0, 0])).trimmed().num_nodes == 0
    full = DraftTree.chain(tokens)
    assert full.trimmed() is full
    # an invalid node in the middle stays: indices of later nodes must not move
    mid = DraftTree(tokens, torch.tensor([[-1, -1, 0, 0], [-1, -1, 0, 0]]),
                    torch.tensor([[True, False, True, False], [True, False, False, False]]))
    assert mid.trimmed().num_nodes == 3


@pytest.mark.parametrize("t", [1, 2, 5, 17, 40])
def test_ancestor_mask_equals_walking_up_each_node(t):
    g = torch.Generator().manual_seed(t)
    rows = []
    for _ in range(3):  # random forests: node i's parent is -1 or any earlier node
        rows.append([int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(t)])
    parents = torch.tensor(rows)
    mask = ancestor_mask_from_parents(parents)
    for r in range(3):
        for i in range(t):
            want, j = set(), i
            while j >= 0:
                want.add(j)
                j = rows[r][j]
            assert set(torch.nonzero(mask[r, i]).flatten().tolist()) == want, (r, i)


def test_siblings_drawn_without_replacement():
    """Gumbel-top-k draws: distinct tokens; draw j comes from q minus the earlier draws; the first draw is
    a sample of q and the second of E[q minus the first] (chi-square); rows of q with fewer than k tokens
    mark the missing draws."""
    from multispec.testing import chi_square_pvalue
    from multispec.tree import draw_siblings, without_earlier

    g = torch.Generator().manual_seed(0)
    n = 20000
    q = torch.softmax(torch.randn(1, 12, generator=g) * 1.5, dim=-1).expand(n, 12).contiguous()
    tokens, ok = draw_siblings(q, 3, g)
    assert ok.all()
    assert (tokens[:, 0] != tokens[:, 1]).all() and (tokens[:, 1] != tokens[:, 2]).all()
    assert (tokens[:, 0] != tokens[:, 2]).all()
    q_each = [without_earlier(q, tokens, torch.full((n,), j)) for j in range(3)]
    assert torch.equal(q_each[0], q)
    for j in range(3):
        assert torch.allclose(q_each[j].sum(-1), torch.ones(n))
        assert (q_each[j].gather(1, tokens[:, :j]) == 0).all()
    assert chi_square_pvalue(tokens[:, 0], q[0]) > 1e-3
    assert chi_square_pvalue(tokens[:, 1], q_each[1].mean(0)) > 1e-3
    sparse = torch.zeros(2, 12)
    sparse[:, 3], sparse[:, 7] = 0.25, 0.75
    _, ok = draw_siblings(sparse, 3, g)
    assert ok[:, :2].all() and not ok[:, 2].any()


def _paths_by_walking(parents, valid):
    """The plain reference: walk up from every valid leaf."""
    out = []
    for par, val in zip(parents.tolist(), valid.tolist()):
        children = {p for p, v in zip(par, val) if v and p >= 0}
        rows = []
        for i, v in enumerate(val):
            if v and i not in children:
                path, j = [], i
                while j >= 0:
                    path.append(j)
                    j = par[j]
                rows.append(path[::-1])
        out.append(rows)
    return out


def test_vectorised_paths_and_depths_equal_walking_the_tree():
    from multispec.tree import depths_from_parents, root_to_leaf_paths

    g = torch.Generator().manual_seed(0)
    for t in (1, 2, 7, 19):
        parents = torch.tensor([[-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)]
                                for _ in range(3)])
        valid = torch.rand(3, t, generator=g) < 0.8
        valid[:, 0] = True
        # an invalid node's descendants are invalid too (the trees' contract)
        for i in range(1, t):
            valid[:, i] &= valid.gather(1, parents[:, i:i + 1].clamp(min=0))[:, 0]
        want = _paths_by_walking(parents, valid)
        got = root_to_leaf_paths(parents, valid)
        for r in range(3):
            rows = [[j for j in p if j >= 0] for p in got[r].tolist()]
            assert [p for p in rows if p] == want[r], (t, r)
        depth = depths_from_parents(parents)
        for r in range(3):
            for i in range(t):
                d, j = 0, int(parents[r, i])
                while j >= 0:
                    d, j = d + 1, int(parents[r, j])
                assert int(depth[r, i]) == d
