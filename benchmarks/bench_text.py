"""Text speed benchmark on a zoo pair: plain greedy, transformers prompt lookup, our n-gram, EAGLE chain
and dynamic tree, hybrid; sampling at temperature 0.8; outputs checked against plain greedy.

    python benchmarks/bench_text.py [--pair gemma3-270m-eagle|stdlib-bytes] [--quick] [--json out.json]
"""

from multispec.cli import main

if __name__ == "__main__":
    import sys

    raise SystemExit(main(["bench", "text", *sys.argv[1:]]))
