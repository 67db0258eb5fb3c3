"""The ``ferrolm`` command."""

from __future__ import annotations

import argparse
import sys

from ferrolm.bench import engine as bench_engine
from ferrolm.bench import tree as bench_tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferrolm", description="ferrolm: an LLM serving runtime whose hot paths run in Rust")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    bench_tree.add_parser(bench_sub)
    bench_engine.add_parser(bench_sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
