"""Before/after table of one bench command run on two commits: each method's speedup with its spread across
rounds on both sides, whether the two agree (each side's median inside the other side's [min-max]), and, for
the greedy rows, whether the accepted lengths are equal (the same tokens decoded the same way: a change that
only moved code must leave them as they were).

    python benchmarks/tools/ab_table.py BEFORE.json AFTER.json [TABLE ...]          (default: every table)
    python benchmarks/tools/ab_table.py --before B1.json B2.json --after A1.json A2.json [--tables greedy]

With several runs a side (interleaved: before, after, before, after, ...), their rounds are pooled: the median
and [min-max] over every round of that side.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def pooled(docs: list[dict], table: str) -> dict[str, dict]:
    """Per method: the median speedup and [min, max] over the rounds of every run, and the accepted length(s)."""
    out: dict[str, dict] = {}
    for doc in docs:
        for name, row in doc["tables"][table]["methods"].items():
            entry = out.setdefault(name, {"rounds": [], "accepted": set()})
            entry["rounds"] += row.get("speedup_rounds") or [row["speedup"]]
            if row.get("mean_accepted_length") is not None:
                entry["accepted"].add(round(row["mean_accepted_length"], 4))
    for entry in out.values():
        entry["speedup"] = statistics.median(entry["rounds"])
        entry["speedup_spread"] = [min(entry["rounds"]), max(entry["rounds"])]
    return out


def agree(before: dict, after: dict) -> bool:
    """Whether one side's median speedup lies inside the other side's [min, max] across rounds."""
    (blo, bhi), (alo, ahi) = before["speedup_spread"], after["speedup_spread"]
    return blo <= after["speedup"] <= bhi or alo <= before["speedup"] <= ahi


def commits(docs: list[dict]) -> str:
    return ", ".join(sorted({str(d["machine"].get("git_commit")) for d in docs}))


def table(before: list[dict], after: list[dict], name: str) -> str:
    b, a = pooled(before, name), pooled(after, name)
    cell = lambda r: f"{r['speedup']:.2f}x [{r['speedup_spread'][0]:.2f}-{r['speedup_spread'][1]:.2f}]"  # noqa: E731
    lines = [f"`{name}`: before = {len(before)} run(s), commit {commits(before)}; after = {len(after)} run(s), "
             f"commit {commits(after)}; rounds pooled", "",
             "| method | before speedup [spread] | after speedup [spread] | agree | accepted length before / after |",
             "| --- | --- | --- | --- | --- |"]
    for method in a:
        if method in b:
            acc_b, acc_a = sorted(b[method]["accepted"]), sorted(a[method]["accepted"])
            accepted = "-" if not acc_a else f"{'/'.join(map(str, acc_b))} / {'/'.join(map(str, acc_a))}"
            lines.append(f"| `{method}` | {cell(b[method])} | {cell(a[method])} | "
                         f"{'yes' if agree(b[method], a[method]) else 'NO'} | {accepted} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="BEFORE.json AFTER.json [TABLE ...]")
    parser.add_argument("--before", nargs="+", default=None, metavar="JSON")
    parser.add_argument("--after", nargs="+", default=None, metavar="JSON")
    parser.add_argument("--tables", nargs="+", default=None)
    args = parser.parse_args()
    if args.before or args.after:
        if not (args.before and args.after) or args.files:
            parser.error("give --before and --after (several runs each), or BEFORE.json AFTER.json")
        before_paths, after_paths, names = args.before, args.after, args.tables
    else:
        if len(args.files) < 2:
            parser.error("give BEFORE.json AFTER.json")
        before_paths, after_paths, names = [args.files[0]], [args.files[1]], args.files[2:] or args.tables
    before = [json.loads(Path(p).read_text()) for p in before_paths]
    after = [json.loads(Path(p).read_text()) for p in after_paths]
    for name in names or list(after[0]["tables"]):
        print(table(before, after, name))
        print()


if __name__ == "__main__":
    main()
