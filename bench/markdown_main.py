"""The entry a markdown-printing bench shares: parse its arguments, run it, print the report and write it to --out."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable


def run_markdown_bench(
    parse_args: Callable[[list[str]], argparse.Namespace],
    run_benchmark: Callable[[argparse.Namespace, list[str]], str],
    argv: list[str] | None,
) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    markdown = run_benchmark(args, argv)
    sys.stdout.write(markdown + "\n")
    if args.out is not None:
        args.out.write_text(markdown + "\n")
    return 0
