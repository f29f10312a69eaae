"""One round of a daemon: roster → catch up / pace → plan → train → fill the wait →
mix → resync / solo pacing → evaluate / checkpoint → report.

Every decision is the protocol's (:mod:`gaslocd.protocol`), the same code the simulator
runs; this driver supplies the clock, the awaits and the calls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from gaslocd.daemon.membership import Membership
from gaslocd.daemon.mixing import GossipMixer, Mixer, MixResult
from gaslocd.daemon.runtime import Runtime
from gaslocd.daemon.telemetry import RoundOutcome
from gaslocd.protocol.account import TimeAccount
from gaslocd.protocol.linkcodec import codec_ladder
from gaslocd.protocol.plan import RoundSetup, plan_this_round
from gaslocd.protocol.records import PeerRecord
from gaslocd.protocol.sitout import SitOut

log = logging.getLogger(__name__)
T = TypeVar("T")


def _own_record_fresh(
    records: list[PeerRecord], me: str, sit: SitOut, rate: float
) -> list[PeerRecord]:
    """The roster with our own sit-out schedule and link rate as we know them now (the
    DHT may still show an older record of ours: a sit-out must leave us out of the
    pairing when the others do, and our link's rate is ours to know first)."""
    out = []
    for r in records:
        if r.peer_id == me:
            rate = rate or r.bandwidth_bytes_per_s
            r = replace(sit.on(r), bandwidth_bytes_per_s=rate)
        out.append(r)
    return out


def _roster(setup: RoundSetup, me: str) -> tuple[str, ...]:
    return setup.plan.roster if setup.plan is not None else (me,)


class RoundDriver:
    def __init__(
        self,
        rt: Runtime,
        membership: Membership,
        mixer: Mixer,
        checkpoint: Callable[[], Awaitable[None]],
    ) -> None:
        self.rt, self.membership, self.mixer, self.checkpoint = rt, membership, mixer, checkpoint
        self.mark = rt.clock()  # reset by the lifecycle when the first round starts
        # The codecs a slow link may step down to (gaslocd.protocol.linkcodec).
        adapt = rt.algo.adapt_codec and isinstance(mixer, GossipMixer)
        self.ladder = codec_ladder(rt.cfg.codec, rt.wire.codecs) if adapt else ()
        self.long_landed = 0  # long exchanges mixed this round
        self.long_dropped = 0  # and dropped not for lack of time (the resync rule)
        self._begun = False  # the round's begin_round already done (by pacing)
        self.landed_after: int | None = None  # overlap: steps before the last round landed
        self.last_round_s: float | None = None  # bounds a prefetched roster's age

    async def run_round(self) -> None:
        rt = self.rt
        acct = TimeAccount()
        began = self.mark  # the previous round's end: rounds tile the wall-clock
        records = await self.membership.round_roster()
        read_s = rt.clock() - began
        rt.policy.observe_roster(rt.clock(), records)
        t = self._catch_up(rt.state.round, records)
        rt.server.board.at(t)  # callers count rounds ahead from ours, offer or not
        records, paced = await self._pace(t, records)
        if rt.sit.announces(t):  # peers pace and catch up on our current round
            rt.spawn(self.membership.publish(announce=True))
        acct.add("fill", paced[1])
        roster_s = rt.clock() - began - paced[1]
        acct.add("roster", roster_s)
        # The `roster` activity's parts, for the run's JSON (a bench's diagnosis).
        parts = {"read": read_s, "pace": roster_s - read_s}
        setup = self._plan(t, records)
        self._sit_out_if(setup)
        losses, mixed, exchange_began = await self._train_and_mix(setup, acct)
        losses = paced[0] + losses
        acct.add_all(mixed.parts)
        done, dropped = mixed.exchanged + self.long_landed, self.long_dropped
        resync = rt.policy.should_resync
        if mixed.setup is not None and resync(mixed.setup, done, dropped, mixed.excused):
            await self._roster_part(acct, parts, "resync", self.membership.resync(records))
        exchange_s = rt.clock() - exchange_began
        pause = rt.policy.solo_wait_s(setup, rt.clock() - began, rt.clock())
        if pause > 0:  # a partnerless round lasts T (docs/design.md §1)
            await self._roster_part(acct, parts, "pause", asyncio.sleep(pause))
        val = await self._timed(acct, "eval", self._evaluate_if_due())
        if rt.cfg.checkpoint_dir and rt.state.round % rt.cfg.checkpoint_every == 0:
            await self._timed(acct, "checkpoint", self.checkpoint())
        self.mark = rt.clock()
        self.last_round_s = self.mark - began
        acct.close(self.last_round_s)
        outcome = RoundOutcome(
            setup=setup,
            losses=losses,
            val=val,
            consensus=mixed.consensus,
            account=acct,
            exchanged=mixed.exchanged,
            row=mixed.row,
            roster=_roster(mixed.setup or setup, rt.me),
            exchange_s=exchange_s,
            tokens=len(losses) * rt.state.trainer.tokens_per_step,
            clipped=mixed.clipped,
            rescaled=mixed.rescaled,
            rollbacks=dict(rt.state.rollbacks),
            mixed=mixed.setup,
            overlapped=self.overlapped,
            long_landed=self.long_landed,
            landed_after=self.landed_after if mixed.setup is not None else None,
            roster_parts=parts,
        )
        self.long_landed = self.long_dropped = 0
        rt.progress(rt.telemetry.finish_round(outcome, rt.links, rt.state.round))

    def _plan(self, t: int, records: list[PeerRecord]) -> RoundSetup:
        rt = self.rt
        return plan_this_round(
            rt.algo,
            rt.cfg.run_id,
            rt.me,
            t,
            _own_record_fresh(records, rt.me, rt.sit, rt.links.own_bandwidth()),
            rt.links,
            rt.message_bytes,
            rt.cfg.exchange_deadline_s,
            ladder=self.ladder,
            numel=rt.state.numel,
            rate_hints=rt.server.rate_hints,
        )

    @property
    def overlapped(self) -> bool:
        return isinstance(self.mixer, GossipMixer) and self.rt.algo.overlap

    async def _train_and_mix(
        self, setup: RoundSetup, acct: TimeAccount
    ) -> tuple[list[float], MixResult, float]:
        """The round's steps, the fill, and the mix (overlapped: of the previous round);
        returns the losses, the mix and when the exchange phase began."""
        rt = self.rt
        if not self._begun:
            await rt.thread.call(rt.state.begin_round)
        self._begun = False
        steps = setup.inner_steps
        step_s = rt.links.step_time_s
        if step_s and isinstance(self.mixer, GossipMixer):
            # the next round's roster, read while these steps run; not before an
            # all-reduce, which outlasts a fresh read and would only double the reads,
            # nor before a round we sit out: we pace on nobody there, our own DHT
            # node's copy will do, and a full read (every node answers with every
            # record) is bytes on the very link that is too slow
            if rt.sit.takes_part(setup.round + 1):
                self.membership.prefetch.schedule(steps * step_s, self.last_round_s)
            else:
                self.membership.prefetch.cancel()
        losses = await self._timed(acct, "train", self._train(steps, landing=self.overlapped))
        early, before = None, len(losses)
        if self.overlapped and before < steps:  # the exchange in flight is over
            assert isinstance(self.mixer, GossipMixer)
            early = await self.mixer.land()  # its wait (none) and mix go in its parts
            losses += await self._timed(acct, "train", self._train(steps - before))
        rt.server.ready.finished = setup.round  # what a Ready from behind NAT is told
        if self.overlapped:
            losses += await self._timed(acct, "fill", self._fill_in_flight(len(losses)))
            self.landed_after = before if early is not None else len(losses)
            began = rt.clock()
            return losses, await self._overlapped(setup, early), began
        if rt.algo.algo != "diloco" and rt.algo.adapt_h and setup.partners:
            losses += await self._timed(acct, "fill", self._fill_wait(setup, len(losses)))
        began = rt.clock()
        return losses, await self.mixer.mix(setup), began

    async def _pace(
        self, t: int, records: list[PeerRecord]
    ) -> tuple[list[PeerRecord], tuple[list[float], float]]:
        """Pacing (a peer more than a round behind): overlapped, train while it lasts
        (:meth:`~gaslocd.protocol.policy.RoundPolicy.paced_steps`), so nobody idles for a
        slow peer. Returns the roster and (the losses, the seconds) of those steps."""
        rt = self.rt
        if not (self.overlapped and rt.algo.adapt_h and rt.policy.behind(t, records)):
            return await self.membership.pace(t, records), ([], 0.0)
        await rt.thread.call(rt.state.begin_round)
        self._begun = True
        stop = threading.Event()

        def enough() -> bool:
            return stop.is_set() or rt.thread.should_stop()

        began = rt.clock()
        job = asyncio.ensure_future(rt.thread.call(rt.state.train, rt.algo.h_upper, enough))
        try:
            records = await self.membership.pace(t, records)
        finally:
            stop.set()
            losses = await job
        return records, (losses, rt.clock() - began)

    def _sit_out_if(self, setup: RoundSetup) -> None:
        """Our link cannot carry θ̃ in a round (or can again): announce the schedule of
        rounds we are paired in (gaslocd.protocol.sitout), so every peer leaves us out
        alike while our long exchange crosses."""
        rt = self.rt
        sit = rt.sit.after(setup.round, setup.sit_every)
        if sit != rt.sit:
            rt.sit = sit
            rt.server.board.sit_out(sit, setup.round)
            rt.spawn(self.membership.publish(announce=True))
            # What it was judged on: a borderline link flips with T (the machine's load).
            mbit, t = 8e-6 * rt.links.known_own_rate(), setup.target_round_s or 0.0
            why = f"link {mbit:.3g} Mbit/s, T {t:.2f} s"
            rt.progress(
                f"round {setup.round + 1}: our link needs {sit.every} rounds per exchange; "
                f"paired every {sit.every} rounds from round {sit.free_from + 1} ({why})"
                if sit.periodic
                else f"round {setup.round + 1}: our link carries θ̃ within a round again; "
                f"paired every round from round {sit.free_from + 1} ({why})"
            )
        rt.telemetry.metrics.sitting_out.set(0 if rt.sit.takes_part(setup.round + 1) else 1)

    async def _overlapped(self, setup: RoundSetup, early: MixResult | None) -> MixResult:
        """Land the previous round's exchange (its delayed outer step) unless it landed
        between the steps (``early``), then put this round's θ̃ on the wire; the run's
        last round lands at once. Long exchanges that ended meanwhile are mixed first."""
        rt = self.rt
        assert isinstance(self.mixer, GossipMixer)
        self.long_landed, self.long_dropped = await self.mixer.land_long()
        landed = early if early is not None else await self.mixer.land()
        await self.mixer.send(setup)
        last = bool(rt.cfg.max_rounds) and rt.state.round >= rt.cfg.max_rounds
        final = await self.mixer.land_now_if(last)
        mixed = final or landed
        if mixed is None:
            return MixResult(None, 0, {rt.me: 1.0})
        if final is not None and landed is not None:  # both waits were this round's
            parts = {k: landed.parts.get(k, 0.0) + v for k, v in final.parts.items()}
            mixed = replace(final, parts=parts)
        return mixed

    async def _fill_in_flight(self, done: int) -> list[float]:
        """Overlap: train on while the previous round's exchange is still on the wire
        (the protocol's :meth:`~gaslocd.protocol.policy.RoundPolicy.fill_overlap`)."""
        rt, mixer = self.rt, self.mixer
        assert isinstance(mixer, GossipMixer)
        flight = mixer.in_flight
        if not rt.algo.adapt_h or flight is None:
            return []
        until = flight.began + flight.setup.deadline_s
        fill = rt.policy.fill_overlap(not mixer.landed(), done, until)
        if fill is None:
            return []

        def enough() -> bool:
            return rt.thread.should_stop() or fill.done(rt.clock(), mixer.landed())

        return await rt.thread.call(rt.state.train, fill.room, enough)

    async def _train(self, steps: int, landing: bool = False) -> list[float]:
        """Up to ``steps`` steps. ``landing`` (overlap): stop at the first step boundary
        after the previous round's exchange is over, so that its outer step lands there
        and the rest of the round trains from the corrected θ, as the simulator models it
        (:func:`gaslocd.sim.clock.landing_step`)."""
        rt, mixer = self.rt, self.mixer

        def enough() -> bool:
            landed = landing and isinstance(mixer, GossipMixer) and mixer.landed()
            return rt.thread.should_stop() or landed

        losses = await rt.thread.call(rt.state.train, steps, enough)
        if rt.state.trainer.last_step_s is not None and losses:
            rt.links.record_step_time(rt.state.trainer.last_step_s)
        return losses

    async def _timed(self, acct: TimeAccount, activity: str, job: Awaitable[T]) -> T:
        began = self.rt.clock()
        try:
            return await job
        finally:
            acct.add(activity, self.rt.clock() - began)

    async def _roster_part(
        self, acct: TimeAccount, parts: dict[str, float], part: str, job: Awaitable[None]
    ) -> None:
        began = self.rt.clock()
        try:
            await job
        finally:
            parts[part] = self.rt.clock() - began
            acct.add("roster", parts[part])

    def _catch_up(self, t: int, records: list[PeerRecord]) -> int:
        ahead = self.rt.policy.catch_up(t, records)
        if ahead != t:
            log.info("round %d: peers are at round %d, catching up", t, ahead)
            with self.rt.state.lock:
                self.rt.state.round = ahead
        return ahead

    async def _fill_wait(self, setup: RoundSetup, done: int) -> list[float]:
        """Tell this round's partners we are ready, and train on until they are too
        (the protocol's :class:`~gaslocd.protocol.policy.FillWait`)."""
        rt = self.rt
        fill = rt.policy.fill_wait(setup, done, rt.clock())
        behind_nat = rt.me in setup.unreachable
        for peer, address in setup.partners.items():
            if peer in setup.unreachable and not behind_nat:
                continue  # nobody can call it: its own Ready asks us, and our reply tells
            ask = peer if behind_nat and fill is not None else None
            until = fill.until if fill is not None else 0.0
            rt.spawn(self.membership.notify_ready(address, setup.round, ask, until))
        partners = list(setup.partners)
        if fill is None or rt.server.partners_ready(setup.round, partners):
            return []

        def enough() -> bool:
            ready = rt.server.partners_ready(setup.round, partners)
            return rt.thread.should_stop() or fill.done(rt.clock(), ready)

        return await rt.thread.call(rt.state.train, fill.room, enough)

    async def _evaluate_if_due(self) -> float | None:
        rt = self.rt
        due = rt.cfg.eval_every and rt.state.round % rt.cfg.eval_every == 0
        last = rt.cfg.max_rounds and rt.state.round >= rt.cfg.max_rounds
        if (due or last or rt.stopping) and rt.state.trainer.evaluates:
            return await rt.thread.call(rt.state.evaluate)
        return None
