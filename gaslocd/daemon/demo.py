"""``gaslocd demo``: N real daemons on 127.0.0.1, their progress relayed, one summary.

Each daemon is its own process with its own DHT node and gRPC server, exactly as a
volunteer would run it: the first is ``gaslocd start``, the others ``gaslocd join
--bootstrap`` with the first one's address. All wait for each other (``--min-peers N``)
so the run starts with everyone at round 0 and every daemon runs ``--max-rounds R``.
"""

from __future__ import annotations

import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from gaslocd.protocol.account import ACTIVITIES
from gaslocd.sim.summary import RunSummary, write_json

STARTUP_TIMEOUT_S = 180.0
STOP_GRACE_S = 30.0


def _relay(prefix: str, stream: IO[str]) -> None:
    for line in stream:
        text = line.rstrip("\n")
        print(f"{prefix} {text}", flush=True)


@dataclass(frozen=True)
class DemoDaemon:
    """What the demo decides for one of its daemons: role, run, files, bootstrap.

    The demo lays out the run; turning that into a command line belongs to the CLI's
    settings table (this layer cannot see it), which the caller's callback applies.
    """

    index: int
    role: str  # "start" for the first daemon, "join" for the others
    run_id: str
    workers: int
    rounds: int
    checkpoint_dir: Path
    summary_json: Path
    address_file: Path | None  # the first daemon writes its bootstrap address here
    bootstrap: str | None  # the others join through it


DaemonArgs = Callable[[DemoDaemon], list[str]]


def _child_env() -> dict[str, str]:
    """The daemons' environment, without any ``GASLOCD_*`` variable.

    Their arguments say everything: a ``GASLOCD_HOST`` or ``GASLOCD_CONFIG`` meant for a
    real daemon in this shell must not change the demo's daemons behind their argv.
    """
    env = {k: val for k, val in os.environ.items() if not k.startswith("GASLOCD_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "33554432")
    env.setdefault("MALLOC_TRIM_THRESHOLD_", "1073741824")
    return env


def _slot(index: int, workdir: Path, run_id: str, workers: int, rounds: int) -> DemoDaemon:
    return DemoDaemon(
        index=index,
        role="start" if index == 0 else "join",
        run_id=run_id,
        workers=workers,
        rounds=rounds,
        checkpoint_dir=workdir / f"w{index}",
        summary_json=workdir / f"w{index}.json",
        address_file=workdir / "bootstrap.txt" if index == 0 else None,
        bootstrap=None,
    )


def _wait_for_file(path: Path, proc: subprocess.Popen[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().split()[0]
        if proc.poll() is not None:
            raise RuntimeError(
                f"the first daemon exited with status {proc.returncode} before it was ready"
            )
        time.sleep(0.1)  # polling a file another process writes, bounded by the deadline
    raise RuntimeError(f"the first daemon did not write its address within {timeout_s:g} s")


def _stop(procs: Sequence[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Fleet:
    """The demo's daemon processes, each with a thread relaying its lines."""

    def __init__(self, daemon_args: DaemonArgs) -> None:
        self.daemon_args = daemon_args
        self.env = _child_env()
        self.procs: list[subprocess.Popen[str]] = []
        self.relays: list[threading.Thread] = []
        self.argvs: list[list[str]] = []

    def spawn(self, slot: DemoDaemon) -> subprocess.Popen[str]:
        """Start one daemon with the arguments the caller made for ``slot``."""
        argv = self.daemon_args(slot)
        self.argvs.append(argv)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gaslocd", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        relay = threading.Thread(target=_relay, args=(f"[w{slot.index}]", proc.stdout), daemon=True)
        relay.start()
        self.relays.append(relay)
        return proc

    def run(self, workdir: Path, run_id: str, workers: int, rounds: int) -> list[int]:
        """Start the first daemon, the others through its address; their exit codes."""
        first_slot = _slot(0, workdir, run_id, workers, rounds)
        first = self.spawn(first_slot)
        assert first_slot.address_file is not None
        address = _wait_for_file(first_slot.address_file, first, STARTUP_TIMEOUT_S)
        for k in range(1, workers):
            self.spawn(replace(_slot(k, workdir, run_id, workers, rounds), bootstrap=address))
        return [proc.wait() for proc in self.procs]

    def join_relays(self) -> None:
        """Let the relays print the last lines (bounded: a stuck pipe must not hang us)."""
        for relay in self.relays:
            relay.join(timeout=5)


def run_demo(
    workers: int,
    rounds: int,
    daemon_args: DaemonArgs,
    *,
    json_path: Path | None = None,
    workdir: Path | None = None,
    args: dict[str, Any] | None = None,
) -> int:
    """Run the demo; returns 0 when every daemon finished its rounds.

    ``daemon_args`` turns each :class:`DemoDaemon` into the arguments after ``python -m
    gaslocd``; ``args`` (the demo's own settings) is recorded in the JSON summary with
    every daemon's arguments, so the run can be repeated.
    """
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gaslocd-demo-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = f"demo-{secrets.token_hex(3)}"
    print(f"demo: {workers} daemons, {rounds} rounds, run {run_id}, files in {workdir}", flush=True)
    fleet = _Fleet(daemon_args)
    began = time.time()
    try:
        codes = fleet.run(workdir, run_id, workers, rounds)
    except (KeyboardInterrupt, RuntimeError) as exc:
        print(f"demo: stopping ({exc or 'interrupted'})", flush=True)
        _stop(fleet.procs)
        return 1
    finally:
        fleet.join_relays()
    summaries = [_read(workdir / f"w{k}.json") for k in range(workers)]
    recorded = {"workers": workers, "rounds": rounds, **(args or {}), "daemons": fleet.argvs}
    summary = aggregate(summaries, began, recorded, run_id)
    ok = all(code == 0 for code in codes) and all(s is not None for s in summaries)
    final = summary.final_val_loss
    print(
        f"demo: {'done' if ok else 'FAILED'} in {time.time() - began:.1f}s; exit codes {codes}; "
        f"mean final val loss {final if final is None else round(final, 4)}, "
        f"idle {100 * summary.idle_fraction:.1f}%",
        flush=True,
    )
    if json_path is not None:
        write_json(json_path, summary.to_json())
        print(f"summary written to {json_path}", flush=True)
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


def _read(path: Path) -> RunSummary | None:
    """A daemon's summary, or None when it wrote none (it failed) or not a whole one."""
    import json

    try:
        return RunSummary.from_json(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def aggregate(
    summaries: Sequence[RunSummary | None], began: float, args: dict[str, Any], run_id: str = ""
) -> RunSummary:
    """Per-daemon summaries → one: curves averaged over daemons per round, wall-clock from
    the demo's start, bytes per daemon, the time accounts added up."""
    runs = [s for s in summaries if s is not None]
    val_by_round: dict[int, list[tuple[float, float]]] = {}
    cons_by_round: dict[int, list[float]] = {}
    for s in runs:
        for point in s.val_loss_curve:
            if point.get("val_loss") is not None:
                val_by_round.setdefault(point["round"], []).append(
                    (point["unix_time"] - began, point["val_loss"])
                )
        for point in s.consensus_curve:
            cons_by_round.setdefault(point["round"], []).append(point["consensus"])
    # Rounds every daemon evaluated (one that caught up may have skipped a round number).
    complete = sorted(r for r, pts in val_by_round.items() if len(pts) == len(runs))
    val_curve = [
        {
            "round": r,
            "wall_clock_s": max(t for t, _ in val_by_round[r]),
            "val_loss": statistics.fmean(v for _, v in val_by_round[r]),
        }
        for r in complete
    ]
    finals = [s.final_val_loss for s in runs if s.final_val_loss is not None]
    time_total = {a: sum(s.time.get(a, 0.0) for s in runs) for a in ACTIVITIES}
    return RunSummary(
        kind="demo",
        wall_clock_kind="real",
        run_id=run_id,
        final_val_loss=statistics.fmean(finals) if finals else None,
        val_loss_curve=val_curve,
        consensus_curve=[
            {"round": r, "consensus": statistics.fmean(v)} for r, v in sorted(cons_by_round.items())
        ],
        train_loss_curve=[],
        wall_clock_s=max((p["wall_clock_s"] for p in val_curve), default=0.0),
        bytes_sent_per_worker=[s.bytes_sent_per_worker[0] for s in runs],
        time=time_total,
        args=args,
        extra={
            "final_val_loss_per_worker": finals,
            "idle_fraction_per_worker": [s.idle_fraction for s in runs],
            "workers_reporting": len(runs),
        },
    )
