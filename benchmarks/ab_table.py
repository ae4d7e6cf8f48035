"""Before/after table from interleaved runs of one bench command on two commits (best run of each side).

    python benchmarks/ab_table.py benchmarks/results/interfaces_ab text_bytes_quick ssm_mamba2_quick
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def best(files: list[Path]) -> tuple[dict[str, float], list[str]]:
    speeds: dict[str, float] = {}
    commits = []
    for f in files:
        data = json.loads(f.read_text())
        commits.append(data["machine"]["git_commit"])
        for name, row in data["greedy"].items():
            speeds[name] = max(speeds.get(name, 0.0), row["tokens_per_s"])
    return speeds, commits


def table(folder: Path, stem: str) -> str:
    before, cb = best(sorted(folder.glob(f"{stem}_before*.json")))
    after, ca = best(sorted(folder.glob(f"{stem}_after*.json")))
    lines = [f"`{stem}`: before = commit {cb[0]} ({len(cb)} runs), after = commit {ca[0]} ({len(ca)} runs), "
             "best tok/s of each side", "",
             "| method | before tok/s | after tok/s | after / before |", "| --- | --- | --- | --- |"]
    for name in after:
        if name in before:
            lines.append(f"| `{name}` | {before[name]:.1f} | {after[name]:.1f} | {after[name] / before[name]:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    for stem in sys.argv[2:]:
        print(table(folder, stem))
        print()
