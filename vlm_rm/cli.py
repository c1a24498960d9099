"""`vlm-rm` command line: one subcommand per entry point, each a `main(argv)` callable from tests.

Usage and configuration errors are one line on stderr and exit status 2 (as in the `mmreward` CLI).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from mmreward.cli import OneLineArgumentParser, run_main
from mmreward.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="vlm-rm", description="VLM rewards for RL, reward-model benchmarks and MLLM RL adapters")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    from vlm_rm.bench.cli import add_parser as add_bench

    add_bench(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()

    def dispatch(args: argparse.Namespace) -> int:
        if args.version:
            from vlm_rm import __version__

            print(__version__)
            return 0
        if args.command is None:
            raise ConfigError("no command given; choose one of: bench (see vlm-rm --help)")
        from vlm_rm.bench.cli import run

        return run(args)

    return run_main(parser, argv, dispatch, "vlm-rm")
