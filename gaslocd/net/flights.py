"""A round's exchanges on the wire: dial, wait, close; and long ones that outlive the round.

A *long* exchange is one whose link cannot carry θ̃ within a round (the protocol decides,
:func:`gaslocd.protocol.plan.plan_links`): it is started with the round like any other,
but the round does not wait for it. When the round closes, its stream goes on (the
offer *keeps* that partner: :meth:`~gaslocd.net.rendezvous.RoundBoard.close` leaves it
running, and the next round's offer does not close it either) until it ends or its own
deadline passes; the caller gets a task per long partner and mixes its result whenever
it lands. Everything else behaves as a round always did: when :func:`exchange_offer`
returns, nothing of the round but the long streams is still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gaslocd.net.client import PeerClient
from gaslocd.net.rendezvous import (
    ExchangeFailure,
    Outcome,
    RoundBoard,
    RoundOffer,
    finished_outcome,
)
from gaslocd.net.validation import WireStats

LongFlights = dict[str, "asyncio.Task[Outcome]"]
Extend = Callable[[dict[str, int]], Awaitable[Mapping[str, float]]]
"""Partners still streaming at the deadline, with the rounds their header declared long (0:
none) → those to keep as long (peer → seconds)."""


def _count(stats: WireStats, outcome: Outcome) -> Outcome:
    if isinstance(outcome, ExchangeFailure):
        stats.failures[outcome.reason] += 1
    else:
        stats.exchanges_ok += 1
    return outcome


async def exchange_offer(
    board: RoundBoard,
    client: PeerClient,
    me: str,
    offer: RoundOffer,
    deadline_s: float,
    long: Mapping[str, float],
    stats: WireStats,
    extend: Extend | None = None,
    extend_max_s: float = 0.0,
) -> tuple[dict[str, Outcome], LongFlights]:
    """Exchange with every partner of ``offer``: the round's outcomes (long partners
    excluded) once all are in or ``deadline_s`` passed, and a task per long partner
    (``long``: peer → its own deadline in seconds) that ends with its outcome.

    ``extend`` is asked, at the deadline, about the partners still streaming: those it
    names become long exchanges too (a partner whose header declared the exchange long,
    or that announced its link too slow after we planned the round, so that both ends
    still treat the exchange alike); our calls then run under ``extend_max_s`` (the
    longest extension), the deadline kept by cancelling. ``board.cut`` ends the wait."""
    long = dict(long)
    offer.keep = {p for p in long if p in offer.partners}
    call_s = max(deadline_s, extend_max_s) if extend is not None else deadline_s
    dialed = _dial_all(client, me, offer, long, call_s)
    futures: dict[str, asyncio.Future[Outcome]] = {
        p: dialed.get(p) or offer.outcomes[p] for p in offer.partners
    }
    waits = [f for p, f in futures.items() if p not in offer.keep]
    done = False
    try:
        await _all_or_cut(waits, deadline_s, board.cut)
        extend = None if board.cut.is_set() else extend  # stopping: nothing outlives it
        running_late = {
            p: offer.declared_long.get(p, 0)
            for p, f in futures.items()
            if p not in offer.keep and not f.done()
        }
        if running_late and extend is not None:
            more = {p: s for p, s in (await extend(running_late)).items() if p in running_late}
            long.update(more)
            offer.keep |= set(more)
        done = True
    finally:
        if not done:  # cancelled (a stop): the long streams go too
            offer.keep = set()
        board.close(offer)  # late callers are refused; running accepts stop, kept ones not
        running: list[asyncio.Future[Any]] = [f for p, f in dialed.items() if p not in offer.keep]
        running += [t for p, t in offer.peer_tasks.items() if p not in offer.keep]
        for fut in running:
            fut.cancel()  # accepts were cancelled by close(); this is idempotent
        await asyncio.gather(*running, return_exceptions=True)
    outcomes = {
        p: _count(stats, finished_outcome(p, f, deadline_s))
        for p, f in futures.items()
        if p not in offer.keep
    }
    flights: LongFlights = {
        p: asyncio.ensure_future(_long(board, offer, p, futures[p], dialed.get(p), long[p], stats))
        for p in offer.keep
    }
    return outcomes, flights


def _dial_all(
    client: PeerClient, me: str, offer: RoundOffer, long: Mapping[str, float], call_s: float
) -> dict[str, asyncio.Future[Outcome]]:
    """Our calls to the partners we dial (a long one retried while it is not there yet)."""
    return {
        p: asyncio.ensure_future(
            _dial_until(client, offer, p, long[p]) if p in long else client.dial(offer, p, call_s)
        )
        for p in offer.partners
        if p in offer.dial
    }


# A long exchange's partner may not be at its round yet (it runs behind, or was sitting
# out): these refusals of our call are retried until the exchange's own deadline.
NOT_THERE_YET = frozenset({"refused:future-round", "refused:timeout"})
RETRY_S = 1.0


async def _dial_until(
    client: PeerClient, offer: RoundOffer, peer: str, deadline_s: float
) -> Outcome:
    """A long exchange's dial, again while the partner has not reached its round."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        outcome = await client.dial(offer, peer, max(RETRY_S, end - loop.time()))
        again = isinstance(outcome, ExchangeFailure) and outcome.reason in NOT_THERE_YET
        if not again or end - loop.time() < 2 * RETRY_S:
            return outcome
        await asyncio.sleep(RETRY_S)  # a retry's pause, not a wait for an event


async def _all_or_cut(
    waits: list[asyncio.Future[Outcome]], timeout_s: float, cut: asyncio.Event
) -> None:
    """Until every one of ``waits`` is done, ``timeout_s`` passed, or ``cut`` is set."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    cutting = asyncio.ensure_future(cut.wait())
    pending: set[asyncio.Future[Any]] = set(waits)
    try:
        while pending and not cut.is_set() and loop.time() < end:
            await asyncio.wait(
                pending | {cutting}, timeout=end - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
            pending = {f for f in pending if not f.done()}
    finally:
        cutting.cancel()


async def _long(
    board: RoundBoard,
    offer: RoundOffer,
    peer: str,
    outcome: asyncio.Future[Outcome],
    dial: asyncio.Future[Outcome] | None,
    deadline_s: float,
    stats: WireStats,
) -> Outcome:
    """One long exchange to its end, or its deadline (then its stream is cancelled)."""
    try:
        await asyncio.wait({outcome}, timeout=deadline_s)
    finally:
        if not outcome.done():
            accept = offer.peer_tasks.get(peer)
            if accept is not None:
                accept.cancel()
            offer.resolve(peer, ExchangeFailure(peer, "deadline", "long exchange", "accept"))
            if dial is not None:
                dial.cancel()
                await asyncio.gather(dial, return_exceptions=True)
        board.release(offer, peer)
    return _count(stats, finished_outcome(peer, outcome, deadline_s))
