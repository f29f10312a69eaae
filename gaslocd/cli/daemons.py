"""``gaslocd start``, ``join`` and ``status``: a real daemon, and asking one how it does."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from gaslocd.cli.configs import (
    algo_config,
    daemon_config,
    refuse_open_port,
    train_config,
    wire_config,
)
from gaslocd.cli.settings import JOIN, START, STATUS
from gaslocd.cli.sources import Command


def _exit_on_signal(status: int) -> None:
    """Outside :meth:`Daemon.run` (which installs its own), a signal ends the process now.

    Before the run nothing is trained yet; after it the checkpoint is written or abandoned
    already, so there is nothing left to save, and the default action would exit -15."""

    def leave(_signum: int, _frame: object) -> None:
        sys.stdout.flush()
        os._exit(status)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)


def run_daemon(command: str, resolved: dict[str, Any]) -> int:
    """Build every config first, so a wrong setting exits 2 before torch is even imported."""
    refuse_open_port(resolved)
    configs = (
        daemon_config(resolved),
        algo_config(resolved),
        train_config(resolved),
        wire_config(resolved),
    )
    import torch

    # Imported here: the daemon pulls in grpc and hivemind, which --help and simulate
    # never need.
    from gaslocd.daemon.lifecycle import EXIT_OK, EXIT_STARTUP, Daemon, StartupError

    _exit_on_signal(EXIT_OK)

    torch.set_num_threads(resolved["threads"])
    from gaslocd.train.device import resolve_device, resolve_precision

    # A device or precision this machine lacks is a wrong setting: one line, exit 2.
    resolve_precision(configs[2].precision, resolve_device(configs[2].device))
    from gaslocd.daemon.host import serve_own

    daemon = Daemon(*configs, role=command, progress=lambda line: print(line, flush=True))
    try:  # the own inner loop through the library API's handshake, the daemon on main
        return serve_own(daemon)
    except StartupError as exc:
        print(f"gaslocd: cannot start: {exc}", file=sys.stderr, flush=True)
        return EXIT_STARTUP


def run_status(command: str, resolved: dict[str, Any]) -> int:
    """Query a daemon's Status with the same token and TLS settings as the daemons'."""
    from gaslocd.daemon.status import query_status

    return query_status(
        resolved["status_address"],
        run_id=resolved["run_id"],
        wire=wire_config(resolved),
        timeout_s=resolved["status_timeout"],
        as_json=resolved["status_json"],
    )


START_COMMAND = Command(
    START,
    help="start the first daemon of a run and print its bootstrap address",
    description="Start a new run: this daemon trains and prints the address that other "
    "machines pass to 'gaslocd join --bootstrap'.",
    run=run_daemon,
)
JOIN_COMMAND = Command(
    JOIN,
    help="join a run through any live peer's bootstrap address",
    description="Join a run: fetch the current state from a live peer and train with it.",
    run=run_daemon,
)
STATUS_COMMAND = Command(
    STATUS,
    help="ask a running daemon how it is doing",
    description="Query a daemon's Status over gRPC and print it.",
    run=run_status,
)
