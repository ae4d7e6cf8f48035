"""Before/after table of one bench command run on two commits: each method's speedup with its spread
across rounds on both sides, and whether the two agree (one side's median inside the other side's spread).

    python benchmarks/ab_table.py BEFORE.json AFTER.json [TABLE ...]   (default: every table)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def agree(before: dict, after: dict) -> bool:
    """Whether one side's median speedup lies inside the other side's [min, max] across rounds."""
    (blo, bhi), (alo, ahi) = before["speedup_spread"], after["speedup_spread"]
    return blo <= after["speedup"] <= bhi or alo <= before["speedup"] <= ahi


def table(before: dict, after: dict, name: str) -> str:
    b, a = before["tables"][name]["methods"], after["tables"][name]["methods"]
    lines = [f"`{name}`: before = commit {before['machine']['git_commit']}, after = commit "
             f"{after['machine']['git_commit']}", "",
             "| method | before speedup [spread] | after speedup [spread] | agree |", "| --- | --- | --- | --- |"]
    for method in a:
        if method in b:
            cell = lambda r: f"{r['speedup']:.2f}x [{r['speedup_spread'][0]:.2f}-{r['speedup_spread'][1]:.2f}]"  # noqa: E731
            lines.append(f"| `{method}` | {cell(b[method])} | {cell(a[method])} | "
                         f"{'yes' if agree(b[method], a[method]) else 'NO'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    before, after = (json.loads(Path(p).read_text()) for p in sys.argv[1:3])
    for name in sys.argv[3:] or list(after["tables"]):
        print(table(before, after, name))
        print()
