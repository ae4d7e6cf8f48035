"""The `multispec` command line."""

from __future__ import annotations

import argparse
import sys


def _bench(args: argparse.Namespace) -> int:
    if args.suite == "core":
        from .bench.core import run
        run(quick=args.quick, max_new_tokens=args.max_new_tokens, json_path=args.json, threads=args.threads)
        return 0
    print(f"multispec bench: unknown suite {args.suite!r}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="multispec", description="Speculative generation beyond plain text.")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="speed benchmarks against plain decoding and transformers")
    bench.add_argument("suite", choices=["core"], help="which benchmark to run")
    bench.add_argument("--quick", action="store_true", help="a smaller run (about a minute on 2 CPU cores)")
    bench.add_argument("--max-new-tokens", type=int, default=None)
    bench.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    bench.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    bench.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
