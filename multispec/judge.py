"""Judge verification (Judge Decoding, Bachmann et al. 2025): accept a draft token when the exact rule
accepts it *or* a judge reading the target's hidden state at that token says it is good.

The judge is a linear head (logistic regression) on the target's final hidden state at the draft
position, the state after the target has read the token, which the verification pass computes anyway
(`FeatureRequest(hidden=True)`), so judging costs one dot product per node. It is trained on labelled
draft tokens (`train_judge_head`: weighted binary cross-entropy, since good tokens vastly outnumber bad
ones); `multispec.reasoning` labels them automatically on problems with checkable answers.

The rule is lossy. Its bound is counted, not assumed: a node the judge approves is taken at its parent
(among approved siblings, the first in draft order) and the parent's exact verdict applies otherwise,
so with greedy decoding the output departs from the target's own only at an emitted token the target
would not have chosen, and `JudgeVerdict.overrides` counts those per row (`JudgeStats` sums them). With
no node approved (threshold above 1, or a disabled judge) the rule is `Exact`, draw for draw.

`min_target_prob` ρ adds a floor: the judge may approve only a token the target itself gives probability at
least ρ at that position (its softmax, before any sampling transform). Every emitted token is then the exact
rule's or one the target rates at least ρ, a bound that holds whatever the head learned. It is for targets whose other plausible
continuations (another phrasing) are safe while their improbable ones (a wrong digit) are not: a head trained
on a few thousand labels is overconfident on new problems, and the floor removes the approvals the target
itself rules out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from .acceptance import AcceptanceRule, Exact, Verdict
from .sampling import SamplingConfig, nan_safe_argmax
from .targets.base import FeatureRequest, Features
from .tree import DraftTree

_OFF = -1.0e4  # logit of every other token at an approved node's parent: exp(-1e4) is 0 in float32


CONTEXT_SCALARS = 3  # from the parent's distribution: log p(token), the top log-probability, the entropy


def judge_inputs(node_hidden: torch.Tensor, parent_hidden: torch.Tensor, parent_logits: torch.Tensor,
                 tokens: torch.Tensor) -> torch.Tensor:
    """A context judge's input [..., 2H + 3]: the target's state at the draft token, its state at the
    parent (where it chose what comes next), and from the parent's distribution the log-probability of the
    drafted token, the top log-probability and the entropy: what the target expected, and how far the
    draft strayed from it."""
    lp = torch.log_softmax(parent_logits.float(), -1)
    drafted = lp.gather(-1, tokens[..., None].long())[..., 0]
    entropy = -(lp.exp() * lp.clamp(min=-1e4)).sum(-1)
    scalars = torch.stack([drafted.clamp(min=-1e4), lp.max(-1).values, entropy], -1)
    return torch.cat([node_hidden.float(), parent_hidden.float(), scalars], -1)


class JudgeHead(nn.Module):
    """The probability a draft token is good, σ(f(φ)): φ the target's final hidden state at the token [H],
    or with `context` the `judge_inputs` vector [2H + 3]; f linear (logistic regression, the paper's head)
    or, with `width` > 0, one hidden layer of that width."""

    def __init__(self, hidden_size: int, context: bool = False, width: int = 0):
        super().__init__()
        if not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"hidden_size: expected a positive int, got {hidden_size!r}")
        if not isinstance(width, int) or width < 0:
            raise ValueError(f"width: expected a non-negative int (0: linear), got {width!r}")
        self.hidden_size, self.context, self.width = hidden_size, bool(context), width
        self.in_features = 2 * hidden_size + CONTEXT_SCALARS if context else hidden_size
        self.hidden_layer = nn.Linear(self.in_features, width) if width else None
        self.linear = nn.Linear(width or self.in_features, 1)

    @property
    def first(self) -> nn.Linear:
        """The layer that reads the input (the standardisation is folded into it)."""
        return self.hidden_layer if self.hidden_layer is not None else self.linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [...] of inputs [..., in_features] (apply sigmoid for probabilities)."""
        if x.shape[-1] != self.in_features:
            what = "judge_inputs vectors" if self.context else "the target's hidden states"
            raise ValueError(f"hidden: last dimension {x.shape[-1]} does not match the judge's input size "
                             f"{self.in_features} ({what} of hidden_size {self.hidden_size}: a judge belongs to "
                             "one target)")
        x = x.to(self.linear.weight.dtype)
        if self.hidden_layer is not None:
            x = torch.nn.functional.gelu(self.hidden_layer(x))
        return self.linear(x)[..., 0]

    def save(self, folder: str | Path, **report) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, folder / "judge.safetensors")
        config = {"hidden_size": self.hidden_size, "context": self.context, "width": self.width}
        (folder / "judge_config.json").write_text(json.dumps(config | report, indent=2))

    @classmethod
    def load(cls, folder: str | Path) -> "JudgeHead":
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / "judge_config.json").exists():
            raise FileNotFoundError(f"{folder}: no judge_config.json (train one with `multispec train judge`)")
        config = json.loads((folder / "judge_config.json").read_text())
        head = cls(int(config["hidden_size"]), bool(config.get("context", False)), int(config.get("width", 0)))
        head.load_state_dict(load_file(folder / "judge.safetensors"))
        return head.eval()


@dataclass
class JudgeVerdict(Verdict):
    """A `Verdict` plus `overrides[b]`: emitted drafts of row b the exact rule did not accept by itself
    (greedy: drafts that are not the target's argmax; sampling: every accepted judge-approved draft, an
    upper bound, since the exact draw is not made for them), and `overridden[b, i]`: whether accepted draft
    `tokens[b, i]` is one of them (what a trace colours as the judge's)."""

    overrides: torch.Tensor | None = None  # [B] int64
    overridden: torch.Tensor | None = None  # [B, D] bool, False past num_accepted[b]


class Judge(AcceptanceRule):
    """Exact verification OR a judge's approval (`head`'s probability above `threshold`).

    `head=None` disables the judge (the rule is then `Exact`). Works on chains and trees, greedy and
    sampling; see the module docstring for the semantics and the counted bound."""

    lossless = False
    feature_request = FeatureRequest(hidden=True)

    def __init__(self, head: JudgeHead | None, threshold: float = 0.5, min_target_prob: float = 0.0):
        if head is not None and not isinstance(head, JudgeHead):
            raise TypeError(f"head: expected a JudgeHead or None, got {type(head).__name__}")
        if not isinstance(threshold, (int, float)) or threshold != threshold:
            raise ValueError(f"threshold: expected a number (probabilities above it are approved), got {threshold!r}")
        if not isinstance(min_target_prob, (int, float)) or not 0.0 <= min_target_prob <= 1.0:
            raise ValueError(f"min_target_prob: expected a probability in [0, 1] (the least target probability of "
                             f"an approved token), got {min_target_prob!r}")
        self.head, self.threshold, self.min_target_prob = head, float(threshold), float(min_target_prob)

    def __repr__(self) -> str:
        return (f"Judge(threshold={self.threshold}, min_target_prob={self.min_target_prob}, "
                f"enabled={self.head is not None})")

    def approvals(self, draft: DraftTree, features: Features | None,
                  target_logits: torch.Tensor | None = None) -> torch.Tensor:
        """[B, N] bool: the draft nodes the judge approves (a context judge, and the `min_target_prob` floor,
        also read `target_logits` [B, N + 1, V], the target's logits after the root and every node)."""
        if self.head is None or draft.num_nodes == 0:
            return torch.zeros_like(draft.valid)
        if features is None or features.hidden is None:
            raise ValueError("features: the judge reads the target's hidden states at the draft nodes "
                             "(score the tree with Judge.feature_request)")
        if target_logits is None and (self.head.context or self.min_target_prob > 0):
            raise ValueError("target_logits: a context judge and the min_target_prob floor read the target's "
                             "distribution at each parent")
        n = draft.num_nodes
        x = features.hidden[:, 1: n + 1]  # node 0 is the root
        parent = (draft.parents + 1).clamp(min=0).to(features.hidden.device)  # full-tree index; root = 0
        pick = lambda t: t.gather(1, parent[..., None].expand(-1, -1, t.shape[-1]))  # noqa: E731
        tokens = draft.tokens.clamp(min=0).to(features.hidden.device)
        if self.head.context:
            x = judge_inputs(x, pick(features.hidden), pick(target_logits.to(features.hidden.device)), tokens)
        with torch.no_grad():
            approved = torch.sigmoid(self.head(x.float())) > self.threshold
            if self.min_target_prob > 0:
                parent_logits = pick(target_logits.to(features.hidden.device)).float()
                p_token = torch.softmax(parent_logits, -1).gather(-1, tokens[..., None])[..., 0]
                approved &= p_token >= self.min_target_prob
        return approved.to(draft.valid.device) & draft.valid

    def accept(self, draft: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator | None = None, features: Features | None = None) -> JudgeVerdict:
        approved = self.approvals(draft, features, target_logits)
        logits = target_logits
        if bool(approved.any()):
            logits = target_logits.clone()
            rows, nodes = approved.nonzero(as_tuple=True)
            parent = draft.parents[rows, nodes] + 1  # full-tree index of each approved node's parent
            for r, n, par in reversed(list(zip(rows.tolist(), nodes.tolist(), parent.tolist()))):
                # reversed: the first approved sibling is written last and wins
                logits[r, par] = _OFF
                logits[r, par, draft.tokens[r, n]] = 0.0
        verdict = Exact().accept(draft, logits, sampling, generator)
        overridden = self._overridden(draft, target_logits, sampling, verdict, approved)
        return JudgeVerdict(verdict.tokens, verdict.num_accepted, verdict.path, overridden.sum(1), overridden)

    @staticmethod
    def _overridden(draft: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, verdict: Verdict,
                    approved: torch.Tensor) -> torch.Tensor:
        path = verdict.path[:, 1:]  # full-tree nodes of the accepted drafts (then the correction's -1s)
        if not bool(approved.any()):
            return torch.zeros(path.shape, dtype=torch.bool, device=path.device)
        b = draft.batch_size
        rows = torch.arange(b, device=path.device)[:, None].expand_as(path)
        on_path = (path > 0) & (torch.arange(path.shape[1], device=path.device)[None] < verdict.num_accepted[:, None])
        node = (path - 1).clamp(min=0)
        was_approved = approved[rows, node] & on_path
        if sampling.do_sample:
            return was_approved
        parent = draft.parents[rows, node] + 1
        own = nan_safe_argmax(sampling.process(logits))  # [B, N + 1] the target's choice after each node
        differs = own[rows, parent] != draft.tokens[rows, node]
        return was_approved & differs


@dataclass
class JudgeStats:
    """Sums over verdicts: drafted tokens the judge turned from rejected into accepted."""

    overrides: int = 0
    steps: int = 0

    def __call__(self, draft: DraftTree, verdict: Verdict, rows: list[int]) -> None:
        """An `on_step` callback for `speculative_generate` / `Session.generate`."""
        self.steps += 1
        if isinstance(verdict, JudgeVerdict) and verdict.overrides is not None:
            self.overrides += int(verdict.overrides.sum())


def train_judge_head(features: torch.Tensor, labels: torch.Tensor, *, context: bool = False, width: int = 0,
                     epochs: int = 300, lr: float = 0.05, weight_decay: float = 1e-3, pos_weight: float | None = None,
                     seed: int = 0, progress: bool = True) -> tuple[JudgeHead, dict]:
    """Fit a `JudgeHead` to inputs `features` [N, F] (hidden states, or `judge_inputs` vectors with
    `context`) with labels [N] (1 = good token) by weighted binary cross-entropy (full batch, Adam).
    `pos_weight` (default: negatives / positives) balances the classes. Returns the head and a report
    (class counts, final loss, training accuracy per class)."""
    if features.dim() != 2 or labels.shape != features.shape[:1]:
        raise ValueError(f"features / labels: expected [N, F] and [N], got {tuple(features.shape)} and "
                         f"{tuple(labels.shape)}")
    f = features.shape[1]
    hidden = (f - CONTEXT_SCALARS) // 2 if context else f
    if hidden < 1 or (context and 2 * hidden + CONTEXT_SCALARS != f):
        raise ValueError(f"features: {f} columns are not {'judge_inputs vectors [2H + 3]' if context else 'hidden states'}")
    y = labels.float()
    pos, neg = int(y.sum()), int((1 - y).sum())
    if pos == 0 or neg == 0:
        raise ValueError(f"labels: need both classes to train a judge (good: {pos}, bad: {neg})")
    torch.manual_seed(seed)
    x = features.float()
    mean, std = x.mean(0), x.std(0).clamp(min=1e-4)
    head = JudgeHead(hidden, context, width)
    z = (x - mean) / std  # fit on standardised inputs, then fold the scaling into the first layer
    opt = torch.optim.Adam(head.parameters(), lr=lr, weight_decay=weight_decay)
    weight = torch.tensor(neg / pos if pos_weight is None else pos_weight)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=weight)
    loss = torch.tensor(0.0)
    for _ in tqdm(range(epochs), desc="judge", unit="epoch", disable=not progress):
        loss = loss_fn(head(z), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        first = head.first
        w = first.weight.clone()
        first.weight.copy_(w / std)
        first.bias.copy_(first.bias - (w * mean / std).sum(1))
        predicted = head(x) > 0
    report = {"good": pos, "bad": neg, "pos_weight": float(weight), "loss": float(loss.detach()),
              "recall_good": float(predicted[y == 1].float().mean()),
              "recall_bad": float((~predicted[y == 0]).float().mean())}
    return head.eval(), report


__all__ = ["Judge", "JudgeHead", "JudgeStats", "JudgeVerdict", "judge_inputs", "train_judge_head"]
