"""The machine-readable summary of a run (``--json FILE``): :class:`RunSummary`.

One type for a simulated run, a daemon and a demo, so that every run plots with the same
script: ``final_val_loss``, ``val_loss_curve`` ([{round, wall_clock_s, val_loss}]),
``consensus_curve`` ([{round, consensus}]), ``wall_clock_s``, ``bytes_sent_per_worker``,
``time`` (seconds by activity, the daemon's time account), ``idle_fraction`` and
``training_share`` derived from it, and ``args`` (everything needed to rerun it), plus
extras of each kind.

A simulated run also lists its ``rounds``: per round the sorted roster, the planned
``edges``, the ``mixing_matrix`` W actually applied (rows of the protocol's
``mixing_row`` after failed exchanges), planned ``inner_steps`` and ``filled_steps``
per worker, failures by reason, resyncs and the round's ``digest`` (what the replay
checks), so that its W can be compared with real daemons' on the same ``run_id``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from gaslocd.protocol.account import ACTIVITIES, TimeAccount
from gaslocd.sim.runner import RoundRecord, SimResult

SCHEMA_VERSION = 1


def plain_json(value: Any) -> Any:
    """Dataclasses, tuples and non-finite floats made JSON-safe (NaN/inf become null)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: plain_json(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null says "not measured"
    return value


def round_entry(r: RoundRecord) -> dict[str, Any]:
    """One round of ``rounds``: its pairing, W, steps and failures (daemon's round numbering:
    round r was planned as ``plan_round(topology, roster, r - 1, run_id)``)."""
    return {
        "round": r.round,
        "wall_clock_s": r.wall_clock_s,
        "roster": list(r.roster),
        "edges": [list(e) for e in r.edges],
        "mixing_matrix": [list(row) for row in r.mixing_matrix],
        "inner_steps": list(r.inner_steps),
        "filled_steps": list(r.filled_steps),
        "exchange_failures": r.exchange_failures,
        "failure_reasons": dict(r.failure_reasons),
        "resyncs": [list(p) for p in r.resyncs],
        "digest": r.digest,
    }


@dataclass
class RunSummary:
    """A run's ``--json`` summary, one type for ``simulate``, a daemon and ``demo``.

    Every kind fills the common fields, so a plotting script or a bench reads any of them
    the same way; what only one kind has goes into ``extra`` and is written at the top
    level beside the common keys. Curves are lists of small dicts (``round`` plus values).
    """

    kind: str  # "simulate", "daemon" or "demo"
    wall_clock_kind: str  # "simulated" or "real"
    final_val_loss: float | None
    val_loss_curve: list[dict[str, Any]]  # {round, wall_clock_s, val_loss[, unix_time]}
    consensus_curve: list[dict[str, Any]]  # {round, consensus}
    train_loss_curve: list[dict[str, Any]]  # {round, train_loss}
    wall_clock_s: float
    bytes_sent_per_worker: list[float]
    time: dict[str, float]  # seconds by activity (TimeAccount), all workers together
    args: dict[str, Any]
    run_id: str = ""
    rounds: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def account(self) -> TimeAccount:
        account = TimeAccount()
        account.add_all({k: v for k, v in self.time.items() if k in ACTIVITIES})
        return account

    @property
    def idle_fraction(self) -> float:
        """Share of the accounted time not spent training (docs/design.md §4)."""
        account = self.account
        return account.idle_s() / account.total() if account.total() > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        body = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        body["idle_fraction"] = self.idle_fraction
        body["idle_s"] = self.account.idle_s()
        body["training_share"] = self.account.training_share()
        return dict(plain_json({**body, **self.extra}))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RunSummary:
        """Read a summary back (``demo`` reads its daemons'); ``ValueError`` if it is not one."""
        if obj.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"not a version {SCHEMA_VERSION} run summary")
        names = {f.name for f in fields(cls)} - {"extra"}
        derived = {"idle_fraction", "idle_s", "training_share"}
        try:
            return cls(
                **{k: v for k, v in obj.items() if k in names},
                extra={k: v for k, v in obj.items() if k not in names | derived},
            )
        except TypeError as exc:
            raise ValueError(f"incomplete run summary: {exc}") from None


def simulation_summary(result: SimResult, args: dict[str, Any]) -> dict[str, Any]:
    """The summary of a simulated run, as written by ``gaslocd simulate --json``."""
    val_curve = [{"round": 0, "wall_clock_s": 0.0, "val_loss": result.initial_val_loss}]
    val_curve += [
        {"round": r.round, "wall_clock_s": r.val_at_s or r.wall_clock_s, "val_loss": r.val_loss}
        for r in result.records
        if r.val_loss is not None
    ]
    return RunSummary(
        kind="simulate",
        wall_clock_kind="simulated",
        run_id=result.run_id,
        final_val_loss=result.final_val_loss,
        val_loss_curve=val_curve,
        consensus_curve=[{"round": r.round, "consensus": r.consensus} for r in result.records],
        train_loss_curve=[{"round": r.round, "train_loss": r.train_loss} for r in result.records],
        wall_clock_s=result.wall_clock_s,
        bytes_sent_per_worker=result.bytes_sent_per_worker,
        time=result.time,
        rounds=[round_entry(r) for r in result.records],
        args=args,
        extra={
            "inner_steps_curve": [
                {"round": r.round, "inner_steps": list(r.inner_steps)} for r in result.records
            ],
            "idle_fraction_per_worker": result.idle_fraction_per_worker,
            "pace_fraction": result.pace_fraction,
            "compute_fraction_per_worker": result.compute_fraction_per_worker,
            "filled_steps": sum(sum(r.filled_steps) for r in result.records),
            "resyncs": sum(len(r.resyncs) for r in result.records),
            "pace_timeouts": result.pace_timeouts,
            "exchange_failures": sum(r.exchange_failures for r in result.records),
            "step_time_s": result.step_time_s,
            "message_bytes": result.message_bytes,
            "tokens_per_worker": result.tokens_per_worker,
            "real_elapsed_s": result.real_elapsed_s,
        },
    ).to_json()


def write_json(path: Path, summary: dict[str, Any]) -> None:
    """Write atomically, so a reader (a plotting script, a test) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(summary, fh, indent=1, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
