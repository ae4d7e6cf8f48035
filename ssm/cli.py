"""The SSM commands of the `multispec` CLI: `bench ssm`."""

from __future__ import annotations

import argparse

from multispec.plugin import BenchOptions, add_speed_options, register_command

from . import bench


def _add_bench(p: argparse.ArgumentParser) -> None:
    add_speed_options(p, pair="stdlib-mamba2", temperature=1.0, tree="5/3/14")
    p.add_argument("--weights", default=None, metavar="DIR",
                   help="the pair's trained folder (`multispec zoo train NAME --out DIR`; default: the shipped one)")


def _bench(args: argparse.Namespace) -> int:
    bench.run(args.pair, BenchOptions.from_args(args))
    return 0


def register() -> None:
    register_command("bench", "ssm", "a zoo SSM/hybrid pair (STree)", _add_bench, _bench)
