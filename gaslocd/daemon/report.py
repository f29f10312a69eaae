"""A daemon's own record of its run: the progress line per round and the JSON summary.

The summary uses the simulator's schema (:mod:`gaslocd.sim.summary`) with real
wall-clock, so that ``gaslocd demo --json`` and ``gaslocd simulate --json`` plot alike.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gaslocd.net.validation import WireStats
from gaslocd.protocol.account import TimeAccount
from gaslocd.sim.summary import RunSummary, write_json

if TYPE_CHECKING:  # telemetry imports this module
    from gaslocd.daemon.telemetry import RoundOutcome


@dataclass
class RunLog:
    peer_id: str
    started_at: float = field(default_factory=time.time)
    _began: float = field(default_factory=time.monotonic)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    account: TimeAccount = field(default_factory=TimeAccount)  # since the first round
    last_inner_steps: int = 0
    last_train_loss: float | None = None
    last_val_loss: float | None = None
    last_roster_size: int = 0
    # Where each round's roster came from (RosterPrefetch.counts): a sitter's full reads
    # cost bytes on its slow link, so the summary says how many it made.
    roster_reads: Callable[[], Mapping[str, int]] = dict

    def start_clock(self) -> None:
        self._began = time.monotonic()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._began

    def idle_fraction(self) -> float:
        """Share of the accounted wall-clock not spent training."""
        total = self.account.total()
        return self.account.idle_s() / total if total > 0 else 0.0

    def add(self, out: RoundOutcome, stats: WireStats) -> str:
        """Record a finished round; returns its progress line."""
        setup, losses, acct, mixed = out.setup, out.losses, out.account, out.mixed_setup
        self.account.merge(acct)
        round_s = acct.total()
        train = statistics.fmean(losses) if losses else math.nan
        self.last_inner_steps, self.last_roster_size = len(losses), setup.roster_size
        self.last_train_loss = train
        if out.val is not None:
            self.last_val_loss = out.val
        self.rounds.append(
            {
                "round": setup.round + 1,
                "wall_clock_s": self.elapsed_s(),
                "unix_time": time.time(),
                "inner_steps": len(losses),
                "planned_inner_steps": setup.inner_steps,
                "train_loss": train,
                "val_loss": out.val,
                "consensus": out.consensus,
                "round_s": round_s,
                "time": dict(acct.seconds),  # by activity; sums to round_s
                "roster_parts": dict(out.roster_parts or {}),  # time["roster"] by part
                "training_share": acct.training_share(),
                "idle_s": acct.idle_s(),  # not training
                "compute_s": acct.training_s(),  # the inner steps, filling the wait included
                "exchange_s": out.exchange_s,  # exchange or all-reduce, waiting included
                "mixed_round": None if mixed is None else mixed.round + 1,  # overlap: earlier
                "partners": len(mixed.partners) if mixed is not None else 0,
                "exchanged": out.exchanged,
                "roster": list(out.roster),  # sorted: what the pairing was drawn from
                "mixing_row": dict(out.row),  # this peer's row of W as applied
                "long_landed": out.long_landed,  # long exchanges of earlier rounds mixed
                "landed_after_steps": out.landed_after,  # overlap: when the mix landed
                "bytes_sent": stats.bytes_sent,
            }
        )
        tok_s = out.tokens / round_s if round_s > 0 else 0.0
        val_text = f"{out.val:.4f}" if out.val is not None else "   -  "
        cons = f"{out.consensus:.2e}" if out.consensus is not None else "    -   "
        return (
            f"round {setup.round + 1:5d}  H {len(losses):4d}  loss {train:.4f}  "
            f"val {val_text}  tok/s {tok_s / 1000:6.1f}k  consensus {cons}  "
            f"idle {100 * self.idle_fraction():5.1f}%  "
            f"training {100 * acct.training_share():3.0f}%  peers {setup.roster_size}  "
            f"exchanged {out.exchanged}/{len(mixed.partners) if mixed is not None else 0}"
            + (f"  long +{out.long_landed}" if out.long_landed else "")
        )

    def closing_line(self, stats: WireStats) -> str:
        vals = [r["val_loss"] for r in self.rounds if r["val_loss"] is not None]
        final = f"{vals[-1]:.4f}" if vals else "-"
        failures = sum(stats.failures.values())
        return (
            f"stopped after {len(self.rounds)} rounds in {self.elapsed_s():.1f}s: "
            f"val loss {final}, "
            f"idle {100 * self.idle_fraction():.1f}%, sent {stats.bytes_sent / 2**20:.1f} MiB, "
            f"received {stats.bytes_received / 2**20:.1f} MiB, exchange failures {failures}, "
            f"refused messages {sum(stats.rejected.values())}"
        )

    def summary(self, args: dict[str, Any], stats: WireStats) -> RunSummary:
        vals = [r for r in self.rounds if r["val_loss"] is not None]
        return RunSummary(
            kind="daemon",
            wall_clock_kind="real",
            final_val_loss=vals[-1]["val_loss"] if vals else None,
            val_loss_curve=[
                {
                    "round": r["round"],
                    "wall_clock_s": r["wall_clock_s"],
                    "unix_time": r["unix_time"],
                    "val_loss": r["val_loss"],
                }
                for r in vals
            ],
            consensus_curve=[
                {"round": r["round"], "consensus": r["consensus"]}
                for r in self.rounds
                if r["consensus"] is not None
            ],
            train_loss_curve=[
                {"round": r["round"], "train_loss": r["train_loss"]} for r in self.rounds
            ],
            # Until the last round's end: the span the time account covers (the shutdown
            # after it is not a round).
            wall_clock_s=self.rounds[-1]["wall_clock_s"] if self.rounds else 0.0,
            bytes_sent_per_worker=[stats.bytes_sent],
            time=dict(self.account.seconds),
            run_id=str(args.get("daemon", {}).get("run_id", "")),
            rounds=self.rounds,
            args=args,
            extra={
                "peer_id": self.peer_id,
                "started_at": self.started_at,
                "bytes_received": stats.bytes_received,
                "wire": stats.snapshot(),
                "roster_reads": dict(self.roster_reads()),
            },
        )

    def write_summary(self, path: Path, args: dict[str, Any], stats: WireStats) -> None:
        write_json(path, self.summary(args, stats).to_json())
