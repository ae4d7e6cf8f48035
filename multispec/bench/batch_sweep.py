"""Batch sweeps: what speculation is worth as requests are batched (`multispec bench text --batch 1,2,4,...`).

At batch B the rows verify B drafts at once: a verification forward's cost grows with B times the verified
nodes, where a plain step's grows with B alone, so past some B the extra verification costs more than the
accepted drafts save (SPEED-Bench's sweeps; vLLM users see it under load). Per B, the recorder times plain
batched `generate`, our engine with no drafts and each speculative row on the same ragged, left-padded batch
(prompts cut to different lengths), interleaved in rounds; throughput is tokens per second summed over the
rows. The crossover of a row is the smallest B at which it no longer beats plain batched decoding (median of
rounds); the plot shows tokens per second against B.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .recorder import Recorder, repeat


def ragged_batch(prompts: Sequence[torch.Tensor], batch: int, pad: int = 0,
                 max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [batch, W]: prompt i % P (its first `max_tokens` tokens) cut to between 60% and
    100% of its tokens (row i keeps a fraction that cycles over five steps), left-padded with `pad`."""
    rows = []
    for i in range(batch):
        ids = prompts[i % len(prompts)][0][:max_tokens]
        keep = max(2, int(len(ids) * (1.0 - 0.1 * (i % 5))))
        rows.append(ids[:keep])
    width = max(len(r) for r in rows)
    out = torch.full((batch, width), pad, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return out, mask


def sweep(methods_at: Callable[[int], dict], prompts: Sequence[torch.Tensor], batches: Sequence[int], rounds: int,
          compare: Callable | None = None, pad: int = 0, desc: str = "batch", shown: Callable | None = None,
          prompt_tokens: int | None = None) -> dict:
    """One recorder table per batch size (`methods_at(B)`: name -> callable((ids, mask)) -> output, "plain" among
    them), each over the same batch in `rounds` repeated rounds after a warm-up; `shown(B, table)` sees each table
    as soon as it is measured; `prompt_tokens`: each prompt's first tokens kept (the prefill of long prompts at a
    large B would otherwise be most of what is timed). Returns {"B": table}."""
    tables = {}
    for b in batches:
        inputs = [ragged_batch(prompts, b, pad, prompt_tokens)]
        count = lambda inp, out: _new_tokens(inp, out)  # noqa: E731
        table = Recorder(methods_at(b), "plain", count=count, compare=compare,
                         also_against=["no_draft"] if "no_draft" in methods_at(b) else ()).run(
            repeat(inputs, rounds), warmup=inputs, desc=f"{desc} B={b}")
        table["batch_size"] = b
        tables[str(b)] = table
        if shown is not None:
            shown(b, table)
    return tables


def _new_tokens(inputs, output) -> int:
    ids = inputs[0]
    seq = output.sequences if hasattr(output, "sequences") else output
    return int(seq.shape[0]) * int(seq.shape[1] - ids.shape[1])


def crossover(tables: dict) -> dict[str, int | None]:
    """Per speculative row: the smallest batch size at which its median speedup over plain batched decoding is at
    most 1 (None: it pays at every size swept)."""
    out: dict[str, int | None] = {}
    for b in sorted(tables, key=int):
        for name, row in tables[b]["methods"].items():
            if row.get("role") != "speculative" or name in out and out[name] is not None:
                continue
            out.setdefault(name, None)
            if row["speedup"] <= 1.0:
                out[name] = int(b)
    return out


def throughput_table(tables: dict) -> str:
    """Markdown: tokens/s summed over the batch, per method and batch size, and each row's speedup over plain."""
    sizes = sorted(tables, key=int)
    names = list(dict.fromkeys(n for b in sizes for n in tables[b]["methods"]))
    lines = ["| method | " + " | ".join(f"B={b}" for b in sizes) + " |", "|" + " --- |" * (len(sizes) + 1)]
    for name in names:
        cells = []
        for b in sizes:
            row = tables[b]["methods"].get(name)
            cells.append("-" if row is None else f"{row['tokens_per_s']:.0f} tok/s ({row['speedup']:.2f}x)")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_sweep(tables: dict, path) -> None:
    import matplotlib  # optional: the report extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(tables, key=int)
    names = list(dict.fromkeys(n for b in sizes for n in tables[b]["methods"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in names:
        xs = [int(b) for b in sizes if name in tables[b]["methods"]]
        ys = [tables[str(b)]["methods"][name]["tokens_per_s"] for b in xs]
        ax.plot(xs, ys, marker="o", label=name, lw=2 if name in ("plain", "no_draft") else 1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (ragged prompts)")
    ax.set_ylabel("tokens/s, summed over the batch")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["crossover", "plot_sweep", "ragged_batch", "sweep", "throughput_table"]
