"""The next round's roster read during this round's steps (gaslocd.daemon.prefetch).

Driven with a fake clock and reads that the test releases: what is checked is which
read a round gets (the prefetched one only while fresh) and how many DHT reads it cost.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from gaslocd.daemon.prefetch import (
    MIN_AGE_S,
    READ_MARGIN,
    READ_SLACK_S,
    RosterPrefetch,
    read_delay,
    refresh_after,
)
from gaslocd.net.discovery import DiscoveryError
from gaslocd.protocol.records import PeerRecord

MAX_AGE_S = 3.0
WAIT_S = 5.0  # bound on every wait in these tests


def _record(peer: str, round_: int = 0) -> PeerRecord:
    return PeerRecord(
        peer_id=peer,
        address="127.0.0.1:1",
        fingerprint="f",
        round=round_,
        inner_steps=10,
        step_time_s=0.1,
        bandwidth_bytes_per_s=1e6,
        version="0",
    )


class Reads:
    """A DHT stand-in: each read returns the next answer (or raises it), taking
    ``took`` seconds of the fake clock, and may be held until the test releases it."""

    def __init__(self, *answers: list[PeerRecord] | Exception, took: float = 0.4) -> None:
        self.answers, self.took, self.now, self.count = list(answers), took, 0.0, 0
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.third = asyncio.Event()  # set when the third read begins

    def clock(self) -> float:
        return self.now

    async def __call__(self) -> list[PeerRecord]:
        self.count += 1
        self.started.set()
        if self.count == 3:
            self.third.set()
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), WAIT_S)
        self.now += self.took
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """A test on its own event loop (the project has no asyncio test plugin)."""

    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(asyncio.wait_for(test(), WAIT_S * 2))

    return sync


def _prefetch(reads: Reads) -> RosterPrefetch:
    return RosterPrefetch(reads, reads.clock, MAX_AGE_S)


def test_delay_ends_the_read_with_the_steps() -> None:
    assert read_delay(10.0, 0.5) == pytest.approx(10.0 - READ_MARGIN * 0.5 - READ_SLACK_S)
    assert read_delay(0.5, 2.0) == 0.0  # a read longer than the steps starts at once


@run
async def test_fresh_prefetch_is_used_and_costs_no_read_at_the_round_start() -> None:
    first, second = [_record("a")], [_record("a", 1), _record("b", 1)]
    reads = Reads(first, second)
    p = _prefetch(reads)
    assert await p.get() == first  # nothing to hide yet: read now, and time it
    assert p.read_s == pytest.approx(0.4)
    p.schedule(0.5)  # steps shorter than a read: the read starts at once
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.now += 0.5  # the steps end
    assert await p.get() == second
    assert (reads.count, p.used, p.stale) == (2, 1, 0)
    assert p.counts() == {"prefetched": 1, "quick": 0, "at_round_start": 1, "stale": 0, "failed": 0}


@run
async def test_prefetch_older_than_a_heartbeat_is_read_again() -> None:
    old, new = [_record("a", 3)], [_record("a", 5), _record("b", 5)]
    reads = Reads([_record("a")], old, new)
    p = _prefetch(reads)
    await p.get()
    p.schedule(0.1)
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.now += MAX_AGE_S + 1.0  # a pacing wait, say, kept the round from starting
    assert await p.get() == new
    assert (reads.count, p.used, p.stale) == (3, 0, 1)


@run
async def test_a_round_that_outlasts_a_heartbeat_gets_a_refreshed_prefetch() -> None:
    first, old, new = [_record("a")], [_record("a", 1)], [_record("a", 2), _record("b", 2)]
    reads = Reads(first, old, new, took=0.0)
    p = RosterPrefetch(reads, reads.clock, 0.2)  # a short heartbeat: refreshes come soon
    await p.get()
    p.schedule(0.01)
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.now += 0.5  # a long fill: the prefetched roster is too old by now ...
    await asyncio.wait_for(reads.third.wait(), WAIT_S)  # ... and has been read again
    assert await p.get() == new
    assert p.counts() == {"prefetched": 1, "quick": 0, "at_round_start": 1, "stale": 0, "failed": 0}


def test_refresh_never_reads_back_to_back() -> None:
    assert refresh_after(3.0, 0.2) == pytest.approx(3.0 - READ_MARGIN * 0.2 - READ_SLACK_S)
    assert refresh_after(3.0, 5.0) == 1.5  # reads slower than a heartbeat: every half of one


@run
async def test_read_in_flight_at_the_round_start_is_awaited_not_repeated() -> None:
    reads = Reads([_record("a")], [_record("a", 1)])
    p = _prefetch(reads)
    await p.get()
    reads.gate = asyncio.Event()
    reads.started.clear()
    p.schedule(0.1)
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.now += MAX_AGE_S + 1.0  # a DHT node slow to answer: the read runs long
    round_start = asyncio.ensure_future(p.get())
    await asyncio.sleep(0)  # let get() reach the await; nothing depends on its timing
    assert not round_start.done()
    reads.gate.set()
    assert await asyncio.wait_for(round_start, WAIT_S) == [_record("a", 1)]
    assert (reads.count, p.used) == (2, 1)


@run
async def test_failed_prefetch_reads_again_and_a_failed_read_reaches_the_caller() -> None:
    reads = Reads([_record("a")], DiscoveryError("DHT get timed out"), [_record("a", 2)])
    p = _prefetch(reads)
    await p.get()
    p.schedule(0.1)
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    assert await p.get() == [_record("a", 2)]
    assert (reads.count, p.failed, p.used) == (3, 1, 0)
    reads.answers.append(DiscoveryError("DHT get timed out"))
    with pytest.raises(DiscoveryError):  # the caller decides (the daemon trains alone)
        await p.get()


@run
async def test_prefetch_not_begun_is_cancelled_and_the_round_reads_now() -> None:
    reads = Reads([_record("a")], [_record("a", 1)])
    p = _prefetch(reads)
    await p.get()
    p.schedule(3600.0)  # the steps were expected to take an hour; the round ended early
    assert await p.get() == [_record("a", 1)]
    await asyncio.sleep(0)  # the cancelled prefetch gets its turn to run, and must not read
    assert (reads.count, p.used, p.stale) == (2, 0, 0)


@run
async def test_cancel_leaves_nothing_running() -> None:
    reads = Reads([_record("a")])
    p = _prefetch(reads)
    await p.get()
    tasks: list[asyncio.Task[list[PeerRecord]]] = []

    def spawn(coro):  # type: ignore[no-untyped-def]
        tasks.append(asyncio.ensure_future(coro))
        return tasks[-1]

    p = RosterPrefetch(reads, reads.clock, MAX_AGE_S, spawn)
    p.read_s = 0.4
    p.schedule(3600.0)
    p.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(t.cancelled() for t in tasks) and len(tasks) == 1
    assert reads.count == 1


@run
async def test_rounds_shorter_than_a_heartbeat_bound_the_age_to_a_round() -> None:
    # A newcomer announces itself 2 rounds ahead: a roster older than a round could miss
    # it where others see it. With 1.5 s rounds a 2 s old prefetch is read again.
    reads = Reads([_record("a")], [_record("a", 1)], [_record("a", 2)], [_record("a", 3)])
    p = _prefetch(reads)
    await p.get()
    p.schedule(0.1, round_s=1.5)
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.now += 2.0
    assert await p.get() == [_record("a", 2)]
    assert (p.used, p.stale) == (0, 1)
    reads.started.clear()
    p.schedule(0.1, round_s=0.01)  # never below MIN_AGE_S: refreshes would read nonstop
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.now += MIN_AGE_S - 0.1
    assert await p.get() == [_record("a", 3)]
    assert (p.used, reads.count) == (1, 4)


@run
async def test_a_read_that_swallows_its_cancel_ends_and_leaves_the_next_prefetch_alone() -> None:
    """The read's answer arrives in the loop iteration of the cancel (the next schedule):
    Python 3.11's wait_for then returns the answer instead of raising (gaslocd.net.tasks).
    The superseded loop must neither keep reading nor hand its roster to the next round."""
    old, new = [_record("old")], [_record("new")]
    reads = Reads([_record("a")], old, new)
    tasks: list[asyncio.Task[None]] = []

    def spawn(coro):  # type: ignore[no-untyped-def]
        tasks.append(asyncio.ensure_future(coro))
        return tasks[-1]

    p = RosterPrefetch(reads, reads.clock, MAX_AGE_S, spawn)
    await p.get()
    reads.gate = asyncio.Event()
    p.schedule(0.1)
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.gate.set()  # the answer arrives ...
    p.schedule(3600.0)  # ... as the next round cancels this prefetch
    await asyncio.wait_for(asyncio.gather(tasks[0], return_exceptions=True), WAIT_S)
    assert reads.count == 2 and not tasks[0].cancelled()  # it swallowed the cancel, and ended
    assert await p.get() == new  # not the superseded read's roster: read at the round start
    assert (p.used, reads.count) == (0, 3)


class Quick:
    """Our DHT node's merged copy: answered at once, or None while no full read ended."""

    def __init__(self, answer: list[PeerRecord]) -> None:
        self.answer, self.ready, self.count = answer, False, 0

    def __call__(self) -> Coroutine[Any, Any, list[PeerRecord]] | None:
        if not self.ready:
            return None
        self.count += 1

        async def read() -> list[PeerRecord]:
            return self.answer

        return read()


@run
async def test_a_round_start_takes_a_quick_read_instead_of_waiting_for_one_in_flight() -> None:
    """A 10× straggler's DHT node answers in seconds, and a full read waits for it: the
    round starts from our own node's copy (merged with the last full read) instead."""
    local = [_record("a", 1), _record("b", 1)]
    reads, quick = Reads([_record("a")], [_record("a", 1)], took=0.4), Quick(local)
    p = RosterPrefetch(reads, reads.clock, MAX_AGE_S, asyncio.ensure_future, quick)
    assert await p.get() == [_record("a")]  # the first round: nothing to merge with yet
    quick.ready = True  # that full read ended: quick reads can be had from now on
    reads.gate = asyncio.Event()
    reads.started.clear()
    p.schedule(0.1)
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    reads.now += MAX_AGE_S + 1.0  # the read in flight runs long (a slow node)
    assert await asyncio.wait_for(p.get(), WAIT_S) == local  # not held by the gate
    assert p.counts() == {"prefetched": 0, "quick": 1, "at_round_start": 1, "stale": 0, "failed": 0}
    reads.gate.set()
    # A fresh prefetch still wins over a quick read: it saw every replica.
    reads.answers = [[_record("a", 2), _record("b", 2), _record("c", 2)]]
    p.schedule(0.1)
    while p._latest is None:  # the prefetch's read lands (bounded by run's timeout)
        await asyncio.sleep(0)
    assert len(await p.get()) == 3 and quick.count == 1 and p.used == 1


@run
async def test_before_any_read_was_timed_the_prefetch_starts_at_once() -> None:
    """A daemon's start-up reads the roster outside the prefetch, so its first rounds can
    take quick reads: the prefetch must still make full reads (once it never did, and
    every round of a run took a quick read merged with start-up's entries)."""
    fresh = [_record("a", 1), _record("b", 1)]
    reads, quick = Reads(fresh), Quick([_record("a")])
    quick.ready = True
    p = RosterPrefetch(reads, reads.clock, MAX_AGE_S, asyncio.ensure_future, quick)
    p.schedule(3600.0)  # an hour of steps, and no read time to plan the read by
    await asyncio.wait_for(reads.started.wait(), WAIT_S)
    while p._latest is None:  # the read lands (bounded by run's timeout)
        await asyncio.sleep(0)
    assert await p.get() == fresh and p.used == 1 and quick.count == 0
