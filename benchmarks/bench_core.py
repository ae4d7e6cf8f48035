"""Core speed benchmark: plain decoding vs our chain/tree speculation vs transformers' assisted generation.

    python benchmarks/bench_core.py [--quick] [--json out.json]
"""

from multispec.cli import main

if __name__ == "__main__":
    import sys

    raise SystemExit(main(["bench", "core", *sys.argv[1:]]))
