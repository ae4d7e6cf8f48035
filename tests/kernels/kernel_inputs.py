"""Random inputs with the awkward cases the verification kernels must survive."""

from __future__ import annotations

import torch

from multispec.tree import DraftTree


def chain_case(b: int, k: int, v: int, seed: int, with_q: bool):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2.5, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2.5, -1) if with_q else None
    # drafts: a mix of the target's argmax (so greedy rows accept), samples of q, and junk ids
    drafts = torch.randint(0, v, (b, k), generator=g)
    follow = torch.rand(b, k, generator=g) < 0.6
    drafts = torch.where(follow, p[:, :k].argmax(-1), drafts)
    drafts[b // 5] = -1  # ids out of vocabulary must be rejected, never indexed
    drafts[b // 4, 0] = v
    num = torch.randint(0, k + 1, (b,), generator=g)
    num[0], num[1] = 0, k  # a row with zero drafts, one with all
    uniforms = torch.rand(b, k, generator=g)
    uniforms[2, :] = 0.0  # u == 0: accepts iff p(x) > 0
    noise = torch.empty(b, v).exponential_(generator=g)
    greedy = torch.rand(b, generator=g) < 0.3
    p[3, 1] = float("nan")  # a NaN row
    p[4] = float("nan")  # an all-NaN row
    return drafts, num, p, q, uniforms, noise, greedy


def random_tree(b: int, n: int, v: int, seed: int, dup_siblings: bool = True):
    """Random trees, one per row, with ragged validity and duplicate sibling tokens."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.empty(b, n, dtype=torch.long)
    for i in range(n):
        parents[:, i] = torch.randint(-1, i, (b,), generator=g) if i else -1
    tokens = torch.randint(0, v, (b, n), generator=g)
    valid = torch.ones(b, n, dtype=torch.bool)
    cut = torch.randint(0, n + 1, (b,), generator=g)  # rows keep a prefix of their nodes
    valid &= torch.arange(n)[None, :] < cut[:, None]
    if dup_siblings:
        for r in range(b):  # give two children of the root the same token
            kids = (parents[r] == -1).nonzero().flatten()
            if len(kids) >= 2:
                tokens[r, kids[1]] = tokens[r, kids[0]]
    return DraftTree(tokens, parents, valid)


def tree_case(b: int, n: int, v: int, seed: int, with_q: bool):
    g = torch.Generator().manual_seed(seed + 1)
    tree = random_tree(b, n, v, seed)
    t = n + 1
    p = torch.softmax(torch.randn(b, t, v, generator=g) * 2.5, -1)
    # make children often equal to the target's argmax after their parent, so paths get accepted
    full_parents = tree.full_parents()
    argmax = p.argmax(-1)
    follow = torch.rand(b, n, generator=g) < 0.5
    parent_argmax = argmax.gather(1, full_parents[:, 1:].clamp(min=0))
    tree.tokens = torch.where(follow, parent_argmax, tree.tokens)
    fc, ns = tree.linked()
    tokens = torch.cat([torch.zeros(b, 1, dtype=torch.long), tree.tokens], 1)
    q = torch.softmax(torch.randn(b, t, v, generator=g) * 2.5, -1) if with_q else None
    uniforms = torch.rand(b, t, generator=g)
    uniforms[1] = 0.0
    noise = torch.empty(b, v).exponential_(generator=g)
    greedy = torch.rand(b, generator=g) < 0.3
    p[2, 0] = float("nan")
    p[3] = float("nan")
    return tokens, fc, ns, p, q, uniforms, noise, greedy
