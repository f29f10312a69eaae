"""``gaslocd demo``: N real daemons on 127.0.0.1, their arguments made from the table.

The demo's daemons are ordinary ``gaslocd start``/``join`` processes. Their arguments
are not written by hand: every setting the demo shares with the daemons (the table says
which) is passed on as the user resolved it, the demo fixes what makes it a demo (free
ports, everyone waiting for everyone, a round limit, files in its work directory), and
:func:`gaslocd.cli.sources.to_argv` writes the result as flags. A setting added to the
table for ``demo`` and the daemons therefore reaches them with no change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gaslocd.cli.configs import algo_config, train_config
from gaslocd.cli.settings import DEMO, settings_of
from gaslocd.cli.sources import Command, to_argv
from gaslocd.cli.values import json_args

if TYPE_CHECKING:
    from gaslocd.daemon.demo import DemoDaemon

# The demo's own settings that its daemons also have under the same name, with another
# meaning there: the demo's summary and log level, and its config file (already applied).
_DEMO_ONLY = frozenset({"config", "log_level", "json"})


def daemon_settings(demo: Mapping[str, Any], slot: DemoDaemon) -> dict[str, Any]:
    """The resolved settings of one of the demo's daemons."""
    role = slot.role
    resolved = {s.name: s.default_for(role) for s in settings_of(role)}
    resolved.update({k: x for k, x in demo.items() if k in resolved and k not in _DEMO_ONLY})
    resolved.update(
        run_id=slot.run_id,
        port=0,
        min_peers=slot.workers,
        max_rounds=slot.rounds,
        eval_every=1,
        checkpoint_dir=str(slot.checkpoint_dir),
        json=str(slot.summary_json),
        log_level=demo["daemon_log_level"],
        metrics_port=0 if demo["metrics"] else None,
    )
    if slot.address_file is not None:
        resolved["address_file"] = str(slot.address_file)
    if slot.bootstrap is not None:
        resolved["bootstrap"] = (slot.bootstrap,)
    return resolved


def daemon_argv(demo: Mapping[str, Any], slot: DemoDaemon) -> list[str]:
    """The arguments after ``python -m gaslocd`` for one of the demo's daemons."""
    return to_argv(slot.role, daemon_settings(demo, slot))


def run_demo_command(command: str, resolved: dict[str, Any]) -> int:
    """Check the shared settings here, so a wrong one is one line, not N failing daemons."""
    algo_config(resolved)
    train_config(resolved)
    from gaslocd.daemon.demo import run_demo

    json_path = resolved["json"]
    return run_demo(
        resolved["workers"],
        resolved["rounds"],
        partial(daemon_argv, resolved),
        json_path=None if json_path is None else Path(json_path),
        workdir=resolved["workdir"],
        args=json_args(resolved),
    )


DEMO_COMMAND = Command(
    DEMO,
    help="N real daemons on 127.0.0.1 train the tiny model together",
    description="Start N real daemons (processes with a real DHT and real gRPC) on 127.0.0.1 "
    "training on a corpus every machine has; relay their progress and summarize.",
    run=run_demo_command,
)
