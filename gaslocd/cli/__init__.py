"""The ``gaslocd`` command (also ``python -m gaslocd``).

Every setting is declared once in :mod:`gaslocd.cli.settings`; :mod:`gaslocd.cli.sources`
derives the flags, ``GASLOCD_*`` variables and ``--config`` keys from it and resolves
them as flag > environment > TOML file > default, here and only here: nothing below this
layer reads the environment. A wrong value exits with status 2 and one readable line,
before anything starts. ``--config`` and ``--log-level`` are accepted before and after
the command name (the later one wins).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gaslocd import __version__
from gaslocd.cli.daemons import JOIN_COMMAND, START_COMMAND, STATUS_COMMAND
from gaslocd.cli.demo import DEMO_COMMAND
from gaslocd.cli.export import EXPORT_COMMAND
from gaslocd.cli.settings import BY_NAME
from gaslocd.cli.simulate import SIMULATE_COMMAND
from gaslocd.cli.sources import Command, add_command, add_flag, parse_args
from gaslocd.cli.tokenize import TOKENIZE_COMMAND

__all__ = ["COMMANDS", "EXIT_USAGE", "build_parser", "main", "parse"]

EXIT_USAGE = 2

COMMANDS: tuple[Command, ...] = (
    START_COMMAND,
    JOIN_COMMAND,
    STATUS_COMMAND,
    DEMO_COMMAND,
    SIMULATE_COMMAND,
    EXPORT_COMMAND,
    TOKENIZE_COMMAND,
)
_BY_COMMAND = {c.name: c for c in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; every flag is absent unless typed (see ``sources``)."""
    parser = argparse.ArgumentParser(
        prog="gaslocd",
        description="Decentralized LLM pretraining with GASLoC: local steps, random gossip "
        "with one or two peers per round, an outer Nesterov optimizer.",
    )
    parser.add_argument("--version", action="version", version=f"gaslocd {__version__}")
    for name in ("config", "log_level"):
        add_flag(parser, BY_NAME[name], None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        add_command(sub, command)
    return parser


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The command and all its resolved settings (``env`` defaults to ``os.environ``).

    Raises ``ValueError`` for a wrong environment or config value; argparse itself exits
    2 for a wrong flag.
    """
    return parse_args(build_parser(), argv, os.environ if env is None else env)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process's exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        command, resolved = parse(args)
    except ValueError as exc:
        print(f"gaslocd: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=resolved["log_level"], format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(_BY_COMMAND[command].run(command, resolved))
    except (ValueError, FileNotFoundError) as exc:
        print(f"gaslocd: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gaslocd: interrupted", file=sys.stderr)
        return 130
