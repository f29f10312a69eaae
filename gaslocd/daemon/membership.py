"""Who is in the run, from this daemon's side: its record, the roster, joining, pacing,
taking a live peer's state (a newcomer, a resumed checkpoint far behind, a peer cut off).

The decisions (whom to wait for, for how long, when to resynchronise) are the protocol's
(:mod:`gaslocd.protocol.policy`); this module does the waiting and the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import statistics
from collections.abc import AsyncGenerator, Awaitable

import grpc

from gaslocd import __version__
from gaslocd.algorithm.robust import distance, norm_of
from gaslocd.daemon.prefetch import RosterPrefetch
from gaslocd.daemon.runtime import Runtime
from gaslocd.net.discovery import DiscoveryError
from gaslocd.net.state import PeerState, state_nbytes, state_read_s
from gaslocd.net.tasks import cancelled
from gaslocd.protocol.plan import STATE_FETCH
from gaslocd.protocol.policy import (
    CATCH_UP_ROUNDS,
    resync_sources,
    state_refusal,
    states_agree,
)
from gaslocd.protocol.records import PeerRecord

log = logging.getLogger(__name__)

RESYNC_ROUNDS = 5  # a resumed checkpoint further behind the network takes the network's θ
READY_TIMEOUT_S = 5.0  # a Ready notice is tiny; a partner that does not take it is gone
READY_POLL_S = 0.25  # behind NAT: how often our Ready asks whether the partner finished
RESUME_LOOKAROUND_S = 10.0  # how long a resumed daemon looks for peers before going alone
STATE_FETCH_TIMEOUT_S = 120.0
POLL_S = 0.25  # DHT polling interval; every poll loop is bounded by a deadline
# Joins and resyncs take θ and m in fp16: half the bytes, so over a slow link a state
# half as many rounds stale on arrival (gaslocd.net.state).
STATE_CODEC = "fp16"
MAX_STATE_SOURCES = 3  # states fetched at most for one join or resync (two, and a tie-break)


class StartupError(RuntimeError):
    """The daemon could not start; the message is for the user (exit status 3)."""


class StateBusy(StartupError):
    """Every peer asked for its state was at its limit of concurrent state fetches, or
    the states fetched disagreed: both may pass (honest replicas early in a run can be
    near the norm bound apart, and mix closer every round), so the fetch is tried again."""


STATE_BUSY_RETRIES = 5


class Membership:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.prefetch = RosterPrefetch(
            self._read_roster, rt.clock, rt.cfg.heartbeat_s, rt.spawn, self._quick_roster
        )
        rt.telemetry.metrics.roster_reads = self.prefetch.counts
        rt.telemetry.metrics.dht_stats = lambda: rt.discovery.stats
        self.published_at = self.announced_at = -math.inf  # last publish, round start

    # -- the roster ----------------------------------------------------------------------

    def _read_roster(self) -> Awaitable[list[PeerRecord]]:
        """This model's fresh records from the DHT (raises :class:`DiscoveryError`): our
        node's copy while the last full read vouches for it (gaslocd.net.roster_read)."""
        return self.rt.discovery.roster(self.rt.state.fingerprint, quick=None)

    def _quick_roster(self) -> Awaitable[list[PeerRecord]] | None:
        """Our DHT node's records merged with the last full read's, once there was one
        (:mod:`gaslocd.net.roster_read`); None before."""
        discovery = self.rt.discovery
        return discovery.roster(self.rt.state.fingerprint, quick=True) if discovery.quick else None

    async def roster(self) -> list[PeerRecord]:
        """This model's fresh records; empty (train alone this round) if the DHT fails."""
        return await self._or_alone(self._read_roster())

    async def round_roster(self) -> list[PeerRecord]:
        """The roster a round starts from: read during the last round's steps when that
        read is still fresh (:mod:`gaslocd.daemon.prefetch`), else now."""
        return await self._or_alone(self.prefetch.get())

    @staticmethod
    async def _or_alone(read: Awaitable[list[PeerRecord]]) -> list[PeerRecord]:
        try:
            return await read
        except DiscoveryError as exc:
            log.warning("roster unavailable this round, training alone: %s", exc)
            return []

    async def others(self) -> list[PeerRecord]:
        records = await self._read_roster()
        return [r for r in records if r.peer_id != self.rt.me]

    def record(self) -> PeerRecord:
        rt = self.rt
        record = PeerRecord(
            peer_id=rt.me,
            address=rt.address,
            fingerprint=rt.state.fingerprint,
            round=rt.state.round,
            inner_steps=rt.telemetry.runlog.last_inner_steps or rt.algo.inner_steps,
            step_time_s=float(rt.links.step_time_s or 0.0),
            bandwidth_bytes_per_s=float(rt.links.own_bandwidth()),
            version=__version__,
            started_at=rt.telemetry.runlog.started_at,
            active_from=rt.active_from,
            reachable=rt.reachable,
        )
        return rt.sit.on(record)

    async def publish(self, announce: bool = False) -> None:
        self.published_at = self.rt.clock()  # the heartbeat's refresh counts from here
        if announce:
            self.announced_at = self.published_at
        try:
            await self.rt.discovery.publish(self.record())
        except DiscoveryError as exc:
            log.warning("publishing our record failed (retrying at the next heartbeat): %s", exc)

    async def redial(self) -> None:
        """Alone in the roster: maybe a cut emptied our DHT routing table; dial who we knew."""
        if not self.rt.discovery.alone:
            return
        answered = await self.rt.discovery.redial()
        if answered:
            log.info("found the run again: %d known peer(s) answered on the DHT", answered)

    async def heartbeat(self) -> None:
        """Redial when alone; publish once our record is ``SitOut.refresh_s`` old."""
        rt, beat = self.rt, self.rt.cfg.heartbeat_s
        redial_at = rt.clock() + beat
        while not cancelled():  # a cancel a DHT call swallowed (gaslocd/net/tasks.py) ends it
            ago = rt.clock() - self.announced_at
            every = rt.sit.refresh_s(rt.state.round, beat, rt.cfg.record_ttl_s, ago)
            await asyncio.sleep(min(beat, max(0.01, self.published_at + every - rt.clock())))
            try:
                if rt.clock() >= redial_at:
                    redial_at = rt.clock() + beat
                    await self.redial()
                if rt.clock() - self.published_at >= every:
                    await self.publish()
                with contextlib.suppress(DiscoveryError):  # the metric waits a heartbeat
                    await rt.discovery.count_rpcs()
            except Exception:  # a heartbeat that dies silently would drop us from rosters
                log.exception("heartbeat failed; retrying at the next one")

    async def pace(self, t: int, records: list[PeerRecord]) -> list[PeerRecord]:
        """Wait (bounded) while the protocol says an active peer is too far behind ``t``."""
        rt = self.rt
        until = rt.policy.pace_until(rt.clock(), rt.cfg.exchange_deadline_s)
        while not rt.stopping and rt.clock() < until and rt.policy.behind(t, records):
            await asyncio.sleep(0.1)  # polling the DHT, bounded by `until`
            with contextlib.suppress(DiscoveryError):
                records = await self._read_roster()
                rt.policy.observe_roster(rt.clock(), records)  # stale peers stop counting
        return records

    async def notify_ready(
        self, address: str, round_: int, ask: str | None = None, until: float = 0.0
    ) -> None:
        """Tell a partner we finished our local steps of ``round_``. ``ask``: its peer id
        when we are behind NAT, so that it cannot tell us the same by a call: we ask again
        every :data:`READY_POLL_S` until its reply says it finished too (then its Ready
        is noted as if it had called), or until ``until`` (our fill's end)."""
        rt = self.rt
        while True:
            try:
                ready = await rt.server.client.notify_ready(address, round_, READY_TIMEOUT_S)
            except Exception as exc:  # the exchange itself reports an unreachable partner
                log.debug("round %d: Ready notice to %s failed: %s", round_, address, exc)
                ready = False
            if ask is not None and ready:
                rt.server.ready.note(round_, ask)
            if ask is None or ready or rt.clock() + READY_POLL_S >= until:
                return
            await asyncio.sleep(READY_POLL_S)  # a poll's pause; `until` bounds the polling

    # -- joining -------------------------------------------------------------------------

    async def join_network(self) -> int | None:
        """Find live peers; a newcomer takes the most advanced one's state (GetState).

        A resumed daemon keeps its own θ unless its checkpoint is more than
        ``RESYNC_ROUNDS`` behind the network: then its θ is far from everyone's (peers
        would refuse it by the norm bound for good), and the network's θ, which already
        holds what this peer contributed before it stopped, is the better start. Its
        AdamW state and data position still come from the checkpoint.
        """
        rt, cfg = self.rt, self.rt.cfg
        wait_s = min(cfg.min_peers_timeout_s, RESUME_LOOKAROUND_S) if cfg.resume else None
        wait_s = wait_s or cfg.min_peers_timeout_s
        deadline = rt.clock() + wait_s
        others: list[PeerRecord] = []
        while not others:
            if rt.stopping or rt.clock() > deadline:
                if cfg.resume:
                    return None  # resume alone
                raise StartupError(
                    f"no peer of run {cfg.run_id!r} with this model answered within "
                    f"{wait_s:g} s (check --bootstrap, --run-id and --model)"
                )
            with contextlib.suppress(DiscoveryError):
                others = await self.others()
            if not others:
                await asyncio.sleep(POLL_S)
        # Where the network is: the median, not the highest claim (docs/design.md §3).
        network_round = statistics.median_low(r.round for r in others)
        if cfg.resume:
            lag = network_round - rt.state.round
            if lag <= RESYNC_ROUNDS:
                rt.state.round = max(rt.state.round, network_round)
                return network_round
            rt.progress(
                f"checkpoint is {lag} rounds behind the network: taking its θ and outer "
                "momentum (AdamW state and data position kept from the checkpoint)"
            )
        return await self.fetch_state(others)

    async def lobby(self) -> None:
        """Wait until ``min_peers`` peers (self included) are in the roster of the next round."""
        rt, cfg = self.rt, self.rt.cfg
        deadline = rt.clock() + cfg.min_peers_timeout_s
        while not rt.stopping:
            with contextlib.suppress(DiscoveryError):
                records = await self._read_roster()
                if len([r for r in records if r.active_from <= rt.state.round]) >= cfg.min_peers:
                    return
            if rt.clock() > deadline:
                raise StartupError(
                    f"fewer than {cfg.min_peers} peers joined within {cfg.min_peers_timeout_s:g} s"
                )
            await asyncio.sleep(POLL_S)

    async def fetch_state(self, others: list[PeerRecord]) -> int:
        """Take θ, m and the round from a typical peer (:func:`resync_sources`), once its
        state is in range and, when another peer can be asked, agrees with that one's.

        The cross-check is a second full state, asked for with the first (at 551M
        parameters 2.2 GB more in fp16, and as much memory), compared by ‖θ_a − θ_b‖
        against the norm bound: a join or resync is rare, and a digest would need the
        other peer to compute it on a state we have not seen. When the first two
        disagree a third decides; states that all disagree are all refused, and asked
        for again a few times (they may have mixed closer since), then the start fails.
        """
        for attempt in range(STATE_BUSY_RETRIES):
            try:
                return await self._fetch_state_once(others)
            except StateBusy as exc:
                # Newcomers starting together (a compose fleet) queue at a peer's
                # GetState limit: wait a little, not fail the start. Not when asked to
                # stop: each try can take minutes (a daemon kept fetching past its exit).
                if self.rt.stopping:
                    raise
                log.warning("fetching the run's state again: %s", exc)
                await asyncio.sleep(random.uniform(1.0, 2.0) * (attempt + 1))
        return await self._fetch_state_once(others)

    async def _fetch_state_once(self, others: list[PeerRecord]) -> int:
        rt = self.rt
        errors: list[str] = []
        sources = resync_sources(others, rt.me)
        held: list[tuple[PeerRecord, PeerState]] = []
        fetched = self._states(sources[:MAX_STATE_SOURCES], errors)
        async with contextlib.aclosing(fetched):
            async for record, state in fetched:
                if state is None:
                    continue
                agreed = await self._agreeing(held, state)
                if agreed is None and len(sources) == 1:
                    agreed = record, state  # nobody to compare with
                if agreed is not None:
                    return await self._adopt(*agreed)
                held.append((record, state))
        if len(held) == 1:  # the others did not answer: nothing to compare with
            log.warning("state of %s could not be cross-checked", held[0][0].address)
            return await self._adopt(*held[0])
        if held:
            errors.append("the states fetched disagree (‖θ_a − θ_b‖ over the norm bound)")
        text = "could not fetch the run's state from any peer: " + "; ".join(errors)
        if held or any("RESOURCE_EXHAUSTED" in e for e in errors):
            raise StateBusy(text)
        raise StartupError(text)

    async def _states(
        self, sources: list[PeerRecord], errors: list[str]
    ) -> AsyncGenerator[tuple[PeerRecord, PeerState | None], None]:
        """The states of ``sources``, the first two fetched at once, the rest one by one.

        Two states asked for one after the other are a whole transfer apart: over a slow
        link, in a run that moves fast (early training), honest peers' states then lie
        farther apart than the norm bound and a resync never agreed (seen: a 1 Mbit/s
        straggler locked out for good). Asked for together, they are the same moment's.
        """
        head, measured = sources[:2], list[tuple[float, int]]()
        tasks = [
            asyncio.ensure_future(self._fetch_checked(r, errors, measured, len(head))) for r in head
        ]
        try:
            states = await asyncio.gather(*tasks)
        except BaseException:  # one raised (a refused token) or we were cancelled
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # stopped, not abandoned
            raise
        if measured:  # they shared our link: its rate is their bytes over the longest
            seconds = max(t for t, _ in measured)
            self.rt.links.record_transfer(STATE_FETCH, seconds, sum(n for _, n in measured))
        for pair in zip(head, states, strict=True):
            yield pair
        for record in sources[2:]:
            yield record, await self._fetch_checked(record, errors)

    async def _fetch_checked(
        self,
        record: PeerRecord,
        errors: list[str],
        measured: list[tuple[float, int]] | None = None,
        sharing: int = 1,
    ) -> PeerState | None:
        """``record``'s state if it arrives and is in range (None, with the reason in
        ``errors``, if not); a peer refusing our token is a startup error. ``measured``:
        where the transfer's (seconds, bytes) go when ``sharing`` fetches share our
        link (else they are our link's measure at once)."""
        rt = self.rt
        expected = {"theta": rt.state.numel, "outer_momentum": rt.state.numel}
        most = state_nbytes(expected.values())  # fp32: a server may always answer in it
        began = rt.clock()
        try:
            state = await rt.server.client.fetch_state(
                record.address,
                expected,
                state_read_s(most, STATE_FETCH_TIMEOUT_S, sharing),
                peer=record.peer_id,
                codec=STATE_CODEC,
                streams=sharing,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise StartupError(
                    f"peer {record.address} refused our join token: {exc.details()}"
                ) from exc
            errors.append(f"{record.address}: {exc.code().name} {exc.details()}")
            return None
        except Exception as exc:  # a refused or malformed state: try another peer
            errors.append(f"{record.address}: {exc}")
            return None
        # The first measure of our link (two models): a newcomer's first codec per link
        # is then sized to it, not guessed (gaslocd.protocol.plan.plan_links).
        nbytes = state_nbytes(expected.values(), state.codec)
        if measured is None:
            rt.links.record_transfer(STATE_FETCH, rt.clock() - began, nbytes)
        else:
            measured.append((rt.clock() - began, nbytes))
        theta, momentum = state.tensors["theta"], state.tensors["outer_momentum"]
        norms = await rt.thread.call(lambda: (norm_of(theta), norm_of(momentum)))
        refusal = state_refusal(record, state.round, *norms)
        if refusal is not None:
            errors.append(f"{record.address}: state-range: {refusal}")
            return None
        return state

    async def _agreeing(
        self, held: list[tuple[PeerRecord, PeerState]], state: PeerState
    ) -> tuple[PeerRecord, PeerState] | None:
        """The first held state that agrees with ``state`` (it was the more typical), by
        the norm bound on the smaller of the two norms: the test is symmetric, and a
        scaled-up θ cannot vouch for an honest one or the reverse."""
        bound = self.rt.wire.norm_bound
        for record, other in held:
            a, b = state.tensors["theta"], other.tensors["theta"]
            gap, norm = await self.rt.thread.call(
                lambda a=a, b=b: (distance(a, b), min(norm_of(a), norm_of(b)))
            )
            if states_agree(gap, norm, bound):
                return record, other
        return None

    async def _adopt(self, record: PeerRecord, state: PeerState) -> int:
        """Take the state; and its round when we ran ahead of the run (alone while cut
        off): the typical peer's round is the run's, and ours names pairings nobody else
        draws. Round numbers only name pairings, so stepping back loses no training."""
        rt = self.rt
        round_ = max(state.round, rt.state.round)
        if rt.state.round >= state.round + CATCH_UP_ROUNDS:
            rt.server.rewind()
            round_ = state.round
            rt.progress(f"rejoining the run at round {round_} (we were at {rt.state.round})")
        await rt.thread.call(
            rt.state.adopt, round_, state.tensors["theta"], state.tensors["outer_momentum"]
        )
        rt.progress(f"took state of round {state.round} from {record.address}")
        return state.round

    async def resync(self, records: list[PeerRecord]) -> None:
        """Take a live peer's state after rounds with partners and no exchange, keeping
        our AdamW state and data position: how a peer comes back after a partition (once
        its θ is further from its partners' than their norm bound, gossip cannot)."""
        others = resync_sources(records, self.rt.me)
        if not others or self.rt.stopping:  # leaving: keep our θ for the checkpoint
            return
        try:
            round_ = await self.fetch_state(others)
        except StartupError as exc:  # nobody answered: keep training, try again later
            log.warning("could not resynchronize: %s", exc)
            return
        self.rt.telemetry.count_failure("resync")
        log.warning("no exchange succeeded for several rounds: took the state of round %d", round_)
