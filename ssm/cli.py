"""The SSM commands of the `multispec` CLI: `bench ssm`."""

from __future__ import annotations

import argparse

from multispec.cli import add_speed_options, register_command

from . import bench


def _add_bench(p: argparse.ArgumentParser) -> None:
    add_speed_options(p, pair="stdlib-mamba2", temperature=1.0, tree="5/3/14")
    p.add_argument("--weights", default=None, metavar="DIR",
                   help="the pair's trained folder (`multispec zoo train NAME --out DIR`; default: the shipped one)")


def _bench(args: argparse.Namespace) -> int:
    bench.run(pair_name=args.pair, quick=args.quick, json_path=args.json, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, threads=args.threads, chain_k=args.chain_k, tree=args.tree,
        rounds=args.rounds, weights=args.weights)
    return 0


def register() -> None:
    register_command("bench", "ssm", "a zoo SSM/hybrid pair (STree)", _add_bench, _bench)
