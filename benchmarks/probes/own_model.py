"""README's own-model path, run as a user runs it: its three commands, timed one by one, in a fresh folder.

    python benchmarks/probes/own_model.py [--json benchmarks/results/own_model_three_commands.json]

Runs `multispec zoo export stdlib-bytes-large my_pair`, `multispec train draft ... --steps 400 --lr 1e-3` on the
`email` package's source and `multispec generate ... --compare` exactly as README.md writes them (read from
README.md, so the two cannot part), and stores each command's wall time, the training report and the comparison
with the machine. Results: docs/benchmarks/text.md ("Your own model, in three commands").
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

from multispec.bench.machine import machine_info

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The three commands of README's own-model block."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"Your own model, in three commands.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("multispec ")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    commands = readme_commands()
    if len(commands) != 3:
        raise SystemExit(f"README.md's own-model block holds {len(commands)} commands, not 3")
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for command in commands:
            if command.startswith("multispec generate"):
                command += f" --json {folder}/generate.json"
            t0 = time.perf_counter()
            subprocess.run(["bash", "-c", command], cwd=folder, check=True, stdout=subprocess.DEVNULL)
            runs.append({"command": command.replace(f"{folder}/", ""), "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{runs[-1]['seconds']:7.1f} s  {command[:100]}")
        report = json.loads(Path(folder, "my_head", "report.json").read_text())
        generated = json.loads(Path(folder, "generate.json").read_text())["records"][0]
    out = {"machine": machine_info(), "commands": runs, "total_seconds": round(sum(r["seconds"] for r in runs), 1),
           "train": {k: report.get(k) for k in ("steps", "sequences", "sequences_available", "final_acc",
                                                 "untrained_accepted_length", "accepted_length", "seconds")},
           "generate": {k: generated.get(k) for k in ("new_tokens", "mean_accepted_length", "speedup", "speedup_spread",
                                                      "rounds", "identical_to_plain", "noisy")}}
    print(json.dumps(out["train"] | out["generate"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
