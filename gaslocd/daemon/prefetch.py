"""The next round's roster, read while this round's steps still run.

Every round starts from a DHT read of the roster, and hivemind's ``get(latest=True)``
asks every node of its beam and waits for the slowest answer. A peer whose uplink is
full with a long exchange answers late (its DHT replies queue behind θ̃'s bytes), so
every other peer's round waited for it: 24–29% of the fast hosts' wall-clock with a
straggler at 3× the round time (bench/results/network_stragglers.md, 2026-12-03).
Starting the read so that it ends about when the round's planned steps end hides it
behind compute, whoever is slow to answer.

A prefetched roster is used only when its read ended at most ``max_age_s`` before the
round starts (one heartbeat: records are refreshed that often, so the roster is then as
current as one read at the round start would be, give or take a heartbeat). While the
round has not started, the read is repeated before the last one gets that old (a fill
or a late partner can make a round outlast a heartbeat), one read at a time. The rules
built on the roster tolerate that age by design: newcomers and sit-outs are announced
rounds ahead (``active_from``, a sit-out schedule), a peer's round seen a little old makes
pacing re-read, and peers start their rounds at different times anyway.

When the prefetch is not fresh at the round start (its read still in flight, not begun,
too old, failed), the round takes a *quick* read: our own DHT node's copy merged with
the last full read's (:mod:`gaslocd.net.roster_read`), with no wait for other nodes.
Before: a read in flight was waited for however long it had run, and with a 10×
straggler's node slow to answer that was 14–23% of the fast hosts' wall-clock. Before
any full read has finished (the first round) there is nothing to merge with: the round
waits for a full read as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gaslocd.net.tasks import cancelled
from gaslocd.protocol.records import PeerRecord

log = logging.getLogger(__name__)
ROSTER_SOURCES = ("prefetched", "quick", "at_round_start", "stale", "failed")
Records = list[PeerRecord]
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]

READ_MARGIN = 2.0  # start the read this many (smoothed) read times before the steps end
READ_SLACK_S = 0.05  # and this much earlier still, for the scheduling's own jitter
MIN_AGE_S = 1.0  # the tightest age bound: below it, refreshes would read back to back
SMOOTHING = 0.3  # weight of the newest read time in the running estimate


def refresh_after(max_age_s: float, read_s: float) -> float:
    """How long after a read ends to start the next, so that a read younger than
    ``max_age_s`` is at hand whenever the round starts (never back to back)."""
    return max(max_age_s / 2, max_age_s - READ_MARGIN * read_s - READ_SLACK_S)


def read_delay(steps_s: float, read_s: float) -> float:
    """How long after the steps begin to start a read of ``read_s`` so that it ends with
    them, with room for a read slower than usual."""
    return max(0.0, steps_s - READ_MARGIN * read_s - READ_SLACK_S)


class RosterPrefetch:
    """One prefetched roster read at a time; :meth:`get` hands out a fresh roster."""

    def __init__(
        self,
        read: Callable[[], Awaitable[Records]],
        clock: Callable[[], float],
        max_age_s: float,
        spawn: Spawn = asyncio.ensure_future,
        quick: Callable[[], Awaitable[Records] | None] = lambda: None,
    ) -> None:
        """``spawn`` starts the prefetch task (the daemon's: cancelled at exit);
        ``quick`` starts a quick read, or returns None while none can be had."""
        self._read, self._clock, self._max_age_s = read, clock, max_age_s
        self._quick = quick
        self._age_s = max_age_s  # this prefetch's bound (see schedule)
        self._spawn = spawn
        self._task: asyncio.Task[None] | None = None
        self._in_flight: asyncio.Event | None = None  # set when the read in flight ends
        self._latest: tuple[float, Records] | None = None  # (when it ended, the roster)
        self.read_s: float | None = None  # smoothed duration of a roster read
        self.used = self.stale = self.failed = 0  # prefetches taken, too old, failed
        self.at_start = 0  # full reads a round start waited for
        self.quick = 0  # quick reads a round start took instead

    async def _timed(self) -> Records:
        began = self._clock()
        records = await self._read()
        took = self._clock() - began
        self.read_s = (
            took if self.read_s is None else (SMOOTHING * took + (1 - SMOOTHING) * self.read_s)
        )
        return records

    async def _keep_fresh(self, delay_s: float) -> None:
        """Read when the steps are about to end, then again whenever the last read is
        about to be too old, until a round takes one (a fill or a late partner can make
        the round outlast a heartbeat); one read at a time."""
        if delay_s > 0:
            await asyncio.sleep(delay_s)  # a schedule, not a wait on anything
        while not cancelled():  # a cancel the read swallowed (gaslocd/net/tasks.py) ends it
            done = self._in_flight = asyncio.Event()
            try:
                records = await self._timed()
            except Exception as exc:  # the DHT's own errors: the round reads for itself
                self.failed += 1
                log.debug("prefetched roster read failed (%s)", exc)
                return
            else:
                if not cancelled():  # else superseded: the next round's prefetch owns _latest
                    self._latest = (self._clock(), records)
            finally:
                done.set()
                if self._in_flight is done:
                    self._in_flight = None
            assert self.read_s is not None
            await asyncio.sleep(refresh_after(self._age_s, self.read_s))

    def schedule(self, steps_s: float, round_s: float | None = None) -> None:
        """The round's steps take about ``steps_s`` from now: start the next read so that
        it ends with them. Before a read was timed here (the start-up's reads are not)
        it starts at once: quick reads merge with the full reads this keeps making.

        ``round_s`` (the last round's length) tightens the age bound to one round when
        rounds are shorter than a heartbeat, so a roster is never older than the rounds
        of lead a newcomer announces (``active_from``); never below ``MIN_AGE_S``."""
        self.cancel()
        self._age_s = self._max_age_s
        if round_s is not None:
            self._age_s = max(MIN_AGE_S, min(self._max_age_s, round_s))
        if steps_s <= 0:
            return
        delay = 0.0 if self.read_s is None else read_delay(steps_s, self.read_s)
        self._task = self._spawn(self._keep_fresh(delay))

    def cancel(self) -> None:
        self._stop(self._task)

    def _fresh(self) -> Records | None:
        latest = self._latest
        if latest is not None and self._clock() - latest[0] <= self._age_s:
            return latest[1]
        return None

    async def get(self) -> Records:
        """The roster for the round starting now: the prefetch's when fresh, else a quick
        read, else (nothing to merge a quick read with yet) a full one.

        Raises what the read raises (the caller decides what a failed read means)."""
        task = self._task
        records = self._fresh()
        in_flight = self._in_flight
        quick = self._quick() if records is None else None
        if quick is None and task is not None and records is None and in_flight is not None:
            # A read in flight ends sooner than one started now, however long it has
            # run (a DHT node slow to answer holds both alike): take it.
            done = asyncio.ensure_future(in_flight.wait())
            try:
                await asyncio.wait({task, done}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                done.cancel()
            records = self._fresh()
        stale = records is None and self._latest is not None
        self._stop(task)  # a full read in flight still lands for the next quick one
        if records is not None:
            self.used += 1
            return records
        self.stale += stale
        if quick is not None:
            self.quick += 1
            return await quick
        self.at_start += 1
        return await self._timed()

    def _stop(self, task: asyncio.Task[None] | None) -> None:
        self._task = None
        self._latest, self._in_flight = None, None
        if task is not None:
            task.cancel()

    def counts(self) -> dict[str, int]:
        """By source, as ``gasloc_roster_reads_total`` exports them."""
        return {
            "prefetched": self.used,
            "quick": self.quick,
            "at_round_start": self.at_start,
            "stale": self.stale,
            "failed": self.failed,
        }
