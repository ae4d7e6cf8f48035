"""Per-step statistics of a speculative generation."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    """One draft -> verify -> commit step over the active rows (token counts summed over rows)."""

    rows: int  # active rows, i.e. target forwards per row this step
    drafted: int  # valid draft nodes proposed
    accepted: int  # drafted tokens accepted
    committed: int  # tokens appended to outputs (accepted + one correction/bonus per row, after EOS/length cuts)
    draft_s: float
    verify_s: float
    commit_s: float


@dataclass
class SpeculativeStats:
    """Statistics of one `speculative_generate` call."""

    steps: list[StepStats] = field(default_factory=list)
    prefill_s: float = 0.0

    @property
    def target_forwards(self) -> int:
        """Verification forwards of the target (one per step; prefill not counted)."""
        return len(self.steps)

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def committed(self) -> int:
        return sum(s.committed for s in self.steps)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target forward per row, *including* the bonus/correction token (the
        EAGLE/SpecVLM convention: plain decoding scores 1.0, a step that accepts 3 drafts scores 4)."""
        row_forwards = sum(s.rows for s in self.steps)
        return self.committed / row_forwards if row_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def draft_s(self) -> float:
        return sum(s.draft_s for s in self.steps)

    @property
    def verify_s(self) -> float:
        return sum(s.verify_s for s in self.steps)

    @property
    def commit_s(self) -> float:
        return sum(s.commit_s for s in self.steps)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.draft_s + self.verify_s + self.commit_s

    @property
    def tokens_per_s(self) -> float:
        return self.committed / self.total_s if self.total_s > 0 else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "target_forwards": self.target_forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "committed": self.committed,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "commit_s": round(self.commit_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
        }

    def __repr__(self) -> str:
        s = self.summary()
        return (f"SpeculativeStats(steps={s['target_forwards']}, committed={s['committed']}, "
                f"mean_accepted_length={s['mean_accepted_length']}, acceptance_rate={s['acceptance_rate']}, "
                f"tokens_per_s={s['tokens_per_s']})")
