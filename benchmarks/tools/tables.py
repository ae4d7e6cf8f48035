"""Markdown tables from the stored results JSON (so BENCHMARKS.md and the README quote the files exactly).

    python benchmarks/tools/tables.py benchmarks/results/ssm_stdlib-mamba2.json [more.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from multispec.bench.recorder import SCHEMA, markdown_table
from multispec.reasoning.evaluate import markdown


def _mal(r: dict) -> str:
    return "-" if r.get("mean_accepted_length") is None else f"{r['mean_accepted_length']:.2f}"


def _outputs(r: dict) -> str:
    out = r.get("outputs")
    if not out:
        return "reference"
    return ", ".join(f"{v} {k}" for k, v in sorted(out.items()))


def _split(r: dict) -> str:
    s = r.get("per_step")
    return "-" if not s else f"{s['draft_ms']:.2f} / {s['verify_ms']:.2f} / {s['commit_ms']:.2f}"


def _speed_table(rows: dict, columns: list[tuple[str, str]], with_outputs: bool) -> list[str]:
    head = ["method", "tok/s"] + [title for _, title in columns] + ["mean accepted length"]
    split = any(r.get("per_step") for r in rows.values())
    if split:
        head.append("draft / verify / commit ms per step")
    if with_outputs:
        head.append("outputs vs plain")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, r in rows.items():
        cells = [f"`{name}`", f"{r['tokens_per_s']:.2f}"]
        cells += [f"{r[key]:.2f}x" if key in r else "-" for key, _ in columns]
        cells.append(_mal(r))
        if split:
            cells.append(_split(r))
        if with_outputs:
            cells.append(_outputs(r))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(path: Path) -> str:
    data = json.loads(path.read_text())
    machine = data.get("machine", {})
    lines = [f"<!-- {path}: {machine.get('cpu')}, {machine.get('torch_threads')} threads, "
             f"{machine.get('date_utc')} UTC, commit {machine.get('git_commit')} -->"]
    if data.get("schema") == SCHEMA:  # every bench since the one recorder
        if machine.get("gpu"):
            lines[0] = lines[0].replace(f"{machine.get('cpu')},", f"{machine['gpu']} ({machine.get('cpu')}),")
        if "kernels" in data:  # benchmarks/probes/gpu.py
            lines += ["", "| kernel | size | Triton ms | reference ms | Triton speedup | equal |",
                      "| --- | --- | --- | --- | --- | --- |"]
            lines += [f"| {r['kernel']} | {r['size']} | {r['triton_ms']:.4f} | {r['reference_ms']:.4f} | "
                      f"{r['speedup']:.2f}x | {'yes' if r['equal'] else 'NO'} |" for r in data["kernels"]]
        if data.get("scan_sweep"):
            lines += ["", "| tree scan size | BT | BP | BN | warps | ms | equal |", "| --- | --- | --- | --- | --- | --- | --- |"]
            lines += [f"| {r['size']} | {r['block_t']} | {r['block_p']} | {r['block_n']} | {r['num_warps']} | "
                      f"{r['ms']:.4f} | {r['equal']} |" for r in data["scan_sweep"]]
        for name, table in data["tables"].items():
            columns = sorted({k for r in table["methods"].values() for k in r.get("quality", {})})
            lines += ["", f"{name}:", "", markdown_table(table, [(k, k.replace("_", " ")) for k in columns])]
    elif "greedy" in data and "sampling" in data:  # bench text / bench ssm, before the recorder
        cols = [("speedup_vs_ar", "vs plain")]
        if any("speedup_vs_hf_prompt_lookup" in r for r in data["greedy"].values()):
            cols.append(("speedup_vs_hf_prompt_lookup", "vs HF prompt lookup"))
        if any("speedup_vs_adapter_ar" in r for r in data["greedy"].values()):
            cols.append(("speedup_vs_adapter_ar", "vs our 1-token loop"))
        lines += ["", "greedy:", ""] + _speed_table(data["greedy"], cols, True)
        temp = data.get("temperature", "")
        lines += ["", f"sampling (T={temp}):" if temp != "" else "sampling:", ""]
        lines += _speed_table(data["sampling"], [c for c in cols if c[0] != "speedup_vs_hf_prompt_lookup"], False)
    elif "rows" in data and data["rows"] and "ms_per_token" in data["rows"][0]:  # bench core
        lines += ["| method | ms / token | vs plain | mean accepted length | identical to plain |",
                  "| --- | --- | --- | --- | --- |"]
        for r in data["rows"]:
            mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
            lines.append(f"| {r['method']} | {r['ms_per_token']:.2f} | {r['speedup_vs_ar']:.2f}x | {mal} | "
                         f"{'yes' if r['identical_to_ar'] else 'NO'} |")
    elif "verify" in data:  # verify_cost
        lines += ["| nodes M | verify ms | x t(1) | head `F.linear` ms | head `W @ x.T` ms |",
                  "| --- | --- | --- | --- | --- |"]
        for r in data["verify"]:
            lines.append(f"| {r['nodes']} | {r['verify_ms']:.1f} | {r['x_t1']:.2f} | {r['head_linear_ms']:.1f} | "
                         f"{r['head_tall_ms']:.1f} |")
        lines.append("")
        lines.append("draft chain ms per step: " + ", ".join(f"k={k}: {v}" for k, v in data["draft_chain_ms"].items()))
    elif "rows" in data:  # verify_walk
        lines += ["| rows | per-row walk ms | batched walk ms |", "| --- | --- | --- |"]
        for r in data["rows"]:
            lines.append(f"| {r['rows']} | {r['per_row_ms']:.3f} | {r['batched_ms']:.3f} |")
    elif data.get("benchmark") == "reasoning":  # bench reasoning

        lines += ["", markdown(data["methods"])]
    elif "identical" in data:  # reproducibility
        lines += ["| generation | identical across processes |", "| --- | --- |"]
        for k, v in data["identical"].items():
            lines.append(f"| {k} | {'yes' if v else 'NO'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(render(Path(arg)))
        print()
