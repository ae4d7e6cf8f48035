"""What machine and software a benchmark ran on: stored with every results JSON (ratios differ between
machines, so a figure without its machine is not comparable)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

from ..heap import heap_state


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git_commit() -> str | None:
    return _git("rev-parse", "--short", "HEAD") or None


def _git_dirty() -> bool | None:
    """Whether the checkout had uncommitted changes to tracked files (None outside a git checkout)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def machine_info() -> dict:
    import transformers

    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "cpu": _cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "git_commit": _git_commit(), "git_dirty": _git_dirty(), "MULTISPEC_FAST_HEAD": os.environ.get("MULTISPEC_FAST_HEAD", "0"),
            "heap": heap_state()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def busy() -> str | None:
    """A sentence when the machine is busy (the 1-minute load average above its logical CPUs): ratios timed now
    mean little. None when it is not, or the platform does not say."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = os.cpu_count() or 1
    if load <= cpus:
        return None
    return (f"this machine is busy (load average {load:.1f} on {cpus} CPUs): timings taken now are slow and noisy, "
            f"and ratios between them mean little")


def describe(info: dict) -> str:
    return (f"{info['cpu']}, {info['torch_threads']} threads of {info['logical_cpus']} CPUs, torch {info['torch']}, "
            f"{info['date_utc']} UTC, commit {info['git_commit']}")


def save_results(results: dict, json_path: str | None) -> dict:
    """Write a benchmark's results JSON to `json_path` (when given); returns the results."""
    if json_path:
        import json

        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
    return results
