"""How long the `multispec` command takes to answer before it does any work, as a user types it.

    python benchmarks/probes/cli_startup.py [--rounds 7] [--json benchmarks/results/cli_startup.json]

Times `multispec --help` and `multispec generate --help` (which load no torch) beside `multispec zoo --help` (the
control: it builds the whole command line, modalities included, as every command that runs does) and `python -c
"import torch"` (what the help would cost at least if it loaded torch), each in a fresh process, interleaved in
rounds; stores the median and [min-max] of each with the machine. Results: docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from multispec.bench.machine import busy, machine_info

COMMANDS = {
    "multispec --help": ["multispec", "--help"],
    "multispec generate --help": ["multispec", "generate", "--help"],
    "multispec zoo --help (the whole command line)": ["multispec", "zoo", "--help"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    multispec = shutil.which("multispec") or str(Path(sys.executable).with_name("multispec"))
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, command in COMMANDS.items():
            command = [multispec, *command[1:]] if command[0] == "multispec" else command
            t0 = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            seconds[name].append(time.perf_counter() - t0)
    out = {"machine": machine_info(), "busy_at_end": busy(), "rounds": args.rounds,
           "seconds": {name: {"median": statistics.median(s), "min": min(s), "max": max(s), "runs": s}
                       for name, s in seconds.items()}}
    for name, s in out["seconds"].items():
        print(f"{name:50s} {s['median']:.2f} s [{s['min']:.2f}-{s['max']:.2f}]")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
