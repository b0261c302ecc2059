"""The ``rlpipe`` command: one subcommand per module, each importing its heavy parts only when run.

A command module exposes ``register(subparsers)`` (which sets ``command_module``) and
``run(args) -> int``, so ``rlpipe inspect`` starts without importing torch or Flask.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence

from pipeline.errors import RlpipeError, RlpipeWarning

COMMAND_MODULES = (
    "server.command",
    "pipeline.trainers.command",
    "pipeline.importers.command",
    "pipeline.exporters.command",
    "pipeline.commands.inspection",
    "pipeline.commands.replay",
    "pipeline.commands.compaction",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlpipe",
        description="Experience from simulators into reinforcement-learning training, via Parquet.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and name.startswith(error.name):
                continue  # that command is not part of this build
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; user errors print one line to stderr and exit 2, never a traceback."""
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args.command_module)
    original = warnings.formatwarning
    warnings.formatwarning = functools.partial(_format_warning, args.command, original)
    try:
        code: int = module.run(args)
    except RlpipeError as error:
        print(f"rlpipe {args.command}: {error}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = original
    return code


def _format_warning(
    command: str,
    original: Callable[..., str],
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
) -> str:
    """Our own warnings as one line, like our errors; others (from libraries) as Python has them."""
    if issubclass(category, RlpipeWarning):
        return f"rlpipe {command}: warning: {message}\n"
    return original(message, category, filename, lineno, line)


if __name__ == "__main__":
    sys.exit(main())
