"""SuffixDecoding (Oliaro et al., 2024): model-free speculation from the frequencies of what followed the
current suffix in text seen before.

Sources of text: each row's own prompt and output so far; the outputs of earlier generations (kept by
the drafter across calls); optionally a static corpus (e.g. the CPython standard library for code). For
every pattern length p (the last p committed tokens, up to `max_depth`), the continuations of all earlier
occurrences of the pattern form a tree of counts: the empirical probability of a node is the share of
its parent's occurrences that continue with its token, and of a path the product along it. A
speculation tree is grown best first by that probability until `floor(alpha * p)` nodes (the adaptive
speculation length: longer matches earn longer drafts, capped by the tree spec's size) or until the
probability falls below `min_token_prob`; its score is the sum of its nodes' probabilities (the expected
number of accepted tokens). The best-scoring tree over all p and sources is drafted.

Text of a row is matched by brute force (vectorised over positions), a static corpus through a suffix
array. Drafts carry no probabilities (one-hot q): greedy and sampling stay lossless under the core's
rules.
"""

from __future__ import annotations

import hashlib
import heapq
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..prompt import Prompt
from ..rules import Verdict
from ..sampling import SamplingConfig
from ..tree import Chain, DraftTree, TreeSpec
from .base import Drafter


# ---- where continuations come from ----------------------------------------------------------------------


class TextIndex:
    """Occurrences in a growing token sequence, matched by brute force (fine for a few 100k tokens).
    A node is the array of end positions of the occurrences of the path so far."""

    def __init__(self, tokens=()):
        self.buf = np.zeros(max(1024, 2 * len(tokens)), dtype=np.int64)
        self.n = 0
        self.extend(tokens)

    def extend(self, tokens) -> None:
        tokens = np.asarray(tokens, dtype=np.int64).ravel()
        if self.n + len(tokens) > len(self.buf):
            grown = np.zeros(max(2 * len(self.buf), self.n + len(tokens)), dtype=np.int64)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n: self.n + len(tokens)] = tokens
        self.n += len(tokens)

    @property
    def tokens(self) -> np.ndarray:
        return self.buf[: self.n]

    def matches(self, pattern: np.ndarray, exclude_end: bool) -> list[np.ndarray]:
        """For p = 1, 2, ...: end positions of the earlier occurrences of the last p tokens of `pattern`
        (stopping at the first p with none). `exclude_end`: the pattern is this text's own tail; its last
        position has no continuation and is not an occurrence."""
        text = self.tokens
        limit = self.n - 1 if exclude_end else self.n
        ends = np.flatnonzero(text[:limit] == pattern[-1])
        out = []
        for p in range(1, len(pattern) + 1):
            if p > 1:
                ends = ends[ends >= p - 1]
                ends = ends[text[ends - (p - 1)] == pattern[-p]]
            if len(ends) == 0:
                break
            out.append(ends)
        return out

    @staticmethod
    def root(ends: np.ndarray):
        return ends, 0

    @staticmethod
    def size(node) -> int:
        return len(node[0])

    def children(self, node) -> list[tuple[int, int, tuple]]:
        """(token, count, child node) of what follows the node's occurrences, most frequent first (ties:
        smaller token id). A node is (end positions of the matched pattern, continuation tokens matched)."""
        ends, depth = node
        pos = ends + depth + 1
        ends, pos = ends[pos < self.n], pos[pos < self.n]
        if len(ends) == 0:
            return []
        nxt = self.tokens[pos]
        values, counts = np.unique(nxt, return_counts=True)
        order = np.lexsort((values, -counts))  # -1 (a separator between documents) is never drafted
        return [(int(values[i]), int(counts[i]), (ends[nxt == values[i]], depth + 1)) for i in order if values[i] >= 0]


class CorpusIndex:
    """A static corpus through its suffix array: a node is the range of suffixes starting with the path."""

    def __init__(self, tokens, cache_dir: str | Path | None = None):
        self.text = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).ravel())
        self.sa = _cached_suffix_array(self.text, cache_dir)

    def _bound(self, lo: int, hi: int, depth: int, token: int, upper: bool) -> int:
        """First index in [lo, hi) whose suffix has at `depth` a token > token (upper) or >= token;
        suffixes too short to reach `depth` sort first and count as smaller."""
        while lo < hi:
            mid = (lo + hi) // 2
            pos = self.sa[mid] + depth
            t = self.text[pos] if pos < len(self.text) else -1
            if t < token or (upper and t == token):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def matches(self, pattern: np.ndarray, exclude_end: bool = False) -> list[tuple[int, int]]:
        """For p = 1, 2, ...: the suffix-array range of suffixes starting with the last p tokens (the
        pattern read backwards is not a prefix, so each p is a fresh search)."""
        out = []
        for p in range(1, len(pattern) + 1):
            lo, hi = 0, len(self.sa)
            for depth, token in enumerate(pattern[-p:].tolist()):
                lo, hi = self._bound(lo, hi, depth, token, False), self._bound(lo, hi, depth, token, True)
                if lo >= hi:
                    break
            if lo >= hi:
                break
            out.append((lo, hi, p))
        return out

    @staticmethod
    def root(match: tuple[int, int, int]):
        return match

    @staticmethod
    def size(node) -> int:
        return node[1] - node[0]

    def children(self, node) -> list[tuple[int, int, tuple]]:
        """As `TextIndex.children`; a node is (lo, hi, length): the suffixes sa[lo:hi] start with the same
        `length` tokens, so the token after them is sorted within the range and each child a sub-range."""
        lo, hi, length = node
        pos = self.sa[lo:hi] + length
        nxt = np.where(pos < len(self.text), self.text[np.minimum(pos, len(self.text) - 1)], -1)
        starts = np.concatenate([[0], np.flatnonzero(np.diff(nxt)) + 1])
        counts = np.diff(np.concatenate([starts, [len(nxt)]]))
        runs = [(int(nxt[s]), int(c), (lo + int(s), lo + int(s) + int(c), length + 1))
                for s, c in zip(starts, counts) if nxt[s] >= 0]
        runs.sort(key=lambda r: (-r[1], r[0]))
        return runs


def suffix_array(text: np.ndarray) -> np.ndarray:
    """Suffix array of an int sequence by prefix doubling (numpy sorts, O(n log^2 n))."""
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, rank = np.unique(text, return_inverse=True)
    rank = rank.astype(np.int64)
    sa = np.arange(n, dtype=np.int64)
    k = 1
    while True:
        second = np.where(np.arange(n) + k < n, np.concatenate([rank[k:], np.full(k, -1)])[:n] if k < n else -1, -1)
        sa = np.lexsort((second, rank))
        key_r, key_s = rank[sa], second[sa]
        new = np.concatenate([[0], np.cumsum((np.diff(key_r) != 0) | (np.diff(key_s) != 0))])
        rank = np.empty(n, dtype=np.int64)
        rank[sa] = new
        if new[-1] == n - 1:
            return sa
        k *= 2


def _cached_suffix_array(text: np.ndarray, cache_dir: str | Path | None) -> np.ndarray:
    folder = Path(cache_dir) if cache_dir is not None else Path(
        os.environ.get("MULTISPEC_CACHE", Path.home() / ".cache" / "multispec")) / "suffix_arrays"
    key = hashlib.sha1(text.tobytes()).hexdigest()[:20]
    path = folder / f"{key}.npy"
    if path.exists():
        sa = np.load(path)
        if len(sa) == len(text):
            return sa
    sa = suffix_array(text)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(path, sa)
    except OSError:
        pass  # a read-only cache only costs the rebuild
    return sa


# ---- speculation --------------------------------------------------------------------------------------


@dataclass
class Speculation:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # index into `tokens`, -1 = the root
    score: float = 0.0  # sum of the nodes' empirical probabilities = expected accepted tokens
    match_length: int = 0


def speculate(index, node, budget: int, min_prob: float, tree: bool) -> Speculation:
    """Grow a speculation from `node` (a match in `index`): best first by path probability (tree) or along
    the most frequent child only (path), at most `budget` nodes, none below `min_prob`."""
    out = Speculation()
    heap: list = []  # candidates: (-probability, serial, token, node, parent index in `out`)
    serial = 0

    def offer(at, prob: float, parent: int) -> None:
        nonlocal serial
        size = index.size(at)
        for token, count, child in index.children(at):
            q = prob * count / size
            if q < min_prob:
                break  # children come most frequent first
            heapq.heappush(heap, (-q, serial, token, child, parent))
            serial += 1
            if not tree:
                break

    offer(node, 1.0, -1)
    while heap and len(out.tokens) < budget:
        neg, _, token, child, parent = heapq.heappop(heap)
        out.tokens.append(token)
        out.parents.append(parent)
        out.score += -neg
        offer(child, -neg, len(out.tokens) - 1)
    return out


def best_speculation(sources, pattern: np.ndarray, cap: int, alpha: float, min_prob: float,
                     tree: bool) -> Speculation:
    """The best-scoring speculation over every match length p and every source, each grown to at most
    min(cap, floor(alpha * p)) nodes. `sources`: (index, exclude_end) pairs, the row's own text first
    (it wins ties, as do longer matches). Lengths whose budget cannot beat the best score are skipped."""
    best = Speculation()
    candidates = []
    for index, exclude_end in sources:
        for p, match in enumerate(index.matches(pattern, exclude_end), start=1):
            candidates.append((min(cap, int(alpha * p + 1e-6)), p, index, match))
    for budget, p, index, match in sorted(candidates, key=lambda c: (-c[0], -c[1])):
        if budget <= best.score or budget == 0:
            continue  # a score is at most the number of nodes
        spec = speculate(index, index.root(match), budget, min_prob, tree)
        if spec.score > best.score or (spec.score == best.score and p > best.match_length):
            best, best.match_length = spec, p
    return best


class SuffixDecodingDrafter(Drafter):
    """SuffixDecoding over each row's own text, earlier outputs and an optional corpus (see the module).

    `max_depth`: longest pattern matched (the last `max_depth` committed tokens).
    `alpha`: drafts of at most floor(alpha * p) nodes after a p-token match (capped by the tree spec).
    `min_token_prob`: stop a branch when its empirical probability falls below this.
    `corpus`: token ids (a 1-D sequence, or a list of documents) to match against as well, through a
    suffix array built once and cached under `$MULTISPEC_CACHE/suffix_arrays`.
    `keep_outputs`: how many tokens of earlier generations' outputs to keep as a source (0: none).

    The tree spec decides the shape: `Chain(k)` drafts a path of at most k tokens along the most
    frequent continuation, `StaticTree`/`DynamicTree` a best-first tree of at most `spec.max_nodes`.
    """

    supports_skipped_steps = True  # it reads the committed text, which `commit` always sees

    def __init__(self, max_depth: int = 32, alpha: float = 1.0, min_token_prob: float = 0.1, corpus=None,
                 keep_outputs: int = 200_000, cache_dir: str | Path | None = None):
        if not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth: expected a positive int, got {max_depth!r}")
        if not alpha > 0:
            raise ValueError(f"alpha: expected a positive number, got {alpha!r}")
        if not 0.0 <= min_token_prob < 1.0:
            raise ValueError(f"min_token_prob: expected a number in [0, 1), got {min_token_prob!r}")
        if not isinstance(keep_outputs, int) or keep_outputs < 0:
            raise ValueError(f"keep_outputs: expected an int >= 0, got {keep_outputs!r}")
        self.max_depth, self.alpha, self.min_token_prob = max_depth, float(alpha), float(min_token_prob)
        self.keep_outputs = keep_outputs
        self.corpus = None
        if corpus is not None:
            if len(corpus) and not np.isscalar(corpus[0]):  # documents: separate them so no match spans two
                corpus = np.concatenate([np.append(np.asarray(d, dtype=np.int64), -1) for d in corpus])
            self.corpus = CorpusIndex(corpus, cache_dir)
        self.history = TextIndex()  # outputs of earlier generations, separated by -1
        self.rows: list[TextIndex] = []
        self._outputs: list[list[int]] = []

    def start(self, prompt: Prompt, features=None) -> None:
        input_ids, attention_mask = prompt.input_ids, prompt.attention_mask
        self._retire_outputs()
        self.device = input_ids.device
        ids, mask = input_ids.cpu().numpy(), attention_mask.cpu().numpy().astype(bool)
        self.rows = [TextIndex(ids[r][mask[r]]) for r in range(ids.shape[0])]
        self._outputs = [[] for _ in self.rows]

    def _retire_outputs(self) -> None:
        """The previous generation's outputs become a source for the next (most recent kept)."""
        for out in self._outputs:
            if out:
                self.history.extend(out + [-1])
        if self.history.n > self.keep_outputs:
            kept = self.history.tokens[self.history.n - self.keep_outputs:].copy() if self.keep_outputs else []
            self.history = TextIndex(kept)
        self._outputs = []

    def propose(self, roots: torch.Tensor, spec: TreeSpec, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> DraftTree:
        cap, tree = spec.max_nodes, not isinstance(spec, Chain)
        drafts = []
        for row in self.rows:  # a row's text ends with its root (the prompt's last token, then each bonus)
            context = row.tokens[-self.max_depth:]
            sources = [(row, True)]
            if self.history.n:
                sources.append((self.history, False))
            if self.corpus is not None:
                sources.append((self.corpus, False))
            drafts.append(best_speculation(sources, context, cap, self.alpha, self.min_token_prob, tree)
                          if cap else Speculation())
        width = max([len(d.tokens) for d in drafts] + [0])
        b = len(drafts)
        # laid out on the host, then one copy to the drafter's device
        tokens = torch.zeros(b, width, dtype=torch.long, device="cpu")
        parents = torch.full((b, width), -1, dtype=torch.long, device="cpu")
        valid = torch.zeros(b, width, dtype=torch.bool, device="cpu")
        for r, d in enumerate(drafts):
            n = len(d.tokens)
            tokens[r, :n] = torch.tensor(d.tokens, dtype=torch.long, device="cpu")
            parents[r, :n] = torch.tensor(d.parents, dtype=torch.long, device="cpu")
            valid[r, :n] = True
        self.last_scores = [d.score for d in drafts]
        return DraftTree(tokens.to(self.device), parents.to(self.device), valid.to(self.device),
                         is_chain=not tree)

    def commit(self, draft: DraftTree, verdict: Verdict, features=None) -> None:
        counts = (verdict.num_accepted + 1).tolist()
        for row, out, toks, c in zip(self.rows, self._outputs, verdict.tokens.tolist(), counts):
            row.extend(toks[:c])  # accepted drafts, then the bonus: the next root
            out.extend(toks[:c])

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        for i in range(len(self.rows)):
            if i not in keep and self._outputs[i]:
                self.history.extend(self._outputs[i] + [-1])
        self.rows = [self.rows[i] for i in keep]
        self._outputs = [self._outputs[i] for i in keep]
