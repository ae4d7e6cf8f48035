"""The one benchmark recorder every `multispec bench` goes through.

A shared machine drifts: its speed changes by tens of percent over minutes, and the first call of a
method pays for lazy set-up (weight packing, kernel selection, rope tables). So the recorder

- warms every method up on an input it then times (a warm-up on other, shorter inputs leaves the first
  timed call cold);
- runs the methods interleaved, input by input, in rounds (plain, A, B, ..., plain, A, B, ...), so a slow
  minute slows every method alike;
- takes each method's ratio to the baseline from one round at a time, and reports the median of those
  ratios with their spread (min, max): a figure without its spread cannot be compared with a rerun.

Rounds either repeat the same inputs (`repeat`: the spread is the machine's noise), split a long input
list (`partition`: the spread also holds how the inputs differ; for benches too slow to repeat), or repeat
them sampled from a new seed each round (`redraw`: the spread also holds the draw).

One JSON schema (`SCHEMA`) for every bench:

    {"schema", "benchmark", "machine" (with the git commit), "settings",
     "tables": {TABLE: {"baseline", "unit", "rounds", "round_inputs", "inputs_per_round",
                        "methods": {NAME: {"role" (`with_role`), "speedup", "speedup_spread", "speedup_rounds",
                                           "<unit>_per_s", "seconds", "<unit>", "mean_accepted_length",
                                           "per_step_ms", "prefill_s", "outputs", "quality", ...}}}},
     ...bench-specific summary fields}
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from .machine import machine_info
from ..heap import keep_freed_memory
from ..shards import Shards

SCHEMA = "multispec.bench/1"
SPLIT_KEYS = ("prefill_s", "draft_s", "verify_s", "commit_s")


ROLES = ("baseline", "speculative", "control", "peer", "reference")


def with_role(role: str, method):
    """`method` tagged with what its row is in a table: "speculative" (the default: a method under test),
    "control" (our engine without speculation, or a method run to explain another's figure), "peer" (another
    library's method, e.g. `transformers`' assisted generation), "reference" (a model alone that is not the
    baseline, e.g. the small model of a reasoning pair). Reports pick rows by role, not by name."""
    if role not in ROLES:
        raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    method.role = role
    return method


@dataclass
class Fresh:
    """A method whose state must start over at every round: `make()` returns the callable for one round.

    Training-free drafters (Token Recycling, SuffixDecoding) learn from what they generate; in a repeated
    round one would draft its own earlier output for the same input back verbatim."""

    make: Callable[[], Callable[[Any], Any]]


def sequences(output: Any) -> Any:
    """The token ids of a `generate`-like output (a tensor, or an output with `.sequences`)."""
    return output.sequences if hasattr(output, "sequences") else output


def generated_tokens(inputs: Any, output: Any) -> int:
    """New tokens of a `generate`-like call: rows x (output length - prompt length)."""
    seq = sequences(output)
    ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs
    return int(seq.shape[0]) * int(seq.shape[1] - ids.shape[1])


@dataclass
class Tally:
    """One method's time, output units and speculative statistics over some calls."""

    seconds: float = 0.0
    units: float = 0.0
    committed: int = 0
    row_forwards: int = 0
    steps: int = 0
    split: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SPLIT_KEYS, 0.0))
    lengths: Counter = field(default_factory=Counter)  # steps by tokens committed per row (the accepted length)

    def add(self, seconds: float, units: float, stats: Any = None) -> None:
        self.seconds += seconds
        self.units += units
        if stats is not None:  # a SpeculativeStats: our loop's per-step record
            self.committed += stats.committed
            self.row_forwards += sum(st.rows for st in stats.steps)
            self.steps += stats.target_forwards
            for key in SPLIT_KEYS:
                self.split[key] += getattr(stats, key)
            self.lengths.update(round(st.committed / st.rows) for st in stats.steps if st.rows)

    def merge(self, other: Tally) -> None:
        self.seconds += other.seconds
        self.units += other.units
        self.committed += other.committed
        self.row_forwards += other.row_forwards
        self.steps += other.steps
        for key in SPLIT_KEYS:
            self.split[key] += other.split[key]
        self.lengths.update(other.lengths)

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0


def _spread(values: list[float]) -> tuple[float, list[float]]:
    return round(statistics.median(values), 3), [round(min(values), 3), round(max(values), 3)]


class Recorder:
    """Times `methods` (name -> callable(input) -> output, or a `Fresh`) against `baseline`, interleaved.

    `count(input, output)` gives the output's units (default: generated tokens); `stats_of(output)` its
    `SpeculativeStats` (default: `output.stats` when present); `compare(reference, output, input)` classifies an
    output against the baseline's for the same input (e.g. "identical" / "mismatch"; counted per method);
    `observe(name, input, output)` sees every timed output (for quality figures)."""

    def __init__(self, methods: dict[str, Callable | Fresh], baseline: str, *, unit: str = "tokens",
                 count: Callable[[Any, Any], float] = generated_tokens,
                 stats_of: Callable[[Any], Any] = lambda out: getattr(out, "stats", None),
                 compare: Callable[[Any, Any, Any], str] | None = None,
                 observe: Callable[[str, Any, Any], None] | None = None,
                 also_against: Sequence[str] = ()) -> None:
        if baseline not in methods:
            raise ValueError(f"baseline: {baseline!r} is not one of the methods ({', '.join(methods)})")
        for other in also_against:
            if other not in methods:
                raise ValueError(f"also_against: {other!r} is not one of the methods")
        # the baseline runs first for every input: it is the reference the others are compared with
        self.methods = {baseline: methods[baseline]} | {k: v for k, v in methods.items() if k != baseline}
        self.roles = {name: "baseline" if name == baseline else getattr(m, "role", "speculative")
                      for name, m in self.methods.items()}
        self.baseline, self.unit, self.count, self.stats_of = baseline, unit, count, stats_of
        self.compare, self.observe, self.also_against = compare, observe, tuple(also_against)

    def _callables(self) -> dict[str, Callable]:
        return {name: m.make() if isinstance(m, Fresh) else m for name, m in self.methods.items()}

    def run(self, rounds: Sequence[Sequence[Any]], warmup: Sequence[Any] | None = None, desc: str = "bench",
            round_inputs: str = "repeat", progress: bool = True, shards: Shards | None = None,
            first_round: Callable[[dict], None] | None = None) -> dict:
        """Time every method on every input of every round; returns the table (see the module docstring).

        `warmup`: inputs each method runs once, untimed, before the first round (default: the first round's
        first input, so the first timed call of a method is never its first call on inputs of that kind);
        `progress`: show progress bars; `shards`: this process's part of a data-parallel run (it takes its
        share of every round; the tallies of all processes are pooled per round, on every process);
        `first_round(table)`: sees the table of the first round as soon as it is measured (a first look at a long
        run; one process)."""
        if not rounds or any(len(r) == 0 for r in rounds):
            raise ValueError("rounds: expected at least one non-empty round of inputs")
        if round_inputs not in ("repeat", "partition", "redraw"):
            raise ValueError(f"round_inputs: expected 'repeat', 'partition' or 'redraw', got {round_inputs!r}")
        keep_freed_memory()  # timings compare computation, not which method the heap hands fresh pages to
        shards = shards or Shards()
        progress = progress and shards.main  # one set of bars in a data-parallel run
        warm = self._callables()
        warm_inputs = list(rounds[0][:1] if warmup is None else warmup)
        with tqdm(total=len(warm_inputs) * len(warm), desc=f"{desc} (warm-up)", unit="call", leave=False,
                  disable=not progress) as bar:  # ticks per method: a slow model's warm-up shows it moves
            for inputs in warm_inputs:
                for name, fn in warm.items():
                    bar.set_postfix_str(name)
                    fn(inputs)
                    bar.update()
        full_rounds, rounds = rounds, [shards.take(r) for r in rounds]
        per_round: list[dict[str, Tally]] = []
        outputs: dict[str, Counter] = {name: Counter() for name in self.methods}
        early = None
        if first_round is not None and len(rounds) > 1 and shards.world == 1:
            early = lambda: first_round(self._partial(per_round, outputs, rounds, round_inputs))  # noqa: E731
        try:
            self._rounds(rounds, per_round, outputs, desc, progress, early)
        except KeyboardInterrupt:  # Ctrl-C: the rounds completed so far, printed, before the interrupt goes on
            if per_round and shards.world == 1:
                partial = self._partial(per_round, outputs, rounds, round_inputs)
                print("\n" + format_table(f"{desc}: interrupted after {len(per_round)} of {len(rounds)} rounds",
                                          partial))
            raise
        if shards.world > 1:
            per_round, outputs = _pooled(shards.gather((per_round, outputs)))
        methods = {name: self._row(name, per_round, outputs[name]) for name in self.methods}
        table = {"baseline": self.baseline, "unit": self.unit, "rounds": len(full_rounds),
                 "round_inputs": round_inputs, "inputs_per_round": [len(r) for r in full_rounds], "methods": methods}
        if shards.world > 1:
            table["processes"] = shards.world
        return table

    def _partial(self, per_round: list[dict[str, Tally]], outputs: dict[str, Counter], rounds, round_inputs: str
                 ) -> dict:
        """The table of the rounds finished so far."""
        return {"baseline": self.baseline, "unit": self.unit, "rounds": len(per_round), "round_inputs": round_inputs,
                "inputs_per_round": [len(r) for r in rounds[:len(per_round)]],
                "methods": {name: self._row(name, per_round, outputs[name]) for name in self.methods}}

    def _rounds(self, rounds: Sequence[Sequence[Any]], per_round: list[dict[str, Tally]],
                outputs: dict[str, Counter], desc: str, progress: bool, early: Callable | None = None) -> None:
        """Run the timed rounds, appending each finished round's tallies to `per_round` (`early()` after the
        first)."""
        total = sum(len(r) for r in rounds)
        with tqdm(total=total * len(self.methods), desc=desc, unit="call", disable=not progress) as bar:
            for i, inputs_of_round in enumerate(rounds):
                bar.set_postfix_str(f"round {i + 1}/{len(rounds)}")
                fns, tallies = self._callables(), {name: Tally() for name in self.methods}
                for inputs in inputs_of_round:
                    reference = None
                    for name, fn in fns.items():
                        start = time.perf_counter()
                        out = fn(inputs)
                        tallies[name].add(time.perf_counter() - start, self.count(inputs, out), self.stats_of(out))
                        if self.compare is not None:
                            if name == self.baseline:
                                reference = out
                            else:
                                outputs[name][self.compare(reference, out, inputs)] += 1
                        if self.observe is not None:
                            self.observe(name, inputs, out)
                        bar.update()
                per_round.append(tallies)
                if early is not None and i == 0:
                    bar.clear()
                    early()

    def _row(self, name: str, per_round: list[dict[str, Tally]], outputs: Counter) -> dict:
        pooled = Tally()
        for tallies in per_round:
            pooled.merge(tallies[name])
        row: dict[str, Any] = {"role": self.roles[name]}
        for base in (self.baseline, *self.also_against):
            ratios = [t[name].rate / t[base].rate if t[base].rate > 0 else float("nan") for t in per_round]
            median, spread = _spread(ratios)
            key = "speedup" if base == self.baseline else f"speedup_vs_{base}"
            row[key], row[f"{key}_spread"] = median, spread
            if base == self.baseline:
                row["speedup_rounds"] = [round(r, 3) for r in ratios]
        row |= {f"{self.unit}_per_s": round(pooled.rate, 3), "seconds": round(pooled.seconds, 3),
                self.unit: pooled.units,
                "mean_accepted_length": round(pooled.committed / pooled.row_forwards, 3) if pooled.row_forwards
                else None}
        if pooled.steps:  # per verification step, in ms; "other" is the loop's own time outside the four
            row["per_step_ms"] = {k[:-2]: round(pooled.split[k] / pooled.steps * 1e3, 3) for k in SPLIT_KEYS[1:]}
            row["per_step_ms"]["other"] = round((pooled.seconds - sum(pooled.split.values())) / pooled.steps * 1e3, 3)
            row["prefill_s"] = round(pooled.split["prefill_s"], 3)
        if pooled.lengths:  # how many steps committed 1, 2, ... tokens (per row)
            row["accepted_length_histogram"] = {str(k): v for k, v in sorted(pooled.lengths.items())}
        if outputs:
            row["outputs"] = dict(sorted(outputs.items()))
        return row


def _pooled(parts: list[tuple[list[dict[str, Tally]], dict[str, Counter]]]):
    """The processes' (per-round tallies, output counts) as one process's: tallies merged round by round."""
    per_round, outputs = parts[0]
    for other_rounds, other_outputs in parts[1:]:
        for tallies, others in zip(per_round, other_rounds):
            for name, tally in tallies.items():
                tally.merge(others[name])
        for name, counts in outputs.items():
            counts.update(other_outputs[name])
    return per_round, outputs


def repeat(inputs: Sequence[Any], rounds: int) -> list[list[Any]]:
    """`rounds` rounds over the same inputs."""
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    return [list(inputs) for _ in range(rounds)]


def partition(inputs: Sequence[Any], rounds: int) -> list[list[Any]]:
    """The inputs split into `rounds` consecutive, near-equal rounds (fewer if there are fewer inputs)."""
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    inputs = list(inputs)
    rounds = min(rounds, len(inputs))
    size, extra = divmod(len(inputs), rounds)
    out, start = [], 0
    for i in range(rounds):
        end = start + size + (1 if i < extra else 0)
        out.append(inputs[start:end])
        start = end
    return out


def results(benchmark: str, settings: dict, tables: dict[str, dict], **summary: Any) -> dict:
    """A bench's results in the one schema."""
    return {"schema": SCHEMA, "benchmark": benchmark, "machine": machine_info(), "settings": settings,
            "tables": tables, **summary}


def outputs_identical(tables: dict[str, dict]) -> bool:
    """Whether every compared output in every table was identical to its baseline's."""
    for table in tables.values():
        for row in table["methods"].values():
            if any(verdict != "identical" and n for verdict, n in row.get("outputs", {}).items()):
                return False
    return True


LEGEND = ("speedup: median over rounds of (method throughput / baseline throughput in the same round), "
          "[min-max] across rounds; acc. len: tokens committed per target forward, bonus token included; "
          "ms per step: draft / verify / commit / other")


def lossless(row: dict, table_name: str) -> bool:
    """Whether a row keeps the baseline's output: its own word (`lossless`), else its measured departure (`max_tvd`
    0), else its outputs all identical to the baseline's (greedy), else a sampling table's exact rule."""
    if "lossless" in row:
        return bool(row["lossless"])
    if row.get("max_tvd") is not None:
        return row["max_tvd"] == 0
    if row.get("outputs"):
        return set(row["outputs"]) == {"identical"}
    return table_name == "sampling"


def row_output(row: dict, table: dict, table_name: str) -> str:
    """What a row gives up, if anything: a lossy row is never shown as if it were lossless."""
    if row.get("max_tvd"):
        return f"lossy: max TVD {row['max_tvd']:.3f} per token"
    if "accuracy" in row:
        base = table["methods"][table["baseline"]].get("accuracy")
        kept = "" if lossless(row, table_name) else "lossy: "
        return f"{kept}accuracy {row['accuracy']:.3f}" + ("" if base is None else f" (`{table['baseline']}` {base:.3f})")
    verdicts = row.get("outputs")
    if verdicts:
        return ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) + " to the baseline's"
    return "exact speculative sampling" if row.get("max_tvd") == 0 or table_name == "sampling" else "-"


def format_table(title: str, table: dict, columns: Sequence[tuple[str, str]] = ()) -> str:
    """A plain-text table of one recorder table: throughput, speedup [spread], accepted length, step split,
    output verdicts, plus `columns` (key, heading) read from each row (or its `quality`)."""
    unit = table["unit"]
    base = table["methods"][table["baseline"]]
    extra = [c for c in base if c.startswith("speedup_vs_") and not c.endswith("spread") and f"{c}_spread" in base]
    head = (f"{title:30s} {unit + '/s':>9s} {'speedup [spread]':>20s} "
            + "".join(f" {'vs ' + c[len('speedup_vs_'):]:>21s}" for c in extra)
            + f" {'acc. len':>8s} {'ms per step':>24s}" + "".join(f" {h:>10s}" for _, h in columns) + "  outputs")
    lines = [head]
    for name, r in table["methods"].items():
        def ratio(key: str) -> str:
            lo, hi = r[f"{key}_spread"]
            return f"{r[key]:.2f}x [{lo:.2f}-{hi:.2f}]"
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        split = "/".join(f"{v:.2f}" for v in r["per_step_ms"].values()) if "per_step_ms" in r else "-"
        cells = []
        for key, _ in columns:
            value = r.get(key, r.get("quality", {}).get(key))
            cells.append(f" {'-' if value is None else (f'{value:.3f}' if isinstance(value, float) else str(value)):>10s}")
        shown = "reference" if name == table["baseline"] else (
            ", ".join(f"{n} {v}" for v, n in r["outputs"].items()) if "outputs" in r else "")
        lines.append(f"{name:30s} {r[f'{unit}_per_s']:9.2f} {ratio('speedup'):>20s} "
                     + "".join(f" {ratio(c):>21s}" for c in extra)
                     + f" {mal:>8s} {split:>24s}" + "".join(cells) + f"  {shown}")
    lines.append(f"{table['rounds']} rounds ({table['round_inputs']}, inputs per round {table['inputs_per_round']})")
    return "\n".join(lines)


def markdown_table(table: dict, columns: Sequence[tuple[str, str]] = ()) -> str:
    """One recorder table as Markdown (BENCHMARKS.md quotes the stored JSON through this): throughput,
    speedup [spread] against the baseline and any other baseline, mean accepted length, step split,
    `columns` (key, heading) read from each row or its `quality`, and the output verdicts."""
    unit = table["unit"]
    rows = table["methods"]
    base = rows[table["baseline"]]  # other baselines are those with a spread (`speedup_vs_base` alone is an alias)
    others = [k for k in base if k.startswith("speedup_vs_") and not k.endswith("_spread") and f"{k}_spread" in base]
    split = any("per_step_ms" in r for r in rows.values())
    compared = any("outputs" in r for r in rows.values())
    head = (["method", f"{unit}/s", f"vs {table['baseline']} [spread]"] + [f"vs {k[11:]} [spread]" for k in others]
            + ["mean accepted length"] + (["draft / verify / commit / other ms per step"] if split else [])
            + [h for _, h in columns] + ([f"outputs vs {table['baseline']}"] if compared else []))
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, r in rows.items():
        cells = [f"`{name}`", f"{r[f'{unit}_per_s']:.2f}"]
        for key in ("speedup", *others):
            lo, hi = r[f"{key}_spread"]
            cells.append(f"{r[key]:.2f}x [{lo:.2f}-{hi:.2f}]")
        cells.append("-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}")
        if split:
            cells.append(" / ".join(f"{v:.2f}" for v in r["per_step_ms"].values()) if "per_step_ms" in r else "-")
        for key, _ in columns:
            value = r.get(key, r.get("quality", {}).get(key))
            cells.append("-" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value)))
        if compared:
            cells.append("reference" if name == table["baseline"] else
                         ", ".join(f"{n} {v}" for v, n in r.get("outputs", {}).items()))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\n{table['rounds']} rounds ({table['round_inputs']}); speedup: median of the per-round ratios, "
                 "[min-max] across rounds.")
    return "\n".join(lines)
