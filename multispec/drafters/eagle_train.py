"""Training an `EagleHead` on teacher-forced target features.

Loss per position (EAGLE-1/2): SmoothL1 between the predicted and the target's next feature, plus
cross-entropy to the target's next-token distribution restricted to the draft vocabulary. A second,
unrolled pass feeds the head its own predicted features (as it will see them while drafting) and
adds the same losses one step further ("training-time test", as in EAGLE-3 / ViSpec's rollout).
A modality's subclass overrides `target_features` or `head_inputs` to add what its inputs carry.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from .eagle import EagleHead


@dataclass
class EagleTrainConfig:
    seq_len: int = 256
    batch_size: int = 8
    epochs: int = 2
    lr: float = 5e-4
    warmup_steps: int = 50
    feature_weight: float = 1.0
    ce_weight: float = 0.1
    rollout_weight: float = 0.5  # weight of the second (own-feature) pass; 0 disables it
    feature_noise: float = 0.05  # std of Gaussian noise on input features, relative to their rms
    grad_clip: float = 0.5
    feature_batch: int = 8
    seed: int = 0


def top_token_map(chunks: Sequence[torch.Tensor], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent token ids in the corpus (ties by id), sorted: the draft vocabulary."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for c in chunks:
        counts += torch.bincount(c.flatten(), minlength=vocab_size)
    size = min(size, vocab_size)
    order = torch.sort(counts, descending=True, stable=True).indices[:size]
    return torch.sort(order).values


def chunk_tokens(ids: torch.Tensor, seq_len: int) -> list[torch.Tensor]:
    """Split one long token stream into full chunks of `seq_len`."""
    n = ids.numel() // seq_len
    return list(ids[: n * seq_len].view(n, seq_len))


def _head_masks(attention_mask: torch.Tensor | None, shift: int) -> dict:
    """The head's attention mask and positions for entries from token `shift` on (nothing without padding)."""
    if attention_mask is None:
        return {}
    mask = attention_mask[:, shift:]
    return {"attention_mask": mask, "position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}


class EagleTrainer:
    """Teacher-forced training of an `EagleHead` against a frozen target."""

    def __init__(self, target: PreTrainedModel, head: EagleHead, config: EagleTrainConfig | None = None):
        self.target = target.eval()
        self.head = head
        self.config = config or EagleTrainConfig()
        for p in self.target.parameters():
            p.requires_grad_(False)
        lm_head = target.get_output_embeddings()
        self.head_weight = lm_head.weight.detach()[head.d2t]
        self.head_bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias.detach()[head.d2t]
        text_config = target.config.get_text_config()
        self.softcap = getattr(text_config, "final_logit_softcapping", None)

    @torch.no_grad()
    def target_features(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's final (normed) hidden states [B, S, H] for token ids [B, S]."""
        return self.target.get_decoder()(input_ids=ids).last_hidden_state

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's logits restricted to the draft vocabulary, from its features."""
        logits = features.float() @ self.head_weight.float().T
        if self.head_bias is not None:
            logits = logits + self.head_bias
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def teacher_logits(self, next_features: torch.Tensor) -> torch.Tensor:
        """The distribution the head learns to predict, as logits, at the positions of `next_features`
        (the target's own by default; a guided trainer may mix in the unconditional half)."""
        return self.target_logits(next_features)

    @torch.no_grad()
    def extract(self, chunks: Sequence[torch.Tensor], desc: str = "target features") -> torch.Tensor:
        """Features of every chunk, stored in fp16 [N, S, H]."""
        out = []
        bs = self.config.feature_batch
        for i in tqdm(range(0, len(chunks), bs), desc=desc, unit="batch"):
            batch = torch.stack(list(chunks[i:i + bs]))
            out.append(self.target_features(batch).to(torch.float16))
        return torch.cat(out)

    def head_inputs(self, next_tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.head.fuse(self.target.get_input_embeddings()(next_tokens).detach(), features)

    def losses(self, ids: torch.Tensor, feats: torch.Tensor, noise: torch.Tensor | None = None,
               attention_mask: torch.Tensor | None = None,
               loss_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The losses of token chunks `ids` [B, S] with the target's features `feats` [B, S, H]; `noise`
        [B, S - 1, H]: the standard normal draws that perturb the input features (default: drawn here).
        `attention_mask` [B, S]: left padding, which the head neither reads nor places (positions count from
        each row's first real token, as when it drafts); `loss_mask` [B, S - 1]: the entries whose predictions
        count (entry j predicts feature j + 1 and token j + 2; default all)."""
        cfg = self.config
        feats = feats.float()
        inp = feats[:, :-1]
        if attention_mask is not None:
            inp = inp * attention_mask[:, :-1, None].to(inp)  # zero features at padding, as the drafter's
        if cfg.feature_noise:
            rms = inp.pow(2).mean().sqrt()
            noise = torch.randn_like(inp) if noise is None else noise.to(inp)
            inp = inp + noise * cfg.feature_noise * rms
        logits, pred = self.head(self.head_inputs(ids[:, 1:], inp), **_head_masks(attention_mask, 1))
        want_feat = feats[:, 1:]
        want_p = torch.softmax(self.teacher_logits(want_feat), -1)
        keep = loss_mask

        def mean(x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
            return x.mean() if m is None else x[m.bool()].mean()

        feat_loss = mean(F.smooth_l1_loss(pred, want_feat, reduction="none").mean(-1), keep)
        ce = mean(-(want_p * torch.log_softmax(logits.float(), -1)).sum(-1), keep)
        out = {"feature": feat_loss, "ce": ce,
               "acc": mean((logits.argmax(-1) == want_p.argmax(-1)).float(), keep).detach()}
        total = cfg.feature_weight * feat_loss + cfg.ce_weight * ce
        if cfg.rollout_weight > 0 and ids.shape[1] > 3:
            logits2, pred2 = self.head(self.head_inputs(ids[:, 2:], pred[:, :-1]), **_head_masks(attention_mask, 2))
            want_feat2 = feats[:, 2:]
            want_p2 = want_p[:, 1:]
            keep2 = None if keep is None else keep[:, 1:]
            loss2 = cfg.feature_weight * mean(F.smooth_l1_loss(pred2, want_feat2, reduction="none").mean(-1), keep2) + \
                cfg.ce_weight * mean(-(want_p2 * torch.log_softmax(logits2.float(), -1)).sum(-1), keep2)
            total = total + cfg.rollout_weight * loss2
            out["acc2"] = mean((logits2.argmax(-1) == want_p2.argmax(-1)).float(), keep2).detach()
        out["total"] = total
        return out

    def fit(self, chunks: Sequence[torch.Tensor], features: torch.Tensor | None = None) -> list[dict[str, float]]:
        """Train on token chunks [S] each; returns per-epoch mean metrics."""
        cfg = self.config
        torch.manual_seed(cfg.seed)
        rng = random.Random(cfg.seed)
        if features is None:
            features = self.extract(chunks)
        ids = torch.stack(list(chunks))
        self.head.train()
        params = [p for p in self.head.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        steps_per_epoch = math.ceil(len(ids) / cfg.batch_size)
        total_steps = max(1, steps_per_epoch * cfg.epochs)

        def lr_at(step: int) -> float:
            if step < cfg.warmup_steps:
                return (step + 1) / cfg.warmup_steps
            return 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        history = []
        bar = tqdm(total=total_steps, desc="eagle head", unit="step")
        for epoch in range(cfg.epochs):
            order = list(range(len(ids)))
            rng.shuffle(order)
            sums: dict[str, float] = {}
            for i in range(0, len(order), cfg.batch_size):
                sel = torch.tensor(order[i:i + cfg.batch_size])
                parts = self.losses(ids[sel], features[sel])
                opt.zero_grad(set_to_none=True)
                parts["total"].backward()
                torch.nn.utils.clip_grad_value_(params, cfg.grad_clip)
                opt.step()
                sched.step()
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + float(v.detach())
                bar.update(1)
                bar.set_postfix(loss=f"{float(parts['total'].detach()):.3f}", acc=f"{float(parts['acc']):.2f}")
            history.append({k: v / steps_per_epoch for k, v in sums.items()} | {"epoch": epoch})
        bar.close()
        self.head.eval()
        return history
