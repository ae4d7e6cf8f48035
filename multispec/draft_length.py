"""The chain length for *this* machine: a pair's step profile (what each candidate length drafted and
committed on the validation split) priced with the verification cost measured here.

Why not one stored length: the cost of verifying M nodes in one target forward, relative to one node, is
the machine's, not the pair's. A CPU's matrix library switches kernels with the number of rows, at places
that differ between CPUs (BENCHMARKS.md, "The model's own LM head": the same Gemma pair has its cheap widths
at 1-3 nodes on one 2-core CPU and at 4-16 on another), so the length chosen on one machine can be the worst
one on the next. What each length drafts and commits does not depend on the machine (greedy: exactly;
sampled: in expectation), so it is measured once and stored (`StepProfile`); the cost is measured where the
model runs (`VerifyCost.measure`, a few target forwards) and `choose_chain_length` prices each profile with
it:

    choice = calibrate(target, profiles)      # VerifyCost.measure + choose_chain_length(..., pad=True)
    choice.chain_k, choice.predicted          # the length, and each candidate's predicted speedup
    speculative_generate(target, drafter, ids, tree=choice.chain_k,
                         engine=EngineConfig(pad_widths=choice.pad_widths))

The prediction per step is the verification forward's cost at the step's width plus the profiled machine's
overhead (drafting, the acceptance rule, the commit), rescaled by the ratio of the two machines' one-node
costs (a first-order guess: that work runs on the same cores); each generation also pays its prefill, the same
for every length, rescaled likewise. Without the prefill the predicted ratios run high where a prompt's prefill
is a large share of a generation, and the choice leans to long chains (BENCHMARKS.md, "Text: stdlib-bytes-large").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from .metrics import SpeculativeStats
from .prompt import Prompt
from .targets import as_target
from .targets.base import NO_FEATURES, FeatureRequest
from .tree import DraftTree

MODES = ("greedy", "sampling")
PAD_LOOKAHEAD = 2  # `calibrate` also times this many widths beyond the widest profiled step


@dataclass(frozen=True)
class StepProfile:
    """What a chain of `chain_k` drafts did on the validation prompts, in one mode (greedy or sampling):
    the number of steps at each verification width (1 + the draft nodes a step verified; batch 1), the
    tokens committed, and `overhead_ms`, the mean time a step took on the profiling machine beyond the bare
    verification forward at its width (drafting, the acceptance rule, the commit), where one node's forward
    cost `t1_ms`; `generations` runs were profiled, each paying `prefill_ms` on average (the target's prefill
    and the drafter's start; 0 generations: profiles recorded without it, priced without a prefill). `chain_k`
    0 is the engine with no drafts (the baseline)."""

    chain_k: int
    mode: str
    widths: dict[int, int]
    tokens: int
    overhead_ms: float
    t1_ms: float
    generations: int = 0
    prefill_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.tokens <= 0 or not self.widths or min(self.widths) < 1:
            raise ValueError(f"profile k={self.chain_k} ({self.mode}): needs tokens > 0 and widths >= 1, "
                             f"got tokens={self.tokens}, widths={self.widths}")
        if self.t1_ms <= 0:
            raise ValueError(f"t1_ms must be > 0, got {self.t1_ms}")
        if self.generations < 0 or self.prefill_ms < 0:
            raise ValueError(f"generations and prefill_ms must be >= 0, got {self.generations}, {self.prefill_ms}")

    @classmethod
    def from_stats(cls, chain_k: int, mode: str, runs: Iterable[SpeculativeStats], cost: VerifyCost) -> StepProfile:
        """From the `stats` of batch-1 runs (`speculative_generate(...).stats`) and the verification cost
        measured on the same machine: a step's overhead is its draft and commit time plus what its
        verification took beyond the bare forward at its width (the acceptance rule, the host read)."""
        widths: Counter = Counter()
        tokens, overhead_s, steps, generations, prefill_s = 0, 0.0, 0, 0, 0.0
        for stats in runs:
            generations += 1
            prefill_s += stats.prefill_s
            for st in stats.steps:
                if st.rows != 1:
                    raise ValueError("a step profile needs batch-1 runs (a step's width is per row)")
                widths[1 + st.drafted] += 1
                tokens += st.committed
                overhead_s += st.draft_s + st.commit_s + st.verify_s - cost.at(1 + st.drafted) / 1000
                steps += 1
        if not steps:
            raise ValueError(f"profile k={chain_k} ({mode}): the runs hold no steps")
        overhead_ms = max(0.0, 1000 * overhead_s / steps)  # timing noise can make the bare forward look slower
        return cls(chain_k, mode, dict(sorted(widths.items())), tokens, overhead_ms, cost.ms[1], generations,
                   1000 * prefill_s / generations)

    @property
    def steps(self) -> int:
        return sum(self.widths.values())

    def ms_per_token(self, cost: VerifyCost) -> float:
        """Predicted milliseconds per committed token on the machine `cost` was measured on, prefills included."""
        scale = cost.ms[1] / self.t1_ms
        steps = sum(n * (cost.at(m) + self.overhead_ms * scale) for m, n in self.widths.items())
        return (steps + self.generations * self.prefill_ms * scale) / self.tokens

    def to_json(self) -> dict:
        return {"chain_k": self.chain_k, "mode": self.mode, "widths": {str(m): n for m, n in self.widths.items()},
                "tokens": self.tokens, "overhead_ms": self.overhead_ms, "t1_ms": self.t1_ms,
                "generations": self.generations, "prefill_ms": self.prefill_ms}

    @classmethod
    def from_json(cls, d: dict) -> StepProfile:
        return cls(int(d["chain_k"]), d["mode"], {int(m): int(n) for m, n in d["widths"].items()},
                   int(d["tokens"]), float(d["overhead_ms"]), float(d["t1_ms"]), int(d.get("generations", 0)),
                   float(d.get("prefill_ms", 0.0)))


@dataclass(frozen=True)
class VerifyCost:
    """Milliseconds for one target forward over M draft-tree nodes (the root included), by M."""

    ms: dict[int, float]

    def __post_init__(self) -> None:
        if 1 not in self.ms:
            raise ValueError("a verification cost needs the one-node cost (M = 1)")

    def at(self, m: int) -> float:
        if m not in self.ms:
            raise KeyError(f"no verification cost measured for {m} nodes (measured: {sorted(self.ms)})")
        return self.ms[m]

    def padding(self, margin: float = 0.05) -> dict[int, int]:
        """For each measured width M, the measured width M' > M to pad a step to where M' nodes cost at
        least `margin` less than M (the cheapest such; widths not listed are verified as they are). For
        `EngineConfig(pad_widths=...)`."""
        out = {}
        for m, t in self.ms.items():
            wider = [(c, w) for w, c in self.ms.items() if w > m and c <= (1 - margin) * t]
            if wider:
                out[m] = min(wider)[1]
        return out

    def padded(self, margin: float = 0.05) -> VerifyCost:
        """The cost of each width when steps are padded as `padding(margin)` says."""
        pads = self.padding(margin)
        return VerifyCost({m: self.ms[pads.get(m, m)] for m in self.ms})

    @classmethod
    def measure(cls, target, widths: Iterable[int], *, prefix_tokens: int = 256, vocab_size: int | None = None,
                request: FeatureRequest = NO_FEATURES, reps: int = 3,
                generator: torch.Generator | None = None) -> VerifyCost:
        """Time `target`'s verification of a chain of M nodes after a prefix of `prefix_tokens` tokens,
        for each M in `widths` (1 is always measured): the best of `reps` rounds after one untimed round.
        A round times every width once, so a burst of load on the machine touches all widths alike rather
        than the few timed while it lasted. The tokens are random (the cost does not depend on them), drawn
        from `generator` (a CPU generator) and moved to the target's device."""
        if prefix_tokens < 1:
            raise ValueError(f"prefix_tokens must be >= 1, got {prefix_tokens}")
        if reps < 1:
            raise ValueError(f"reps must be >= 1, got {reps}")
        sizes = sorted({1, *(int(m) for m in widths)})
        if sizes[0] < 1:
            raise ValueError(f"widths must be >= 1, got {sizes}")
        target = as_target(target)
        vocab = vocab_size or _vocab_size(target)
        g = generator or torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (1, prefix_tokens), generator=g)
        device = torch.device(getattr(target, "device", "cpu"))
        roots = target.prefill(Prompt.build(ids.to(device)), request).roots
        calls = {}
        for m in sizes:
            draft = DraftTree.chain(torch.randint(0, vocab, (1, m - 1), generator=g).to(device))
            calls[m] = (torch.cat([roots[:, None], draft.tokens], 1), draft.full_parents(), draft.full_valid())
        times: dict[int, list[float]] = {m: [] for m in sizes}
        for i in range(reps + 1):
            for m, (tokens, parents, valid) in calls.items():
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                target.score(tokens, parents, valid, request)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i:  # the first round warms caches and kernels up
                    times[m].append(time.perf_counter() - start)
                target.discard()
        return cls({m: 1000 * min(t) for m, t in times.items()})


def _vocab_size(target) -> int:
    model = getattr(target, "model", None)
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    if not size:
        raise ValueError("cannot tell the target's vocabulary size; pass vocab_size")
    return int(size)


def needed_widths(profiles: Iterable[StepProfile]) -> list[int]:
    """Every verification width the profiles' steps used (what `VerifyCost.measure` must time)."""
    return sorted({m for p in profiles for m in p.widths})


@dataclass(frozen=True)
class ChainChoice:
    """`chain_k`: the chosen length; `predicted[k][mode]`: each candidate's predicted speedup over the
    engine with no drafts (profile k = 0) on the measured machine; `score[k]`: the mean over the modes,
    which the choice maximises (the rule `multispec zoo tune` applies to measured speedups);
    `cost`: the measured verification cost; `pad_widths`: the padding the prediction assumed (pass it as
    `EngineConfig(pad_widths=...)`), {} for none."""

    chain_k: int
    predicted: dict[int, dict[str, float]]
    score: dict[int, float]
    cost: VerifyCost = field(repr=False)
    pad_widths: dict[int, int] = field(default_factory=dict)


def choose_chain_length(profiles: Sequence[StepProfile], cost: VerifyCost, pad: bool = False) -> ChainChoice:
    """The chain length whose profiles, priced with `cost`, predict the best mean speedup over the
    no-draft profile (k = 0), across the modes profiled for every candidate. `pad`: price every width as
    padded to a cheaper wider one (`VerifyCost.padding`), as a run with those `pad_widths` verifies."""
    pad_widths = cost.padding() if pad else {}
    priced = cost.padded() if pad else cost
    by_k: dict[int, dict[str, StepProfile]] = {}
    for p in profiles:
        by_k.setdefault(p.chain_k, {})[p.mode] = p
    if 0 not in by_k:
        raise ValueError("the profiles need the no-draft baseline (chain_k 0)")
    modes = [m for m in MODES if all(m in ps for ps in by_k.values())]
    if not modes or len(by_k) < 2:
        raise ValueError("the profiles need the baseline and at least one chain length in a common mode, "
                         f"got {sorted((p.chain_k, p.mode) for p in profiles)}")
    base = {m: by_k[0][m].ms_per_token(priced) for m in modes}
    predicted = {k: {m: base[m] / ps[m].ms_per_token(priced) for m in modes} for k, ps in sorted(by_k.items()) if k}
    score = {k: sum(v.values()) / len(v) for k, v in predicted.items()}
    return ChainChoice(max(score, key=score.get), predicted, score, cost, pad_widths)


def calibrate(target, profiles: Sequence[StepProfile], *, prefix_tokens: int = 256,
              request: FeatureRequest = NO_FEATURES, reps: int = 3, pad: bool = True) -> ChainChoice:
    """Measure `target`'s verification cost at the widths `profiles` use (and the few wider ones a step
    could be padded to) and choose the chain length; with `pad`, also the padding (`ChainChoice.pad_widths`)."""
    widths = needed_widths(profiles)
    if pad:  # room to pad the widest step too
        widths = sorted(set(widths) | set(range(1, max(widths) + 1 + PAD_LOOKAHEAD)))
    cost = VerifyCost.measure(target, widths, prefix_tokens=prefix_tokens, request=request, reps=reps)
    return choose_chain_length(profiles, cost, pad=pad)


def describe_choice(choice: ChainChoice) -> str:
    """Two lines for a benchmark's log: the measured cost and each candidate's predicted speedup."""
    cost = ", ".join(f"{m}: {v:.1f}" for m, v in sorted(choice.cost.ms.items()))
    preds = ", ".join(f"k={k} " + "/".join(f"{v:.2f}" for v in p.values()) for k, p in choice.predicted.items())
    modes = "/".join(next(iter(choice.predicted.values())))
    pads = ", ".join(f"{m}->{w}" for m, w in choice.pad_widths.items()) or "none"
    return (f"verification forward here, ms by nodes: {cost}; padding: {pads}\n"
            f"predicted speedup over no drafts ({modes}): {preds}; chosen chain k={choice.chain_k}")
