"""How a round's θ̃ meets the others': gossip with this round's partners, or DiLoCo's
all-reduce. Both sit behind :class:`Mixer`, so the round driver does not know which runs.

Both end in the train layer's outer step (:class:`~gaslocd.train.worker.Worker`), the
same code the simulator calls; which exchanges count and the row of W they give come
from the protocol (:func:`~gaslocd.protocol.policy.counted_exchanges`,
:func:`~gaslocd.protocol.policy.mixing_row`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import torch

from gaslocd.daemon.runtime import Runtime
from gaslocd.net.allreduce import AllReduceFailed, HivemindAllReduce
from gaslocd.net.codecs import FeedbackBank
from gaslocd.net.rendezvous import ExchangeResult, Outcome
from gaslocd.protocol.account import split_exchange
from gaslocd.protocol.linkcodec import message_bytes
from gaslocd.protocol.plan import MAX_LONG_ROUNDS, RoundSetup
from gaslocd.protocol.policy import SAT_OUT, counted_exchanges, mendable_drops, mixing_row
from gaslocd.protocol.records import PeerRecord
from gaslocd.protocol.sitout import SitOut
from gaslocd.train.device import on_host

log = logging.getLogger(__name__)
T = TypeVar("T")
# Long exchanges on the wire at once, at most: each holds a θ̃ of its round and a receive
# buffer until it lands. A slow link has about one per partner; more is a partner asking
# (in its header) to keep streams open that an honest slow link would not need.
MAX_LONG_FLIGHTS = 4


def _scaled(parts: dict[str, float], total: float) -> dict[str, float]:
    """``parts`` scaled to add up to ``total`` (the share of an exchange that was waited
    for, booked in the exchange's own proportions)."""
    whole = sum(parts.values())
    if whole <= 0:
        return {"wait_ready": max(0.0, total)} if total > 0 else {}
    return {k: v * max(0.0, total) / whole for k, v in parts.items()}


@dataclass(frozen=True)
class LongFlight:
    """A long exchange of ``round`` with ``peer`` (planned weight W_ij) still on the wire."""

    round: int
    peer: str
    weight: float
    task: asyncio.Task[Outcome]


@dataclass(frozen=True)
class InFlight:
    """Overlap: the round whose θ̃ is on the wire while the next one trains."""

    setup: RoundSetup
    task: asyncio.Future[dict[str, Outcome]] | None  # None: no partners that round
    began: float


@dataclass(frozen=True)
class MixResult:
    consensus: float | None  # RMS distance to the partners' θ̃ (None: nothing mixed)
    exchanged: int  # partners (or all-reduce group members) whose θ̃ entered the mix
    row: dict[str, float] = field(default_factory=dict)  # our row of W as applied
    # The exchange's time by activity (wait_ready, transfer, slow_link); the outer step
    # and bookkeeping are the driver's "other".
    parts: dict[str, float] = field(default_factory=dict)
    clipped: int = 0  # partners whose θ̃ robust mixing pulled in to the trust radius
    rescaled: int = 0  # partners within it whose norm gap alone was cut
    setup: RoundSetup | None = None  # the round mixed (overlapped: the previous one)
    excused: frozenset[str] = frozenset()  # partners that said they sit this round out


class Mixer(Protocol):
    async def mix(self, setup: RoundSetup) -> MixResult:
        """Exchange this round's θ̃, then take the outer step (advances the round)."""


class GossipMixer:
    """Stream θ̃ to this round's partners over gRPC and mix what arrives.

    Without overlap, :meth:`mix` is the whole exchange. With overlap the round driver
    calls :meth:`send` (hold θ̃, start the exchange in the background) and, after the
    next round's steps, :meth:`land` (await it, take the delayed outer step); one round
    is in flight at a time, so the server still has one open offer.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.feedback = FeedbackBank(rt.state.numel)  # a residual per codec we send in
        self._buffers: list[torch.Tensor] = []
        self.in_flight: InFlight | None = None
        self.long: list[LongFlight] = []  # long exchanges on the wire
        # The run's current records (set by the lifecycle): who announced a sit-out.
        self.roster: Callable[[], Awaitable[list[PeerRecord]]] | None = None

    async def mix(self, setup: RoundSetup) -> MixResult:
        rt = self.rt
        if not setup.partners or setup.plan is None:
            return replace(await self._alone(), setup=setup)
        tilde = await rt.thread.call(rt.state.tilde_on_host)  # a GPU's copy off the loop
        await self._open(setup, tilde)
        began = rt.clock()
        outcomes = await rt.server.exchange_round(setup.round, setup.deadline_s)
        return await self._settle(setup, outcomes, rt.clock() - began)

    async def send(self, setup: RoundSetup) -> None:
        """Overlap: hold this round's θ̃ and exchange it while the next round trains."""
        rt = self.rt
        tilde = await rt.thread.call(rt.state.hold_tilde, rt.algo.outer)
        task = None
        if setup.partners and setup.plan is not None:
            for _ in setup.long:  # our θ̃ of this round is needed when they land
                await rt.thread.call(rt.state.keep_for_long, setup.round)
            await self._open(setup, tilde)
            task = self._track(self._exchange(setup))
        self.in_flight = InFlight(setup, task, rt.clock())

    def _track(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self.rt.tasks.add(task)  # the lifecycle cancels it at a stop
        task.add_done_callback(self.rt.tasks.discard)
        return task

    async def _exchange(self, setup: RoundSetup) -> dict[str, Outcome]:
        """The round's exchanges; a long one is left on the wire as a :class:`LongFlight`."""
        server = self.rt.server
        long = {p: setup.long_deadline_s(p) for p in setup.long if p in setup.partners}

        async def extend(running: dict[str, int]) -> dict[str, float]:
            """Partners whose exchange is long at their end: their header declared it
            (their view of the link's rates, or ours, was stale when one end planned), or
            they announced a sit-out covering this round since we planned it."""
            rounds = dict(running)
            if self.roster is not None and not all(rounds.values()):  # the DHT only if needed
                records = {r.peer_id: r for r in await self.roster()}
                for p in running:
                    hold = SitOut.of(records[p]).hold_after(setup.round) if p in records else 0
                    rounds[p] = max(rounds[p], hold)
            room = MAX_LONG_FLIGHTS - len(self.long) - len(setup.long)
            more = {p: setup.kept_s(k) for p, k in rounds.items() if k > 0}
            more = dict(list(more.items())[: max(0, room)])
            for _ in more:  # our θ̃ of that round is needed when it lands
                await asyncio.to_thread(self.rt.state.keep_for_long, setup.round)
            if more:  # and its receive buffer stays taken until then
                self._buffers = []
            return more

        outcomes = await server.exchange_round(
            setup.round, setup.deadline_s, long, extend, setup.kept_s(MAX_LONG_ROUNDS)
        )
        row = setup.mixing_row(self.rt.me)
        for peer, flight in server.take_long(setup.round).items():
            self.rt.tasks.add(flight)
            flight.add_done_callback(self.rt.tasks.discard)
            self.long.append(LongFlight(setup.round, peer, row[peer], flight))
        return outcomes

    async def land_long(self) -> tuple[int, int]:
        """Mix the long exchanges that ended since the last look (each end moves by
        W_ij·(θ̃_j − θ̃_i) of their round: :meth:`Worker.apply_pair_mix`); returns how
        many were mixed and how many dropped for a reason a resync could mend (refused,
        failed; not :data:`LATE_DROPS`, which only ran out of time on a slow link)."""
        rt, landed = self.rt, 0
        dropped: list[str] = []  # the reasons of those not mixed
        done, self.long = (
            [f for f in self.long if f.task.done()],
            [f for f in self.long if not f.task.done()],
        )
        for flight in done:
            outcome = None if flight.task.cancelled() else flight.task.result()
            ok = isinstance(outcome, ExchangeResult) and outcome.peer_refusal is None
            theta = outcome.theta if isinstance(outcome, ExchangeResult) and ok else None
            if isinstance(outcome, ExchangeResult) and ok:
                rt.links.record_transfer(
                    flight.peer, outcome.transfer_s, outcome.bytes_received, outcome.unread_s
                )
            applied = await rt.thread.call(
                rt.state.apply_pair_mix, flight.round, flight.weight, theta
            )
            rt.telemetry.metrics.count(rt.telemetry.metrics.long, "landed" if applied else "failed")
            reason = "cancelled" if outcome is None else getattr(outcome, "reason", "refused")
            log.info(
                "round %d: long exchange with %s %s",
                flight.round,
                flight.peer,
                "mixed" if applied else f"dropped ({reason})",
            )
            landed += applied
            if not applied:
                dropped.append(reason)
        return landed, mendable_drops(dropped)

    def landed(self) -> bool:
        """Whether the exchange in flight (if any) is over: the fill stops then."""
        flight = self.in_flight
        return flight is None or flight.task is None or flight.task.done()

    async def land(self) -> MixResult | None:
        """Overlap: wait for the exchange in flight and take its delayed outer step (None:
        nothing was in flight). A state adopted meanwhile (a resync) dropped the held θ̃:
        the exchange belonged to the state left behind and is discarded."""
        flight, self.in_flight = self.in_flight, None
        if flight is None:
            return None
        rt = self.rt
        if flight.task is None:
            alone = await self._alone() if rt.state.pending is not None else None
            return None if alone is None else replace(alone, setup=flight.setup)
        waited = rt.clock()
        outcomes = await flight.task
        if rt.state.pending is None:
            return None
        result = await self._settle(flight.setup, outcomes, rt.clock() - flight.began)
        # Only the time waited after the steps is this round's; the rest ran alongside.
        return replace(result, parts=_scaled(result.parts, rt.clock() - waited))

    async def land_now_if(self, last: bool) -> MixResult | None:
        """The run's last round lands at once: its model is final after that step."""
        return await self.land() if last else None

    async def _alone(self) -> MixResult:
        me = self.rt.me
        row = {me: 1.0}
        await self.rt.thread.call(self.rt.state.outer_update, row, {}, me, self.rt.algo.outer)
        return MixResult(None, 0, row)

    async def _open(self, setup: RoundSetup, tilde: torch.Tensor) -> None:
        best = self.rt.cfg.codec
        codec = {p: setup.codecs.get(p, best) for p in setup.partners} if setup.codecs else best
        await self.rt.server.open_round(
            setup.round,
            tilde,
            setup.partners,
            codec=codec,
            feedback=self.feedback,
            roster_digest=setup.digest,
            # A long exchange fills its buffer rounds later: never one reused each round.
            receive_buffers=() if setup.long else self._receive_buffers(len(setup.partners)),
            long_rounds=setup.long,
            own_rate=self.rt.links.known_own_rate(),
            dial=setup.dial,
        )

    async def _settle(
        self, setup: RoundSetup, outcomes: dict[str, Outcome], elapsed: float
    ) -> MixResult:
        rt, me = self.rt, self.rt.me
        received: dict[str, torch.Tensor] = {}
        refused_ours: set[str] = set()
        slowest: ExchangeResult | None = None
        excused = frozenset(p for p, o in outcomes.items() if getattr(o, "reason", "") == SAT_OUT)
        for peer, outcome in outcomes.items():
            if not isinstance(outcome, ExchangeResult):
                log.info(
                    "round %d: no exchange with %s: %s (%s)",
                    setup.round,
                    peer,
                    outcome.reason,
                    outcome.detail,
                )
                if outcome.reason == "deadline":  # at best this fast: never measured else
                    codec = setup.codecs.get(peer, rt.cfg.codec)
                    nbytes = message_bytes(codec, rt.state.numel)
                    rt.links.record_transfer(peer, setup.deadline_s, nbytes)
                continue
            received[peer] = outcome.theta
            rt.telemetry.metrics.count(rt.telemetry.metrics.codecs, outcome.codec_sent)
            if outcome.peer_refusal is not None:
                log.info("round %d: %s refused our θ̃ (%s)", setup.round, peer, outcome.peer_refusal)
                rt.telemetry.count_failure("one-sided")
                refused_ours.add(peer)
                continue
            rt.links.record_transfer(
                peer, outcome.transfer_s, outcome.bytes_received, outcome.unread_s
            )
            if slowest is None or outcome.wait_s + outcome.transfer_s > (
                slowest.wait_s + slowest.transfer_s
            ):
                slowest = outcome
        counted = counted_exchanges(received, refused_ours)
        row = mixing_row(setup, me, counted)
        used = {p: received[p] for p in counted}
        result = await rt.thread.call(rt.state.outer_update, row, used, me, rt.algo.outer)
        clip = result.clip
        for peer in clip.clipped:
            log.warning(
                "round %d: clipped %s's θ̃ (distance %.4g > trust radius %.4g)",
                setup.round,
                peer,
                clip.distances[peer],
                clip.radius,
            )
        return MixResult(
            result.consensus if used else None,
            len(used),
            row,
            self._parts(elapsed, slowest),
            clipped=len(clip.clipped),
            rescaled=len(clip.rescaled),
            setup=setup,
            excused=excused,
        )

    def _parts(self, elapsed: float, slowest: ExchangeResult | None) -> dict[str, float]:
        """The exchange phase by activity: the partner that finished last sets it (the
        others ran alongside); what it does not explain — partners that failed or were
        waited for until the deadline — is waiting too."""
        if slowest is None:
            return {"wait_ready": elapsed}
        parts = split_exchange(
            slowest.wait_s, slowest.transfer_s, slowest.bytes_received, self.rt.links.best_rate()
        )
        parts["wait_ready"] += max(0.0, elapsed - sum(parts.values()))
        return parts

    def _receive_buffers(self, n: int) -> list[torch.Tensor]:
        """Model-sized float32 buffers for partners' θ̃, reused across rounds (one per
        partner): allocating fresh ones every round costs more than the copy itself."""
        while len(self._buffers) < n:
            self._buffers.append(torch.empty(self.rt.state.numel, dtype=torch.float32))
        return self._buffers[:n]


class AllReduceMixer:
    """DiLoCo: all-reduce the pseudo-gradient Δ = θ − θ̃ through hivemind's averager."""

    def __init__(self, rt: Runtime, allreduce: HivemindAllReduce) -> None:
        self.rt, self.allreduce = rt, allreduce

    async def mix(self, setup: RoundSetup) -> MixResult:
        rt = self.rt
        state = rt.state
        delta = await rt.thread.call(lambda: on_host(state.theta_start - state.flat.flat))
        began = rt.clock()
        try:
            average, group = await self.allreduce.average(
                setup.round, delta, timeout_s=setup.deadline_s
            )
        except AllReduceFailed as exc:
            log.info(
                "round %d: no all-reduce (%s); stepping on our own pseudo-gradient",
                setup.round,
                exc,
            )
            rt.telemetry.count_failure("allreduce")
            average, group = delta, 1
        await rt.thread.call(state.outer_update_from_average, average, rt.algo.outer)
        # Idle: the wait for the group to form (everyone waits for the last arrival at the
        # barrier); with no group, the whole failed attempt.
        elapsed = rt.clock() - began
        idle = min(elapsed, self.allreduce.last_group_wait_s) if group > 1 else elapsed
        parts = {"wait_ready": idle, "transfer": elapsed - idle}
        return MixResult(None, group - 1, {}, parts, setup=setup)
