"""Draft trees: the flattened candidate trees a drafter proposes and a target verifies in one pass.

A `DraftTree` holds N draft nodes per batch row. Node i has a token, a parent (`-1` = the root, i.e.
the last committed token that the target has not processed yet, otherwise an index < i) and a validity
flag (rows may carry fewer real nodes than N; invalid nodes are padding). A chain is a tree whose
parent of node i is i - 1.

Verification always works on the *full* tree of T = N + 1 nodes where node 0 is the root; the derived
encodings below (`full_parents`, `ancestor_mask`, `depths`, `linked`, `paths`) use that numbering.

Tree shapes are described by specs (`Chain`, `StaticTree`, `DynamicTree`) and grown by `grow_tree`,
which any drafter can drive by providing a `feed` callback that returns its logits for new nodes.
"""

from __future__ import annotations

import functools

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .adaptive import AdaptiveChain
from .host import require
from .sampling import SamplingConfig, check_logits_finite, uniform


@dataclass
class DraftTree:
    """Draft nodes per row. `draft_probs[b, i]` is the distribution node i's token was drawn from
    (None when the drafter chose tokens deterministically: verification then treats q as one-hot)."""

    tokens: torch.Tensor  # [B, N] int64
    parents: torch.Tensor  # [B, N] int64, -1 = root
    valid: torch.Tensor  # [B, N] bool
    draft_probs: torch.Tensor | None = None  # [B, N, V] float32
    is_chain: bool = False
    # ids the nodes had while the drafter grew the tree (its `feed` callback saw these); lets a drafter
    # find its own cache entries for accepted nodes after reranking. None = the node index itself.
    feed_ids: torch.Tensor | None = None
    # every node is valid in every row, known on the host (a full chain, a static tree): `trimmed` needs
    # no read of `valid` then
    dense: bool = False

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"tokens: expected [batch, nodes], got shape {tuple(self.tokens.shape)}")
        if self.parents.shape != self.tokens.shape:
            raise ValueError(f"parents: shape {tuple(self.parents.shape)} != tokens {tuple(self.tokens.shape)}")
        if self.valid.shape != self.tokens.shape:
            raise ValueError(f"valid: shape {tuple(self.valid.shape)} != tokens {tuple(self.tokens.shape)}")
        n = self.tokens.shape[1]
        if n:  # one check (deferred to the step's read on CUDA, see multispec.host)
            index = torch.arange(n, device=self.parents.device)
            require(((self.parents < index) & (self.parents >= -1)).all(), lambda: ValueError(
                "parents: entries must be >= -1 and every node's parent must precede it (parents[b, i] < i)"))
        if self.draft_probs is not None and self.draft_probs.shape[:2] != self.tokens.shape:
            raise ValueError(
                f"draft_probs: shape {tuple(self.draft_probs.shape)} must start with {tuple(self.tokens.shape)}"
            )

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @staticmethod
    def empty(batch_size: int, device: torch.device | str = "cpu") -> "DraftTree":
        z = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        return DraftTree(z, z.clone(), z.bool(), None, is_chain=True, dense=True)

    @staticmethod
    def chain(tokens: torch.Tensor, lengths: torch.Tensor | None = None,
              draft_probs: torch.Tensor | None = None) -> "DraftTree":
        """A chain per row; `lengths[b]` real drafts in row b (the rest is padding)."""
        b, k = tokens.shape
        idx = torch.arange(k, device=tokens.device)
        parents = (idx - 1).expand(b, k).clone()
        if lengths is None:
            valid = torch.ones(b, k, dtype=torch.bool, device=tokens.device)
            return DraftTree(tokens.long(), parents, valid, draft_probs, is_chain=True, dense=True)
        else:
            if lengths.shape != (b,):
                raise ValueError(f"lengths: expected shape ({b},), got {tuple(lengths.shape)}")
            valid = idx[None, :] < lengths[:, None]
        return DraftTree(tokens.long(), parents, valid, draft_probs, is_chain=True)

    def trimmed(self) -> "DraftTree":
        """This tree without its trailing nodes that are invalid in every row (node indices unchanged).

        Drafters pad rows to a common width (a lookup that found 2 of k tokens, a row with no match);
        verifying the padding would cost target compute for nothing. A host read, unless `dense`."""
        if self.dense:
            return self
        used = self.valid.any(dim=0).nonzero()
        n = int(used.max()) + 1 if used.numel() else 0
        if n == self.num_nodes:
            return self
        cut = lambda t: None if t is None else t[:, :n]  # noqa: E731
        return DraftTree(self.tokens[:, :n], self.parents[:, :n], self.valid[:, :n], cut(self.draft_probs),
                         self.is_chain, cut(self.feed_ids))

    def padded(self, num_nodes: int) -> "DraftTree":
        """This tree with invalid nodes appended up to `num_nodes` (node indices unchanged): the target then
        verifies a wider batch of rows, which some CPUs' matrix kernels run faster than a narrower one
        (`multispec.draft_length.VerifyCost.padding`). A padding node is never accepted (rules read only
        valid nodes); in a chain it hangs off the node before it, elsewhere off the root."""
        n = self.num_nodes
        if num_nodes <= n:
            return self
        b, extra, dev = self.batch_size, num_nodes - n, self.tokens.device
        idx = torch.arange(n, num_nodes, device=dev).expand(b, extra)
        parents = idx - 1 if self.is_chain else torch.full_like(idx, -1)
        probs = None
        if self.draft_probs is not None:  # a harmless distribution for nodes no rule reads
            v = self.draft_probs.shape[2]
            probs = torch.cat([self.draft_probs, self.draft_probs.new_full((b, extra, v), 1.0 / v)], 1)
        feed = None if self.feed_ids is None else torch.cat([self.feed_ids, idx.to(self.feed_ids.dtype)], 1)
        return DraftTree(torch.cat([self.tokens, torch.zeros_like(idx)], 1), torch.cat([self.parents, parents], 1),
                         torch.cat([self.valid, torch.zeros(b, extra, dtype=torch.bool, device=dev)], 1), probs,
                         self.is_chain, feed)

    # ---- derived encodings over the full tree (node 0 = root) -------------------------------------
    def full_parents(self) -> torch.Tensor:
        """[B, T] parents with the root prepended: root -> -1, draft node i -> parent + 1."""
        root = torch.full((self.batch_size, 1), -1, dtype=torch.long, device=self.tokens.device)
        return torch.cat([root, self.parents + 1], dim=1)

    def full_valid(self) -> torch.Tensor:
        root = torch.ones(self.batch_size, 1, dtype=torch.bool, device=self.tokens.device)
        return torch.cat([root, self.valid], dim=1)

    def depths(self) -> torch.Tensor:
        """[B, T] depth of each full-tree node (root 0)."""
        return depths_from_parents(self.full_parents())

    def ancestor_mask(self) -> torch.Tensor:
        """[B, T, T] bool: mask[b, i, j] is True when j is i or an ancestor of i."""
        return ancestor_mask_from_parents(self.full_parents())

    def linked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """First-child / next-sibling arrays [B, T] (-1 = none) over valid nodes, siblings in index order."""
        return linked_from_parents(self.full_parents(), self.full_valid())

    def paths(self) -> torch.Tensor:
        """[B, leaves, max_depth + 1] root-to-leaf node paths of the full tree, padded with -1."""
        return root_to_leaf_paths(self.full_parents(), self.full_valid())


def depths_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """[B, T] depth of each node (a root: 0), from its ancestor count (no loop over nodes)."""
    if parents.shape[1] == 0:
        return torch.zeros_like(parents)
    return ancestor_mask_from_parents(parents).sum(dim=-1) - 1


def ancestor_mask_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """[B, T, T] bool, entry (i, j): node j is node i or one of its ancestors (`parents` [B, T], -1 = none).
    Reachability by repeated squaring of (I + parent edges): log2(T) batched matmuls instead of a loop
    over nodes (trees are scored every step, so this is on the hot path)."""
    b, t = parents.shape
    edges = torch.zeros(b, t, t + 1, device=parents.device)
    edges.scatter_(2, torch.where(parents >= 0, parents, t)[..., None], 1.0)
    reach = edges[..., :t] + torch.eye(t, device=parents.device)
    span = 1  # paths of up to `span` edges are covered
    while span < t - 1:
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
        span *= 2
    return reach > 0


def linked_from_parents(parents: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First-child / next-sibling arrays [B, T] (-1 = none) over the valid nodes, siblings in index order:
    from a [B, T, T] "same parent, later index" table instead of a Python loop over rows and nodes."""
    b, t = parents.shape
    idx = torch.arange(t, device=parents.device)
    linked = valid & (parents >= 0)
    # node j is a child of p: child[b, p, j]; node j follows i among i's siblings: later[b, i, j]
    child = linked[:, None, :] & (parents[:, None, :] == idx[None, :, None])
    later = child.gather(1, parents.clamp(min=0)[..., None].expand(b, t, t)) & (idx[None, None, :] > idx[None, :, None])
    later &= linked[:, :, None]
    none = torch.full((), -1, dtype=torch.long, device=parents.device)
    first_child = torch.where(child.any(-1), child.to(torch.int8).argmax(-1), none)
    next_sibling = torch.where(later.any(-1), later.to(torch.int8).argmax(-1), none)
    return first_child, next_sibling


def root_to_leaf_paths(parents: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, leaves, max_depth + 1]: each row's root-to-leaf node paths (leaves in index order), -1 padded.
    Parents precede children, so a node's ancestors in index order are its path: one sort of the ancestor
    mask, no loop over nodes."""
    b, t = parents.shape
    parents = torch.where(valid, parents, -1)
    anc = ancestor_mask_from_parents(parents)
    has_child = torch.zeros(b, t + 1, dtype=torch.bool, device=parents.device)
    has_child.scatter_(1, torch.where(valid & (parents >= 0), parents, t), True)
    leaf = valid & ~has_child[:, :t]
    idx = torch.arange(t, device=parents.device)
    paths = torch.where(anc, idx, t).sort(dim=-1).values  # [B, T, T]: each node's path, then t's
    depth = int(anc.sum(-1).max()) if t else 0
    paths = paths[..., :depth]
    paths = torch.where(paths == t, -1, paths)
    count = leaf.sum(dim=1)
    width = int(count.max()) if b else 0
    order = torch.sort((~leaf).to(torch.int8), dim=1, stable=True).indices[:, :width]
    out = paths.gather(1, order[..., None].expand(-1, -1, depth))
    return torch.where((torch.arange(width, device=parents.device) < count[:, None])[..., None], out, -1)


# ---- tree specs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Chain:
    """Up to k drafted tokens in a line. `min_prob` makes the length adaptive (as SpecDec++ and EAGLE-2
    stop on the draft's confidence): a row stops drafting once the draft's probability of its whole chain
    so far falls below `min_prob` (its first token is always drafted), and drafting ends when every row
    has stopped. Lossless: when to stop depends on the draft alone."""

    k: int
    min_prob: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 0:
            raise ValueError(f"k: expected an int >= 0, got {self.k!r}")
        if self.min_prob is not None and not 0.0 < self.min_prob < 1.0:
            raise ValueError(f"min_prob: expected None or a number in (0, 1), got {self.min_prob!r}")

    @property
    def max_nodes(self) -> int:
        return self.k

    @property
    def feed_ids_bound(self) -> int:
        """Every node id a grower passes to `feed` is below this."""
        return self.k


@dataclass(frozen=True)
class StaticTree:
    """A fixed tree given as Medusa-style choices: each entry is the path of child ranks from the root,
    e.g. `[(0,), (1,), (0, 0), (0, 1), (1, 0)]`. Rank r = the r-th most likely token of the parent's draft
    distribution (when sampling, children are drawn i.i.d. from it instead and ranks only shape the tree)."""

    choices: tuple[tuple[int, ...], ...]

    def __init__(self, choices: Sequence[Sequence[int]]):
        normalized = tuple(sorted({tuple(int(r) for r in c) for c in choices}, key=lambda c: (len(c), c)))
        if not normalized or any(len(c) == 0 for c in normalized):
            raise ValueError("choices: expected a non-empty list of non-empty rank paths")
        present = set(normalized)
        for c in normalized:
            if any(r < 0 for r in c):
                raise ValueError(f"choices: negative rank in {c}")
            if len(c) > 1 and c[:-1] not in present:
                raise ValueError(f"choices: {c} has no parent entry {c[:-1]}")
        object.__setattr__(self, "choices", normalized)

    @property
    def max_nodes(self) -> int:
        return len(self.choices)

    @property
    def feed_ids_bound(self) -> int:
        """Every node id a grower passes to `feed` is below this."""
        return len(self.choices)

    @staticmethod
    def full(branching: Sequence[int]) -> "StaticTree":
        """Every node at depth d gets `branching[d]` children."""
        level: list[tuple[int, ...]] = [()]
        out = []
        for width in branching:
            level = [c + (r,) for c in level for r in range(width)]
            out += level
        return StaticTree(out)


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 dynamic tree: per depth expand the `topk` best frontier nodes (by cumulative draft
    log-probability) into `topk` children each, then keep the best `total` nodes of all depths.

    Greedy: children are the draft's top-k tokens. Sampling: with `sample_children` (the default) they
    are drawn from the draft distribution without replacement and verified by recursive rejection, and
    sibling groups are kept whole, ranked by the parent's score (see `_grow_dynamic_sampled`); with
    `sample_children=False` they are the top-k tokens, verified as one-hot drafts. Both are lossless; the
    sampled children are accepted more often (see BENCHMARKS.md, "State-space targets: STree")."""

    depth: int = 5
    topk: int = 8
    total: int = 48
    sample_children: bool = True

    def __post_init__(self) -> None:
        for name in ("depth", "topk", "total"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if not isinstance(self.sample_children, bool):
            raise ValueError(f"sample_children: expected a bool, got {self.sample_children!r}")
        if self.total > self.topk + (self.depth - 1) * self.topk * self.topk:
            raise ValueError(
                f"total: {self.total} exceeds the {self.topk + (self.depth - 1) * self.topk ** 2} candidates "
                f"that depth={self.depth}, topk={self.topk} produce"
            )

    @property
    def max_nodes(self) -> int:
        return self.total

    @property
    def feed_ids_bound(self) -> int:
        """Every node id a grower passes to `feed` is below this (ids name candidates of the pool)."""
        return self.topk + (self.depth - 1) * self.topk * self.topk


TreeSpec = Chain | StaticTree | DynamicTree
# feed(ids [B, M], tokens [B, M], parents [B, M]) -> draft logits [B, M, V] for M new nodes. `ids` name
# the new nodes; `parents` name nodes fed or created earlier (-1 = root).
FeedFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def as_tree_spec(tree: "TreeSpec | int | str | None", default_k: int = 4) -> TreeSpec:
    """Normalise the `tree=` argument: None -> Chain(default_k), int k -> Chain(k), "auto" -> a new
    `multispec.adaptive.AdaptiveChain` (each step's chain length chosen where it runs; an instance passed in keeps
    what it measured across generations)."""
    if tree is None:
        return Chain(default_k)
    if isinstance(tree, str):
        if tree != "auto":
            raise ValueError(f"tree: the one named shape is 'auto', got {tree!r}")
        return AdaptiveChain()
    if isinstance(tree, AdaptiveChain):
        return tree
    if isinstance(tree, bool):
        raise TypeError("tree: expected None, an int, \"auto\", Chain, StaticTree, DynamicTree or AdaptiveChain, got a bool")
    if isinstance(tree, int):
        return Chain(tree)
    if isinstance(tree, (Chain, StaticTree, DynamicTree)):
        return tree
    raise TypeError(f"tree: expected None, an int, \"auto\", Chain, StaticTree, DynamicTree or AdaptiveChain, got "
                    f"{type(tree).__name__}")


def grow_tree(spec: TreeSpec, root_logits: torch.Tensor, feed: FeedFn, sampling: SamplingConfig,
              generator: torch.Generator | None = None, vocab_map: torch.Tensor | None = None,
              vocab_size: int | None = None, who: str = "draft") -> DraftTree:
    """Grow a draft tree of shape `spec` from the drafter's logits after the root.

    A drafter with a reduced vocabulary (EAGLE-3 style) passes `vocab_map[j]` = the target token id of
    its j-th logit and the target's `vocab_size`: choices happen in the reduced space, while `feed`, the
    returned tokens and the returned draft probabilities are in the target's vocabulary. Non-finite draft
    logits raise an error naming `who`.
    """
    check_logits_finite(root_logits, who)
    checked_feed = feed

    def feed(ids, tokens, parents):  # noqa: F811 - the checked view of the drafter's callback
        logits = checked_feed(ids, tokens, parents)
        check_logits_finite(logits, who)
        return logits

    if vocab_map is not None:
        if vocab_size is None:
            raise ValueError("vocab_size: required with vocab_map")
        inner = feed

        def feed(ids, tokens, parents):  # noqa: F811 - the mapped view of the drafter's callback
            return inner(ids, vocab_map[tokens], parents)

    if isinstance(spec, Chain):
        tree = _grow_chain(spec, root_logits, feed, sampling, generator)
    elif isinstance(spec, StaticTree):
        tree = _grow_static(spec, root_logits, feed, sampling, generator)
    elif isinstance(spec, DynamicTree):
        tree = (_grow_dynamic_sampled(spec, root_logits, feed, sampling, generator)
                if sampling.do_sample and spec.sample_children else _grow_dynamic(spec, root_logits, feed, sampling))
    else:
        raise TypeError(f"spec: unsupported tree spec {type(spec).__name__}")
    if vocab_map is not None:
        tree.tokens = vocab_map[tree.tokens]
        if tree.draft_probs is not None:
            q = tree.draft_probs
            full = torch.zeros(*q.shape[:-1], vocab_size, dtype=q.dtype, device=q.device)
            full[..., vocab_map] = q
            tree.draft_probs = full
    return tree


def _grow_chain(spec: Chain, logits: torch.Tensor, feed: FeedFn, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
    b = logits.shape[0]
    if spec.k == 0:
        return DraftTree.empty(b, logits.device)
    tokens, probs = [], []
    path_prob = torch.ones(b, device=logits.device)
    alive = torch.ones(b, dtype=torch.bool, device=logits.device)  # rows still drafting
    length = torch.zeros(b, dtype=torch.long, device=logits.device)  # nodes each row keeps
    for i in range(spec.k):
        tok, q = sampling.pick(logits, generator)
        tokens.append(tok)
        probs.append(q)
        if spec.min_prob is not None and i > 0:
            dist = q if q is not None else sampling.probs(logits)
            path_prob = path_prob * dist.gather(-1, tok[:, None])[:, 0]
            alive &= path_prob >= spec.min_prob
        elif spec.min_prob is not None:
            path_prob = (q if q is not None else sampling.probs(logits)).gather(-1, tok[:, None])[:, 0]
        length = torch.where(alive, i + 1, length)
        if spec.min_prob is not None and not bool(alive.any()):  # (a host read: only an adaptive chain stops)
            break
        if i + 1 < spec.k:
            ids = torch.full((b, 1), i, dtype=torch.long, device=logits.device)
            logits = feed(ids, tok[:, None], ids - 1)[:, 0]
    q = torch.stack(probs, dim=1) if sampling.do_sample else None
    # a fixed chain keeps all k nodes in every row: built dense, so no step reads its lengths back
    return DraftTree.chain(torch.stack(tokens, dim=1), lengths=None if spec.min_prob is None else length,
                           draft_probs=q)


@functools.lru_cache(maxsize=64)
def _static_index(spec: StaticTree, device: torch.device) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """A static tree's index tensors on `device`, built once (a tensor made from a Python list is a
    host-to-device copy on CUDA, which waits for the GPU): per depth d the fed nodes and their parents;
    under 0, (all nodes, every node's parent)."""
    index = {c: i for i, c in enumerate(spec.choices)}
    parent_of = [index[c[:-1]] if len(c) > 1 else -1 for c in spec.choices]
    has_child = {index[c[:-1]] for c in spec.choices if len(c) > 1}
    out = {0: (torch.arange(len(parent_of), device=device), torch.tensor(parent_of, device=device))}
    for d in range(1, max(len(c) for c in spec.choices) + 1):
        fed = [i for i, c in enumerate(spec.choices) if len(c) == d and i in has_child]
        if fed:
            out[d] = (torch.tensor(fed, device=device), torch.tensor([parent_of[i] for i in fed], device=device))
    return out


def _grow_static(spec: StaticTree, root_logits: torch.Tensor, feed: FeedFn, sampling: SamplingConfig,
                 generator: torch.Generator | None) -> DraftTree:
    b, device = root_logits.shape[0], root_logits.device
    index = {c: i for i, c in enumerate(spec.choices)}
    parent_of = [index[c[:-1]] if len(c) > 1 else -1 for c in spec.choices]
    has_child = {index[c[:-1]] for c in spec.choices if len(c) > 1}
    n = len(spec.choices)
    tokens = torch.zeros(b, n, dtype=torch.long, device=device)
    q_all = torch.zeros(b, n, root_logits.shape[-1], device=device) if sampling.do_sample else None
    node_logits: dict[int, torch.Tensor] = {-1: root_logits}
    max_depth = max(len(c) for c in spec.choices)
    for d in range(1, max_depth + 1):
        level = [i for i, c in enumerate(spec.choices) if len(c) == d]
        for i in level:
            parent_logits = node_logits[parent_of[i]]
            if sampling.do_sample:
                tok, q = sampling.pick(parent_logits, generator)
                tokens[:, i], q_all[:, i] = tok, q
            else:
                rank = spec.choices[i][-1]
                proc = torch.nan_to_num(sampling.process(parent_logits), nan=float("-inf"))
                tokens[:, i] = torch.topk(proc, rank + 1, dim=-1).indices[:, rank]
        to_feed = [i for i in level if i in has_child]
        if to_feed:
            ids, parents = _static_index(spec, device)[d]
            out = feed(ids.expand(b, -1).contiguous(), tokens.index_select(1, ids), parents.expand(b, -1).contiguous())
            for j, i in enumerate(to_feed):
                node_logits[i] = out[:, j]
    parents = _static_index(spec, device)[0][1].expand(b, n).contiguous()
    valid = torch.ones(b, n, dtype=torch.bool, device=device)
    return DraftTree(tokens, parents, valid, q_all, dense=True)


def _sampled_rank_key(own: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """What a sampled dynamic tree ranks its nodes by when it keeps `total` of them: the score of the
    node's parent (`group`), never the node's own (`own`); the tests swap this for `own` and show the
    output distribution then leaves the target's."""
    return group


def draw_siblings(q: torch.Tensor, k: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`k` tokens per row of q [N, V] drawn *without replacement* (Gumbel-top-k: the keys' order is the
    sequential draw order) and whether each is a real draw ([N, k]; False where q had fewer than k
    tokens). Draw j comes from `without_earlier(q, tokens, j)`."""
    u = uniform(tuple(q.shape), generator, q.device).clamp_(min=1e-20)
    tokens = torch.topk(torch.log(q) - torch.log(-torch.log(u)), k, dim=-1).indices  # [N, k]
    return tokens, q.gather(1, tokens) > 0


def without_earlier(q: torch.Tensor, group: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """What sibling `position` [M] of a group of draws `group` [M, k] was drawn from: q [M, V] without the
    group's earlier draws, renormalised. Recursive rejection against these (the `Exact` rule, sibling by
    sibling) is lossless for draws without replacement."""
    earlier = torch.arange(group.shape[1], device=q.device)[None, :] < position[:, None]
    rest = q.scatter(1, group, torch.where(earlier, 0.0, q.gather(1, group)))
    mass = rest.sum(-1, keepdim=True)
    return torch.where(mass > 0, rest / mass.clamp(min=1e-30), q)


def _grow_dynamic_sampled(spec: DynamicTree, root_logits: torch.Tensor, feed: FeedFn, sampling: SamplingConfig,
                          generator: torch.Generator | None) -> DraftTree:
    """The dynamic tree for speculative sampling with `sample_children`: every expanded node gets `topk`
    children drawn from its draft distribution q without replacement (`draw_siblings`), each kept with
    the distribution it was drawn from, so siblings are verified by recursive rejection rather than as
    one-hot picks (which are accepted with p(x) each).

    What may not depend on a sibling's own value is whether that sibling is in the tree, or its place
    among its siblings: otherwise the kept siblings are no longer draws from q and the rule is biased.
    So the frontier to expand is still chosen by cumulative draft log-probability (that only decides
    which nodes get children), but the final `total` nodes are chosen whole sibling group by sibling
    group, ranked by their *parent's* score, and a group cut short keeps its first draws. Only the kept
    nodes' distributions are materialised (a [total, V] tensor per row)."""
    b, device = root_logits.shape[0], root_logits.device
    k = spec.topk
    sib = torch.arange(k, device=device)
    q_root = sampling.probs(root_logits)  # [B, V]
    tok, ok = draw_siblings(q_root, k, generator)
    score = torch.where(ok, torch.log(q_root.gather(1, tok)), float("-inf"))
    # the pool, in creation order: tokens, parents (pool index, -1 root), own cumulative score, the score
    # of the group the node belongs to (its parent's), whether it is a real draw, which distribution its
    # group was drawn from, the group's draws and the node's place among them
    pool_tokens, pool_parents, pool_scores = [tok], [torch.full((b, k), -1, device=device)], [score]
    pool_group, pool_ok = [torch.zeros(b, k, device=device)], [ok]
    dists, pool_dist = [q_root[:, None]], [torch.zeros(b, k, dtype=torch.long, device=device)]
    pool_draws, pool_place = [tok[:, None, :].expand(b, k, k)], [sib.expand(b, k)]
    frontier = sib.expand(b, k)
    frontier_scores = score
    size, n_dists = k, 1
    for _ in range(spec.depth - 1):
        tok = torch.cat(pool_tokens, 1).gather(1, frontier)
        par = torch.cat(pool_parents, 1).gather(1, frontier)
        alive = torch.cat(pool_ok, 1).gather(1, frontier)
        q = sampling.probs(feed(frontier, tok, par))  # [B, k, V]
        child, ok = draw_siblings(q.reshape(b * k, -1), k, generator)
        child, ok = child.view(b, k, k), ok.view(b, k, k) & alive[:, :, None]
        own = torch.where(ok, torch.log(q.gather(2, child)), float("-inf"))
        child_scores = frontier_scores[:, :, None] + own
        pool_tokens.append(child.reshape(b, k * k))
        pool_parents.append(frontier[:, :, None].expand(b, k, k).reshape(b, k * k))
        pool_scores.append(child_scores.reshape(b, k * k))
        pool_group.append(frontier_scores[:, :, None].expand(b, k, k).reshape(b, k * k))
        pool_ok.append(ok.reshape(b, k * k))
        dists.append(q)
        pool_dist.append((n_dists + sib)[None, :, None].expand(b, k, k).reshape(b, k * k))
        pool_draws.append(child[:, :, None, :].expand(b, k, k, k).reshape(b, k * k, k))
        pool_place.append(sib.repeat(k).expand(b, k * k))
        best = torch.topk(child_scores.reshape(b, k * k), k, dim=-1)
        frontier, frontier_scores = size + best.indices, best.values
        size, n_dists = size + k * k, n_dists + k
    tokens, parents = torch.cat(pool_tokens, 1), torch.cat(pool_parents, 1)
    rank = torch.nan_to_num(_sampled_rank_key(torch.cat(pool_scores, 1), torch.cat(pool_group, 1)), nan=float("-inf"))
    order = torch.sort(rank, dim=1, descending=True, stable=True).indices  # groups by parent score, draws in order
    keep = torch.sort(order[:, : spec.total], dim=1).values
    new_index = torch.full((b, size), -1, dtype=torch.long, device=device)
    new_index.scatter_(1, keep, torch.arange(spec.total, device=device).expand(b, -1).contiguous())
    kept_parents = parents.gather(1, keep)
    mapped = torch.where(kept_parents >= 0, new_index.gather(1, kept_parents.clamp(min=0)), -1)
    require(~((mapped < 0) & (kept_parents >= 0)).any(),
            lambda: RuntimeError("dynamic tree: a kept node lost its parent (non-finite draft scores?)"))
    base = torch.cat(dists, 1)  # [B, n_dists, V]
    base = base.gather(1, torch.cat(pool_dist, 1).gather(1, keep)[..., None].expand(-1, -1, base.shape[-1]))
    draws = torch.cat(pool_draws, 1).gather(1, keep[..., None].expand(-1, -1, k))
    place = torch.cat(pool_place, 1).gather(1, keep)
    q_nodes = without_earlier(base.reshape(b * spec.total, -1), draws.reshape(-1, k), place.reshape(-1))
    valid = torch.cat(pool_ok, 1).gather(1, keep)
    return DraftTree(tokens.gather(1, keep), mapped, valid, q_nodes.view(b, spec.total, -1), feed_ids=keep)


def _grow_dynamic(spec: DynamicTree, root_logits: torch.Tensor, feed: FeedFn,
                  sampling: SamplingConfig) -> DraftTree:
    """EAGLE-2 expansion and reranking. Tokens are top-k (deterministic), so q is one-hot."""
    b, device = root_logits.shape[0], root_logits.device
    k = spec.topk
    logp = torch.log_softmax(torch.nan_to_num(sampling.process(root_logits), nan=float("-inf")), dim=-1)
    top = torch.topk(logp, k, dim=-1)
    # candidate pool, in creation (depth) order: tokens, parents (pool index, -1 root), cumulative scores
    pool_tokens, pool_parents, pool_scores = [top.indices], [torch.full((b, k), -1, device=device)], [top.values]
    frontier = torch.arange(k, device=device).expand(b, k)  # pool indices of the nodes to expand
    frontier_scores = top.values
    size = k
    for _ in range(spec.depth - 1):
        tok = torch.cat(pool_tokens, 1).gather(1, frontier)
        par = torch.cat(pool_parents, 1).gather(1, frontier)
        child_logp = torch.log_softmax(
            torch.nan_to_num(sampling.process(feed(frontier, tok, par)), nan=float("-inf")), dim=-1)
        ctop = torch.topk(child_logp, k, dim=-1)  # [B, k, k]
        scores = (frontier_scores[:, :, None] + ctop.values).reshape(b, k * k)
        pool_tokens.append(ctop.indices.reshape(b, k * k))
        pool_parents.append(frontier[:, :, None].expand(b, k, k).reshape(b, k * k))
        pool_scores.append(scores)
        best = torch.topk(scores, k, dim=-1)
        frontier = size + best.indices
        frontier_scores = best.values
        size += k * k
    tokens, parents, scores = torch.cat(pool_tokens, 1), torch.cat(pool_parents, 1), torch.cat(pool_scores, 1)
    # rerank: a stable descending sort keeps parents (earlier, score >= child's) ahead of their children,
    # so the best `total` nodes are closed under ancestry.
    order = torch.sort(torch.nan_to_num(scores, nan=float("-inf")), dim=1, descending=True, stable=True).indices
    keep = torch.sort(order[:, : spec.total], dim=1).values  # back to creation order: parents first
    new_index = torch.full((b, size), -1, dtype=torch.long, device=device)
    new_index.scatter_(1, keep, torch.arange(spec.total, device=device).expand(b, -1).contiguous())
    kept_parents = parents.gather(1, keep)
    mapped = torch.where(kept_parents >= 0, new_index.gather(1, kept_parents.clamp(min=0)), -1)
    # cannot fail with finite scores; guards against NaN drafts
    require(~((mapped < 0) & (kept_parents >= 0)).any(),
            lambda: RuntimeError("dynamic tree: a kept node lost its parent (non-finite draft scores?)"))
    valid = torch.ones(b, spec.total, dtype=torch.bool, device=device)
    return DraftTree(tokens.gather(1, keep), mapped, valid, None, feed_ids=keep, dense=True)
