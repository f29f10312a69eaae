"""Where a round's outcome goes: the Prometheus metrics, the run log and the progress line.

One time account (:class:`~gaslocd.protocol.account.TimeAccount`, kept by the run log)
says where the wall-clock went, so the metrics, the progress line, ``gaslocd status``
and the JSON summary cannot disagree about it; "idle" is every second not training.
"""

from __future__ import annotations

from dataclasses import dataclass

from gaslocd.daemon.metrics import DaemonMetrics
from gaslocd.daemon.report import RunLog
from gaslocd.net.validation import WireStats
from gaslocd.protocol.account import TimeAccount
from gaslocd.protocol.plan import LinkEstimates, RoundSetup


@dataclass(frozen=True)
class RoundOutcome:
    """What one round did, as the driver hands it over."""

    setup: RoundSetup
    losses: list[float]
    val: float | None
    consensus: float | None
    account: TimeAccount  # the round's wall-clock by activity
    exchanged: int
    row: dict[str, float]  # this peer's row of W as applied (after failed exchanges)
    roster: tuple[str, ...]  # the sorted roster the row refers to
    exchange_s: float
    tokens: int
    clipped: int = 0  # partners robust mixing pulled in to the trust radius this round
    rescaled: int = 0  # partners within it whose norm gap alone was cut
    rollbacks: dict[str, int] | None = None  # the worker's thrown-away rounds so far, by reason
    mixed: RoundSetup | None = None  # the round the row mixed (overlap: the previous one)
    overlapped: bool = False  # then ``mixed`` None: nothing landed (the first round)
    long_landed: int = 0  # long exchanges (of earlier rounds) mixed this round
    landed_after: int | None = None  # overlap: this round's steps before that mix landed
    # The `roster` activity by part: read, pace, and when they happened resync, pause.
    roster_parts: dict[str, float] | None = None

    @property
    def mixed_setup(self) -> RoundSetup | None:
        return self.mixed if self.mixed is not None or self.overlapped else self.setup


class Telemetry:
    def __init__(self, metrics: DaemonMetrics, runlog: RunLog, stats: WireStats) -> None:
        self.metrics, self.runlog, self.stats = metrics, runlog, stats
        metrics.idle_total = lambda: runlog.account.idle_s()  # one account, read at scrape
        metrics.time_account = lambda: dict(runlog.account.seconds)
        runlog.roster_reads = lambda: metrics.roster_reads()  # set once membership exists

    def count_failure(self, reason: str) -> None:
        self.metrics.count_failure(reason)

    def finish_round(self, out: RoundOutcome, links: LinkEstimates, round_now: int) -> str:
        """Record the round everywhere; returns its progress line."""
        self.metrics.tokens += out.tokens
        self.metrics.clipped += out.clipped
        self.metrics.rescaled += out.rescaled
        if out.rollbacks is not None:
            self.metrics.rollbacks = dict(out.rollbacks)
        self.metrics.exchange_seconds.observe(out.exchange_s)
        line = self.runlog.add(out, self.stats)
        self._export(out, links, round_now)
        return line

    def _export(self, out: RoundOutcome, links: LinkEstimates, round_now: int) -> None:
        m, setup = self.metrics, out.setup
        m.rounds += 1
        m.round.set(round_now)
        m.inner_steps.set(setup.inner_steps)
        m.peers.set(setup.roster_size)
        m.partners.set(len(setup.partners))
        if out.losses:
            m.train_loss.set(sum(out.losses) / len(out.losses))
        if out.val is not None:
            m.val_loss.set(out.val)
        if out.consensus is not None:
            m.consensus.set(out.consensus)
        if links.step_time_s is not None:
            m.step_seconds.set(links.step_time_s)
        if links.bandwidth:
            m.bandwidth.set(links.own_bandwidth())
        m.idle_ratio.set(self.runlog.idle_fraction())
