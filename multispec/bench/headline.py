"""README's headline table, generated from the stored results so it cannot go stale.

Each headline names a row of a benchmark table (benchmark, pair, table, method; `{k}` stands for any chain length)
and the page that explains it. The figure comes from the newest stored run that holds that row on its test split
(every results JSON in the recorder's schema, `bench all`'s nested ones included), with that run's machine and
date: a rerun supersedes an older figure by itself. `multispec bench all` rewrites the block;
tests/test_docs.py checks that README holds what the stored results render.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .recorder import SCHEMA, row_output

BEGIN, END = "<!-- headline: begin (generated from benchmarks/results) -->", "<!-- headline: end -->"
TEST_SPLITS = (None, "heldout", "test")  # figures are reported on the test split (choices are made on validation)


@dataclass(frozen=True)
class Headline:
    label: str  # what the row is, without figures
    benchmark: str
    pair: str | None  # None: the benchmark has one (a GPU run names the pair as its table)
    table: str
    method: str  # a row name, `{k}` for the chain length
    page: str  # the docs page that explains the figure
    against: tuple[str, ...] = ()  # other rows of the table whose ratio is shown too (`speedup_vs_X`)
    settings: tuple[tuple[str, object], ...] = ()  # settings the run must have (what tells configurations apart)


TEXT = "docs/benchmarks/text.md"
HEADLINES = (
    Headline("EAGLE head, chain (the length calibrated where it runs), the main pair: a 20-layer byte Llama",
             "text", "stdlib-bytes-large", "greedy", "eagle_chain_k{k}", TEXT + "#stdlib-bytes-large-pair-the-main-job",
             ("no_draft", "hf_assisted")),
    Headline("n-gram lookup, else the EAGLE chain", "text", "stdlib-bytes-large", "greedy", "hybrid_chain_k{k}",
             TEXT + "#stdlib-bytes-large-pair-the-main-job"),
    Headline("EAGLE dynamic tree", "text", "stdlib-bytes-large", "greedy", "eagle_dynamic_tree",
             TEXT + "#stdlib-bytes-large-pair-the-main-job"),
    Headline("Token Recycling tree", "text", "stdlib-bytes-large", "greedy", "recycling_tree",
             TEXT + "#stdlib-bytes-large-pair-the-main-job"),
    Headline("EAGLE head, sampling at T=0.8", "text", "stdlib-bytes-large", "sampling", "eagle_chain_k{k}",
             TEXT + "#stdlib-bytes-large-pair-the-main-job"),
    Headline("EAGLE head, the small byte pair (its target costs about 3x a head call)", "text", "stdlib-bytes",
             "greedy", "eagle_chain_k{k}", TEXT + "#stdlib-bytes-pair"),
    Headline("n-gram lookup, Gemma 3 270M (the model's own LM head)", "text", "gemma3-270m-eagle", "greedy",
             "ngram_chain_k{k}", TEXT + "#gemma-3-270m-pair", ("hf_prompt_lookup",)),
    Headline("prompt lookup chosen for chat (chains from 2-3-grams), Gemma 3 270M on the chat set's questions", "chat",
             "gemma3-270m-eagle", "greedy", "ngram_chain_k{k}_min2",
             "docs/benchmarks/chat.md#prompt-lookup-chosen-for-chat-the-test-split", ("hf_prompt_lookup",)),
    Headline("EAGLE chain in CUDA graphs, the main pair", "gpu", None, "stdlib-bytes-large",
             "eagle_chain_k{k}_static_graphs", "docs/benchmarks/gpu.md#end-to-end-the-main-pair",
             ("no_draft_static_graphs", "hf_assisted")),
    Headline("draft model chain, a random 67M Llama (layer-skip draft)", "core", None, "greedy", "draft_chain_k{k}",
             "docs/benchmarks/core.md#core-machinery-random-weight-pair", ("hf_assisted",)),
    Headline("Token Recycling tree, the random 67M Llama", "core", None, "greedy", "recycling_tree",
             "docs/benchmarks/core.md#core-machinery-random-weight-pair"),
    Headline("STree, Mamba-2 draft, dynamic tree", "ssm", "stdlib-mamba2", "greedy", "stree_dynamic",
             "docs/benchmarks/ssm.md#stree-on-mamba-2-and-bamba"),
    Headline("EAGLE for a VLM, chain", "vision", "vqa-llava", "greedy", "eagle_chain_k8",
             "docs/benchmarks/vision.md#vqa-llava-pair", ("hf_assisted_small_vlm",)),
    Headline("ViSpec drafter, words and 256 image tokens", "vision", "vqa-words-llava", "greedy", "vispec_chain_k{k}",
             "docs/benchmarks/vision.md#vqa-llava-pair"),
    Headline("SpecVLM drafter, words and 256 image tokens", "vision", "vqa-words-llava", "greedy",
             "specvlm_chain_k{k}", "docs/benchmarks/vision.md#vqa-llava-pair"),
    Headline("exact speculative sampling, image tokens (int8 target)", "image-ar", "mnist-vq-gpt", "sampling",
             "exact_chain_k{k}", "docs/benchmarks/image_ar.md#lantern-mnist-vq-gpt"),
    Headline("LANTERN, delta 0.2 (lossy)", "image-ar", "mnist-vq-gpt", "sampling", "lantern_d0.2_chain_k{k}",
             "docs/benchmarks/image_ar.md#lantern-mnist-vq-gpt"),
    Headline("continuous speculative decoding, exact, the fixed-shape step", "continuous-static",
             "mnist-patch-diffusion", "sampling", "spec_k{k}_static",
             "docs/benchmarks/image_ar.md#continuous-tokens-mnist-patch-diffusion"),
    Headline("SpecReason, likelihood scorer (lossy)", "reasoning", "arith-reasoning", "greedy",
             "specreason_likelihood", "docs/benchmarks/reasoning.md#arith-reasoning-pair-test-split"),
    Headline("Speculative Thinking (lossy)", "reasoning", "arith-reasoning", "greedy", "spec_thinking",
             "docs/benchmarks/reasoning.md#arith-reasoning-pair-test-split"),
    Headline("judge decoding, small model, chain (lossy)", "reasoning", "arith-reasoning", "greedy", "judge",
             "docs/benchmarks/reasoning.md#arith-reasoning-pair-test-split", settings=(("drafter", "small"),)),
    Headline("its control: a head approving every token at the same floor", "reasoning", "arith-reasoning",
             "greedy", "judge_approve_all", "docs/benchmarks/reasoning.md#arith-reasoning-pair-test-split",
             settings=(("drafter", "small"),)),
    Headline("judge decoding, the styled drafter (lossy)", "reasoning", "arith-reasoning", "greedy", "judge",
             "docs/benchmarks/reasoning.md#judge-decoding-with-the-styled-drafter", settings=(("drafter", "styled"),)),
    Headline("its control: approve-all at the same floor", "reasoning", "arith-reasoning", "greedy",
             "judge_approve_all", "docs/benchmarks/reasoning.md#judge-decoding-with-the-styled-drafter",
             settings=(("drafter", "styled"),)),
)


def stored_results(folder: Path) -> Iterator[tuple[str, dict, dict]]:
    """(file name, one benchmark's results, its machine) for every results JSON in the recorder's schema under
    `folder`, `bench all`'s benchmarks one by one."""
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            continue
        if doc.get("benchmark") == "all":
            for result in doc.get("benches", {}).values():
                yield path.name, result, result.get("machine") or doc["machine"]
        else:
            yield path.name, doc, doc.get("machine", {})


def _pair(result: dict) -> str | None:
    settings = result.get("settings") or {}  # `eval chat` names its pair (or checkpoint) `source`
    return settings.get("pair") or result.get("pair") or settings.get("source")


def _matches(h: Headline, result: dict, table: str) -> bool:
    settings = result.get("settings") or {}
    return (result.get("benchmark") == h.benchmark and table == h.table and settings.get("split") in TEST_SPLITS
            and (h.pair is None or _pair(result) == h.pair) and all(settings.get(k) == v for k, v in h.settings))


def newest(h: Headline, folder: Path) -> tuple[str, dict, dict, str, dict] | None:
    """(file, machine, table, method name, row) of the newest stored run holding the headline's row."""
    pattern = re.compile(re.escape(h.method).replace(re.escape("{k}"), r"\d+") + "$")
    found = []
    for name, result, machine in stored_results(folder):
        for table_name, table in result.get("tables", {}).items():
            if not _matches(h, result, table_name):
                continue
            rows = [(m, r) for m, r in table["methods"].items() if pattern.match(m)]
            chosen = f"_k{(result.get('settings') or {}).get('chain_k')}"  # the run's own chain length first
            rows.sort(key=lambda mr: chosen not in mr[0])
            if rows:
                found.append((machine.get("date_utc", ""), name, machine, table, *rows[0]))
    if not found:
        return None
    _, name, machine, table, method, row = max(found, key=lambda f: (f[0], f[1]))
    return name, machine, table, method, row


def _machine(m: dict) -> str:
    if m.get("gpu"):
        return m["gpu"]
    cpu = m.get("cpu", "?").replace("(R)", "").replace(" Processor", "")
    return f"{cpu}, {m.get('torch_threads', '?')} threads"


def _figure(table: dict, method: str, row: dict, against: tuple[str, ...], table_name: str) -> str:
    lo, hi = row["speedup_spread"]
    parts = [f"{row['speedup']:.2f}x [{lo:.2f}-{hi:.2f}] over `{table['baseline']}`"]
    parts += [f"{row[f'speedup_vs_{a}']:.2f}x over `{a}`" for a in against if f"speedup_vs_{a}" in row]
    parts += [f"`{a}` {table['methods'][a]['speedup']:.2f}x" for a in against
              if f"speedup_vs_{a}" not in row and a in table["methods"]]
    if row.get("mean_accepted_length") is not None:
        parts.append(f"accepted {row['mean_accepted_length']:.2f} a step")
    output = row_output(row, table, table_name)
    return "; ".join(parts) + ("" if output == "-" else f"; {output}")


def render(folder: Path) -> str:
    """The headline table: one line per headline found in the stored results (a headline with none is left out)."""
    lines = ["| method (pair) | figure (row; speedup [spread across rounds]) | machine, date | results, page |",
             "| --- | --- | --- | --- |"]
    for h in HEADLINES:
        hit = newest(h, folder)
        if hit is None:
            continue
        name, machine, table, method, row = hit
        pair = h.pair or (h.table if h.benchmark == "gpu" else None)
        lines.append(f"| {h.label}{f' (`{pair}`)' if pair else ''} | `{method}`: {_figure(table, method, row, h.against, h.table)} | "
                     f"{_machine(machine)}, {machine.get('date_utc', '?')[:10]} | "
                     f"[{name}](benchmarks/results/{name}), [page]({h.page}) |")
    return "\n".join(lines)


__all__ = ["BEGIN", "END", "HEADLINES", "Headline", "newest", "render", "stored_results"]
