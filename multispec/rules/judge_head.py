"""The judge head: the classifier the `Judge` rule consults, its storage and its training.

The head is a linear layer (logistic regression, Judge Decoding's head; optionally one hidden layer) on the
target's final hidden state at a draft token, the state after the target has read the token, which the
verification pass computes anyway (`FeatureRequest(hidden=True)`), so judging costs one dot product per node.
A context head also reads the state at the token's parent and three scalars of the parent's distribution
(`judge_inputs`). It is trained on labelled draft tokens (`train_judge_head`: weighted binary cross-entropy,
since good tokens vastly outnumber bad ones); a modality package can label them automatically, for example on
problems with checkable answers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

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


def target_fingerprint(model) -> dict:
    """What a judge records of the target it was trained for: model type, hidden size, layer count, vocabulary,
    and a hash of a strided sample of the output embedding's weights (a model of the same shape with other
    weights gives another hash; one small copy to the host)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head = model.get_output_embeddings().weight
    sample = head.detach()[:: max(1, head.shape[0] // 64), :: max(1, head.shape[1] // 64)]
    digest = hashlib.sha256(sample.float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
    return {"model_type": str(getattr(config, "model_type", type(model).__name__)),
            "hidden_size": int(head.shape[1]), "num_layers": int(getattr(config, "num_hidden_layers", -1)),
            "vocab_size": int(head.shape[0]), "weights": digest}


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
        self.trained_for: dict | None = None  # `target_fingerprint` of its target (None: not recorded)

    @classmethod
    def approve_all(cls, hidden_size: int, context: bool = False) -> "JudgeHead":
        """A head that approves every token (probability ~1): the control a judge's result is compared with,
        at the same floor (`Judge(..., min_target_prob=)`), so what the floor alone gives shows."""
        head = cls(hidden_size, context)
        with torch.no_grad():
            head.linear.weight.zero_()
            head.linear.bias.fill_(20.0)
        return head.eval()

    def check_target(self, model) -> None:
        """Raise unless `model` is the target this head was trained for (when that was recorded)."""
        if self.trained_for is None:
            return
        found = target_fingerprint(model)
        if found != self.trained_for:
            differs = [k for k in found if found[k] != self.trained_for.get(k)]
            raise ValueError(f"judge: trained for another target ({', '.join(differs)} differ: trained for "
                             f"{self.trained_for}, given {found}); train one for this target "
                             "(multispec train judge)")

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

    def save(self, folder: str | Path, target=None, **report) -> None:
        """Write the head and `report` to `folder`; `target`: the model it was trained for, recorded so that
        loading it for another target fails (`check_target`)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, folder / "judge.safetensors")
        if target is not None:
            self.trained_for = target_fingerprint(target)
        config = {"hidden_size": self.hidden_size, "context": self.context, "width": self.width,
                  "trained_for": self.trained_for}
        (folder / "judge_config.json").write_text(json.dumps(config | report, indent=2))

    @classmethod
    def load(cls, folder: str | Path) -> "JudgeHead":
        folder = Path(folder)
        if not (folder / "judge_config.json").exists():
            raise FileNotFoundError(f"{folder}: no judge_config.json (train one with `multispec train judge`)")
        config = json.loads((folder / "judge_config.json").read_text())
        head = cls(int(config["hidden_size"]), bool(config.get("context", False)), int(config.get("width", 0)))
        head.load_state_dict(load_file(folder / "judge.safetensors"))
        head.trained_for = config.get("trained_for")
        return head.eval()



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



__all__ = ["CONTEXT_SCALARS", "JudgeHead", "judge_inputs", "target_fingerprint", "train_judge_head"]
