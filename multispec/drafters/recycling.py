"""Token Recycling (Luo et al., 2024): a training-free drafter that reuses the target's own candidates.

Every verification step already computes the target's distribution after every node of the draft tree;
decoding keeps one token of it and throws the rest away. Token Recycling keeps the top-k of each as a
row of an adjacency matrix M [V, k]: M[x] = the target's k most likely next tokens the last time it
was seen after token x. A draft tree is read out of M along a fixed template of child ranks, breadth
first: the node with rank path (r1, ..., rd) carries M[...M[M[root][r1]][r2]...][rd]. After
verification every node's row is overwritten with the target's top-k there (rejected nodes included:
their candidates are the "recycled" tokens). M outlives a generation (a hot start for the next one).

Drafts are deterministic (one-hot q), so greedy and speculative sampling stay lossless with the core's
rules; M only decides what is proposed.
"""

from __future__ import annotations

import torch

from ..prompt import Prompt
from ..rules import Verdict
from ..sampling import SamplingConfig
from ..tree import Chain, DraftTree, StaticTree, TreeSpec
from .base import Drafter

# The paper's static tree ("2.2.2"): 80 nodes in 6 depths (8, 21, 25, 15, 8, 3), earlier ranks deeper.
_PAPER_TEMPLATE = (
    [[r] for r in range(8)]
    + [[0, r] for r in range(8)] + [[1, r] for r in range(4)] + [[2, r] for r in range(3)]
    + [[3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0]]
    + [[0, 0, r] for r in range(8)] + [[0, 1, r] for r in range(3)]
    + [[0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0], [1, 0, 0], [1, 0, 1], [1, 1, 0],
       [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0]]
    + [[0, 0, 0, r] for r in range(5)]
    + [[0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0],
       [2, 0, 0, 0], [3, 0, 0, 0]]
    + [[0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
       [0, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    + [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0]]
)


def paper_tree() -> StaticTree:
    """The 80-node template of the Token Recycling paper (sized for a GPU, where 81 verified rows cost
    about one; on a CPU a smaller tree such as `cpu_tree()` pays better)."""
    return StaticTree(_PAPER_TEMPLATE)


def cpu_tree() -> StaticTree:
    """A 12-node template for CPUs, where every verified node costs: the paper's shape (earlier ranks get
    more children and go deeper) cut to 3, 4, 3, 1, 1 nodes per depth."""
    return StaticTree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0],
                       [0, 0, 0, 0], [0, 0, 0, 0, 0]])


def tree_from_text(text: str) -> StaticTree:
    """A template written as comma-separated rank paths with dot-separated ranks: "0,1,0.0" is the
    root's top two candidates and the first one's top candidate ("cpu" is `cpu_tree()`). The form a pair's
    `draft_shape.json` stores and `multispec zoo tune NAME --what recycling` takes."""
    if text == "cpu":
        return cpu_tree()
    try:
        return StaticTree([[int(r) for r in path.split(".")] for path in text.split(",")])
    except ValueError as e:
        raise ValueError(f"tree: expected rank paths such as '0,1,0.0' (or 'cpu'), got {text!r} ({e})") from None


def tree_to_text(tree: StaticTree) -> str:
    return ",".join(".".join(str(r) for r in path) for path in tree.choices)


def _as_static(spec: TreeSpec) -> StaticTree:
    if isinstance(spec, StaticTree):
        return spec
    if isinstance(spec, Chain):
        return StaticTree([[0] * d for d in range(1, spec.k + 1)]) if spec.k else None
    raise TypeError(f"tree: Token Recycling reads static trees out of its matrix; got {type(spec).__name__} "
                    "(pass an int, Chain, StaticTree, or multispec.drafters.recycling.paper_tree())")


class TokenRecyclingDrafter(Drafter):
    """Drafts static trees from an adjacency matrix of the target's recent top-k candidates.

    `k`: candidates kept per token (the paper's 8; a template's ranks must stay below it).
    `seed_from_prompt`: before any verification has filled a token's row, take the token that followed
    it in the prompt as its first candidate (the paper starts from an empty matrix; on short runs the
    prompt's bigrams are a cheap warm start, and verification overwrites them).
    """

    observes_target = True
    supports_skipped_steps = True  # M does not follow the text: a skipped step costs nothing

    def __init__(self, k: int = 8, seed_from_prompt: bool = True):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k: expected a positive int, got {k!r}")
        self.k = k
        self.seed_from_prompt = bool(seed_from_prompt)
        # rows grow to the vocabulary on demand, on the device of the prompt (`_ensure`)
        self.matrix = torch.full((0, k), -1, dtype=torch.long, device="cpu")
        self._templates: dict[tuple[StaticTree, torch.device], tuple[torch.Tensor, list]] = {}

    def _ensure(self, rows: int, device: torch.device) -> None:
        m = self.matrix
        if m.device != device:
            m = m.to(device)
        if rows > m.shape[0]:
            m = torch.cat([m, torch.full((rows - m.shape[0], self.k), -1, dtype=torch.long, device=device)])
        self.matrix = m

    def start(self, prompt: Prompt, features=None) -> None:
        input_ids, attention_mask = prompt.input_ids, prompt.attention_mask
        self._ensure(int(input_ids.max()) + 1, input_ids.device)
        if not self.seed_from_prompt or input_ids.shape[1] < 2:
            return
        pairs = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
        prev, nxt = input_ids[:, :-1][pairs], input_ids[:, 1:][pairs]
        empty = self.matrix[prev, 0] < 0
        prev, nxt = prev[empty], nxt[empty]
        if prev.numel():
            last = _last_occurrence(prev)
            self.matrix[prev[last], 0] = nxt[last]

    def propose(self, roots: torch.Tensor, spec: TreeSpec, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> DraftTree:
        b = roots.shape[0]
        tree = _as_static(spec)
        if tree is None:
            return DraftTree.empty(b, roots.device)
        parents, levels = self._template(tree, roots.device)
        self._ensure(int(roots.max()) + 1, roots.device)
        n = parents.shape[0]
        tokens = torch.full((b, n + 1), -1, dtype=torch.long, device=roots.device)  # column 0: the root
        tokens[:, 0] = roots
        for nodes, from_cols, ranks in levels:  # one gather per depth, breadth first
            parent = tokens[:, from_cols]
            tokens[:, nodes + 1] = torch.where(parent >= 0, self.matrix[parent.clamp(min=0), ranks], -1)
        valid = tokens[:, 1:] >= 0  # a node whose parent has no candidates yet is not drafted
        return DraftTree(tokens[:, 1:].clamp(min=0), parents.expand(b, n).contiguous(), valid)

    def _template(self, tree: StaticTree, device: torch.device):
        """(parents [N], per depth: (node indices, their parents' token columns, their ranks))."""
        key = (tree, torch.device(device))
        if key not in self._templates:
            index = {c: i for i, c in enumerate(tree.choices)}
            if max(c[-1] for c in tree.choices) >= self.k:
                raise ValueError(f"tree: a rank of {max(c[-1] for c in tree.choices)} needs more than the k={self.k} "
                                 "candidates this drafter keeps per token")
            parent_list = [index[c[:-1]] if len(c) > 1 else -1 for c in tree.choices]
            levels = []
            for depth in range(1, max(len(c) for c in tree.choices) + 1):
                nodes = [i for i, c in enumerate(tree.choices) if len(c) == depth]
                levels.append(tuple(torch.tensor(x, dtype=torch.long, device=device) for x in
                                    (nodes, [parent_list[i] + 1 for i in nodes], [tree.choices[i][-1] for i in nodes])))
            self._templates[key] = (torch.tensor(parent_list, dtype=torch.long, device=device), levels)
        return self._templates[key]

    def observe(self, tokens: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor) -> None:
        """Overwrite the row of every valid node's token with the target's top-k after it (a token that
        occurs twice keeps its last occurrence's candidates)."""
        tokens, valid = tokens.to(self.matrix.device), valid.to(self.matrix.device)
        self._ensure(max(int(tokens.max()) + 1, target_logits.shape[-1]), tokens.device)
        nodes = tokens[valid]
        if nodes.numel() == 0:
            return
        top = torch.topk(target_logits[valid.to(target_logits.device)], self.k, dim=-1).indices
        last = _last_occurrence(nodes)
        self.matrix[nodes[last]] = top[last.to(top.device)].to(self.matrix.device)

    def commit(self, draft: DraftTree, verdict: Verdict, features=None) -> None:
        pass

    def select(self, rows: torch.Tensor) -> None:
        pass


def _last_occurrence(values: torch.Tensor) -> torch.Tensor:
    """Indices of the last occurrence of each distinct value in a 1-D tensor."""
    positions = torch.arange(values.numel(), device=values.device)
    last = torch.full((int(values.max()) + 1,), -1, dtype=torch.long, device=values.device)
    last.scatter_reduce_(0, values, positions, reduce="amax")
    return last[last >= 0]
