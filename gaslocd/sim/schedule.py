"""The daemon's round for N simulated peers: the protocol decides, the clock keeps time.

Each simulated peer has what a daemon has (:mod:`gaslocd.daemon.runtime`): its own
:class:`~gaslocd.protocol.plan.LinkEstimates` and
:class:`~gaslocd.protocol.policy.RoundPolicy`, and a
:class:`~gaslocd.protocol.records.PeerRecord` it publishes at the end of each round.
Every decision of a round (roster → partners → H → deadline, filling the wait, which
exchanges count, the row of W, resync, a solo round's length) is the protocol's, called
with the simulated clock's ``now``; this module supplies the times.

None of it depends on the models: H comes from measured step times and transfers, the
fill from Ready notices, failures from deadlines and faults. So a round is three calls,
:meth:`Schedule.begin` (plan, compute, fill), :meth:`Schedule.exchange` (edges or the
all-reduce on the clock) and :meth:`Schedule.settle` (what counted, W, resync, pauses,
records); the runner trains and mixes in between, a replay does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gaslocd import __version__
from gaslocd.config import CODECS, AlgoConfig, DaemonConfig, SimConfig
from gaslocd.protocol.linkcodec import codec_ladder
from gaslocd.protocol.linkcodec import message_bytes as codec_bytes
from gaslocd.protocol.plan import LinkEstimates, RoundSetup, plan_this_round
from gaslocd.protocol.policy import RoundPolicy, counted_exchanges, mixing_row, resync_sources
from gaslocd.protocol.records import PeerRecord
from gaslocd.protocol.sitout import SitOut
from gaslocd.sim.clock import (
    DEADLINE,
    FAULT,
    EdgeTiming,
    SimClock,
    fill_steps,
    split_exchange_phase,
    time_edge,
)
from gaslocd.sim.state import (
    ExchangeOk,
    LongEdge,
    RoundState,
    SimPeer,
    network_model,
    round_digest,
    seed_as_newcomers,
    worker_roster,
)

__all__ = ["ExchangeOk", "RoundState", "Schedule", "round_digest", "worker_roster"]


class Schedule:
    """N peers' rounds on one simulated clock, decided by :mod:`gaslocd.protocol`."""

    def __init__(
        self,
        algo: AlgoConfig,
        sim: SimConfig,
        run_id: str,
        message_bytes: int,
        step_times_s: Sequence[float],
        fingerprint: str,
    ) -> None:
        self.algo, self.run_id, self.message_bytes = algo, run_id, message_bytes
        self.codec = sim.codec
        # The model's size, for the other codecs' message sizes (from the sim's own).
        self.numel = message_bytes * 1_000_000 // codec_bytes(sim.codec, 1_000_000)
        self.net = network_model(sim, message_bytes)
        self.clock = SimClock(sim.workers)
        ttl = DaemonConfig().record_ttl_s
        ids = worker_roster(sim.workers)
        self.peers = [
            SimPeer(p, s, LinkEstimates(), RoundPolicy(p, ttl, algo.h_upper))
            for p, s in zip(ids, step_times_s, strict=True)
        ]
        self.index = {p: k for k, p in enumerate(ids)}
        if algo.adapt_codec:  # peers start as newcomers to a running run do (see _seed)
            seed_as_newcomers(self.peers, self.net, 2 * message_bytes)
        self.fingerprint = fingerprint
        self.sit = [SitOut()] * sim.workers  # each peer's sit-out schedule
        self.unreachable = sim.unreachable
        self.records = [self._record(k, 0, algo.inner_steps) for k in range(sim.workers)]
        self.allreduce = algo.topology == "complete"  # DiLoCo: how anyone runs J/n
        self.fills = algo.adapt_h and algo.algo != "diloco" and not self.allreduce
        self.overlap = algo.overlap and not self.allreduce
        gossip_adapts = algo.adapt_codec and not self.allreduce
        self.ladder = codec_ladder(sim.codec, CODECS) if gossip_adapts else ()
        self.long_edges: list[LongEdge] = []  # long exchanges not yet mixed by both ends
        self._older_ends = [0.0] * sim.workers  # when each peer ended round t−2
        self.pace_timeouts = 0
        # Overlap: the round still on the wire, and each peer's own traffic time in it.
        self.in_flight: tuple[RoundState, list[float]] | None = None

    def _record(
        self, k: int, round_: int, inner_steps: int, setup: RoundSetup | None = None
    ) -> PeerRecord:
        """What peer k publishes (as a daemon's ``Membership.record``)."""
        peer = self.peers[k]
        if setup is not None:  # a slow link: paired every k rounds (protocol.sitout)
            self.sit[k] = self.sit[k].after(setup.round, setup.sit_every)
        record = PeerRecord(
            peer_id=peer.peer_id,
            address=f"{peer.peer_id}:1",
            fingerprint=self.fingerprint,
            round=round_,
            inner_steps=max(1, inner_steps),
            step_time_s=float(peer.links.step_time_s or 0.0),
            bandwidth_bytes_per_s=float(peer.links.own_bandwidth()),
            version=__version__,
            reachable=k >= self.unreachable,
        )
        return self.sit[k].on(record)

    # -- phase 1: plan, train, fill ---------------------------------------------------------

    def _view(self, t: int, now: float) -> list[PeerRecord]:
        """The roster as a DHT shows it at ``now``: the records published at the end of
        round t−1, each with the round its peer had reached by ``now``."""
        ends, older = self.clock.now_s, self._older_ends
        return [
            replace(r, round=t if ends[k] <= now else t - 1 if older[k] <= now else max(0, t - 2))
            for k, r in enumerate(self.records)
        ]

    def _start(self, k: int, t: int) -> tuple[float, RoundSetup]:
        """Peer k's start of round t, as ``driver.run_round``: roster, catch-up, pacing, plan.

        Pacing is the protocol's: while an active peer is more than a round behind (it
        has not ended round t−2), wait for it, at most ``pace_until``. Catch-up cannot fire
        here: rounds are simulated in lockstep, so no view shows a peer past round t, and
        pacing keeps the others from getting two rounds ahead of anyone, unless a pace
        wait times out (counted in ``pace_timeouts``; the daemon would then run ahead).
        """
        peer, now = self.peers[k], self.clock.now_s[k]
        view = self._view(t, now)
        peer.policy.observe_roster(now, view)
        if peer.policy.catch_up(t, view) != t:
            raise RuntimeError(f"round {t}: {peer.peer_id} would catch up in lockstep")
        start = now
        behind = peer.policy.behind(t, view)
        if behind:
            until = peer.policy.pace_until(now, None)
            start = max(self._older_ends[self.index[r.peer_id]] for r in behind)
            if start > until:
                self.pace_timeouts += 1
                start = until
            view = self._view(t, start)
        setup = plan_this_round(
            self.algo,
            self.run_id,
            peer.peer_id,
            t,
            view,
            peer.links,
            self.message_bytes,
            None,
            ladder=self.ladder,
            numel=self.numel,
        )
        return start, setup

    def begin(self, t: int) -> RoundState:
        """Start round ``t`` on every peer (pace, plan), and time its steps and filled wait."""
        records = list(self.records)
        arrived = list(self.clock.now_s)
        started = [self._start(k, t) for k in range(len(self.peers))]
        start = [s for s, _ in started]
        setups = [setup for _, setup in started]
        paired = [s for s in setups if s.plan is not None]  # the others sit out
        if not paired or any(
            s.plan != paired[0].plan or s.digest != paired[0].digest for s in paired
        ):
            raise RuntimeError(f"round {t}: peers planned different pairings")
        planned = [s.inner_steps for s in setups]
        ready = [s + h * p.step_time_s for s, h, p in zip(start, planned, self.peers, strict=True)]
        for peer in self.peers:
            peer.links.record_step_time(peer.step_time_s)
        filled = [self._fill(k, setups[k], ready) for k in range(len(self.peers))]
        opened = [ready[k] + filled[k] * p.step_time_s for k, p in enumerate(self.peers)]
        if self.in_flight is not None:  # the previous round's exchange must end first
            prev = self.in_flight[0].exchange_end_s
            opened = [max(o, end) for o, end in zip(opened, prev, strict=True)]
        state = RoundState(t, setups, records, arrived, start, planned, filled, opened)
        state.ids = tuple(p.peer_id for p in self.peers)
        state.paced = [
            p.policy.paced_steps(s - a, p.step_time_s) if self.overlap and self.fills else 0
            for p, s, a in zip(self.peers, start, arrived, strict=True)
        ]
        state.group = () if self.allreduce else None  # the runner offers Δ, not θ̃
        return state

    def _fill(self, k: int, setup: RoundSetup, ready: list[float]) -> int:
        """Steps peer k trains after its planned H until its partners said Ready (or,
        overlapped, until the previous round's exchange is off the wire)."""
        if not self.fills:
            return 0
        peer = self.peers[k]
        if self.overlap:
            if self.in_flight is None:
                return 0
            prev = self.in_flight[0]
            end, until = prev.exchange_end_s[k], prev.opened_s[k] + prev.setups[k].deadline_s
            fill = peer.policy.fill_overlap(end > ready[k], setup.inner_steps, until)
            return fill_steps(fill, ready[k], peer.step_time_s, [end])
        if not setup.partners:
            return 0
        fill = peer.policy.fill_wait(setup, setup.inner_steps, ready[k])
        notices = [ready[self.index[p]] + self.net.latency_s for p in setup.partners]
        return fill_steps(fill, ready[k], peer.step_time_s, notices)

    # -- phase 2: the exchange ---------------------------------------------------------------

    def exchange(self, state: RoundState, exchange_ok: ExchangeOk) -> None:
        """Time the round's exchanges (or its all-reduce); ``exchange_ok`` breaks edges."""
        if self.allreduce:
            self._allreduce(state, exchange_ok)
            return
        plan = state.plan
        ends = list(state.opened_s)
        for a, b in plan.edges():
            i, j = self.index[a], self.index[b]
            si, sj = state.setups[i], state.setups[j]
            nbytes = max(self.edge_bytes(si, b), self.edge_bytes(sj, a))
            transfer = self.net.edge_transfer_s(i, j, plan.degree(a), plan.degree(b), nbytes)
            opened = (state.opened_s[i], state.opened_s[j])
            deadlines = (si.deadline_s, sj.deadline_s)
            long = b in si.long or a in sj.long
            if long:  # it may take the rounds it needs: nobody waits for it
                deadlines = (si.long_deadline_s(b), sj.long_deadline_s(a))
            edge = time_edge(i, j, opened, deadlines, transfer)
            if edge.moved and not exchange_ok(state.round, a, b):
                edge = time_edge(i, j, opened, deadlines, transfer, broken=True)
            if long:
                weight = plan.mixing_weights(a)[b]
                end = max(edge.end_a_s, edge.end_b_s)
                state.long_edges.append(LongEdge(state.round, i, j, weight, end, edge.moved))
                if edge.moved:
                    for k, q in ((i, b), (j, a)):
                        self.peers[k].links.record_transfer(q, edge.transfer_s, nbytes)
                continue
            state.edges.append(edge)
            ends[i], ends[j] = max(ends[i], edge.end_a_s), max(ends[j], edge.end_b_s)
            if not edge.moved:
                state.failures[edge.outcome] = state.failures.get(edge.outcome, 0) + 1
        state.exchange_end_s = ends

    def edge_bytes(self, setup: RoundSetup, partner: str) -> int:
        """The bytes of the message a peer sends ``partner`` in its codec for that link."""
        codec = setup.codecs.get(partner, self.codec)
        return self.message_bytes if codec == self.codec else codec_bytes(codec, self.numel)

    def long_due(self, k: int, now: float) -> list[LongEdge]:
        """Long exchanges peer k mixes now (ended by ``now``, not yet mixed by it)."""
        due = [
            e for e in self.long_edges if k in (e.a, e.b) and k not in e.landed and e.end_s <= now
        ]
        for e in due:
            e.landed.add(k)
        self.long_edges = [e for e in self.long_edges if len(e.landed) < 2]
        return due

    def _allreduce(self, state: RoundState, exchange_ok: ExchangeOk) -> None:
        """A barrier: the members start together when the last is ready. A peer with a
        broken edge is out of this round's group and steps on its own pseudo-gradient."""
        ids = state.roster
        out: set[int] = set()
        for a, b in state.planned_edges():
            if not exchange_ok(state.round, a, b):
                out |= {self.index[a], self.index[b]}
                state.failures[FAULT] = state.failures.get(FAULT, 0) + 1
        members = tuple(k for k in range(len(ids)) if k not in out)
        group = members if len(members) > 1 else ()
        state.group = group
        ends = list(state.opened_s)
        if group:
            end = max(state.opened_s[k] for k in group) + self.net.allreduce_s(group)
            for k in group:
                ends[k] = end
        state.exchange_end_s = ends

    # -- phase 3: what counted, W, resync, pauses, records ---------------------------------

    def settle(self, state: RoundState) -> None:
        """Close round ``state.round`` on every peer. ``state.refused`` holds the θ̃ the
        runner found beyond the wire's norm bound (a replay has none)."""
        traffic = self._count(state)
        t = state.round
        self._older_ends = list(self.clock.now_s)
        for k, peer in enumerate(self.peers):
            setup, me = state.setups[k], peer.peer_id
            fetch = 0.0
            if peer.policy.should_resync(setup, len(state.counted[k])):
                sources = resync_sources(state.records, me)
                if sources:
                    source = self.index[sources[0].peer_id]
                    state.resyncs.append((k, source))
                    fetch = self.net.state_fetch_s(k, source)
            if self.overlap:  # the exchange goes on during the next round
                end = state.opened_s[k]
                trained = state.planned[k] + state.filled[k]
                parts = self._in_flight_wait(k, state.start_s[k] + trained * peer.step_time_s, end)
            else:
                end = state.exchange_end_s[k]
                phase = end - state.opened_s[k]
                parts = split_exchange_phase(phase, self._waited(state, k), traffic[k])
            done = end + fetch
            pause = peer.policy.solo_wait_s(setup, done - state.start_s[k], done)
            paced, s = state.paced[k], peer.step_time_s
            self.clock.finish_round(
                k,
                {
                    "train": state.planned[k] * peer.step_time_s,
                    "fill": (state.filled[k] + paced) * peer.step_time_s,
                    **parts,
                    # pacing (less its steps), a solo round's pause, a resync's fetch
                    "roster": state.start_s[k] - state.arrived_s[k] - paced * s + pause + fetch,
                },
            )
        self.records = [
            self._record(
                k, t + 1, state.planned[k] + state.filled[k] + state.paced[k], state.setups[k]
            )
            for k in range(len(self.peers))
        ]
        if self.overlap:
            self.in_flight = (state, traffic)
            self.long_edges += state.long_edges

    def _in_flight_wait(self, k: int, since: float, until: float) -> dict[str, float]:
        """Overlap: peer k's wait from ``since`` (its steps done) to ``until`` for the
        previous round's exchange, booked as the exchange phase is without overlap."""
        if self.in_flight is None or until <= since:
            return split_exchange_phase(0.0, 0.0, 0.0)
        prev, traffic = self.in_flight
        partners_there = prev.opened_s[k] + self._waited(prev, k)
        own_end = partners_there + traffic[k]
        return split_exchange_phase(
            until - since, partners_there - since, own_end - max(since, partners_there)
        )

    def drain(self) -> None:
        """Overlap, at the end of a run: every peer waits for its last exchange (the
        model is not final before its outer step), on the clock like any wait."""
        if self.in_flight is None:
            return
        for k, end in enumerate(self.in_flight[0].exchange_end_s):
            now = self.clock.now_s[k]
            self.clock.finish_round(k, self._in_flight_wait(k, now, max(now, end)))
        self.in_flight = None

    @staticmethod
    def _waited(state: RoundState, k: int) -> float:
        """How long peer k's exchange phase waited for partners: until the last partner
        opened, or until a failed exchange gave up; an all-reduce, until the last member
        was ready."""
        opened = state.opened_s[k]
        if state.group is not None:
            group = state.group
            return max(state.opened_s[j] for j in group) - opened if k in group else 0.0
        waits = [
            (e.start_s if e.moved else e.end_for(k)) - opened
            for e in state.edges
            if k in (e.a, e.b)
        ]
        return max(waits, default=0.0)

    def _count(self, state: RoundState) -> list[float]:
        """Which exchanges count and each peer's row of W; returns each peer's own-traffic
        time. Measured transfers feed the peers' link estimates, as in the daemon."""
        if state.group is not None:
            return self._count_allreduce(state, state.group)
        n = len(self.peers)
        ids = state.roster
        received: list[set[str]] = [set() for _ in range(n)]
        refused_ours: list[set[str]] = [set() for _ in range(n)]
        moved = [0] * n
        for e in (e for e in state.edges if e.moved):
            moved[e.a] += 1
            moved[e.b] += 1
            for me, other in ((e.a, e.b), (e.b, e.a)):
                if (me, other) not in state.refused:
                    received[me].add(ids[other])
                if (other, me) in state.refused:
                    refused_ours[me].add(ids[other])
        one_sided = sum(1 for e in state.edges if e.moved and self._refused(state, e))
        if one_sided:
            state.failures["refused"] = one_sided
        for e in (e for e in state.edges if e.outcome == DEADLINE):  # as the daemon does
            for me, other in ((e.a, e.b), (e.b, e.a)):
                nbytes = self.edge_bytes(state.setups[me], ids[other])
                self.peers[me].links.record_transfer(ids[other], e.end_for(me) - e.start_s, nbytes)
        transfer = {(e.a, e.b): e.transfer_s for e in state.edges}
        for k, peer in enumerate(self.peers):
            counted = counted_exchanges(received[k], refused_ours[k])
            state.counted.append(counted)
            state.rows.append(mixing_row(state.setups[k], peer.peer_id, counted))
            for q in sorted(counted):
                j = self.index[q]
                seconds = transfer[(min(k, j), max(k, j))]
                peer.links.record_transfer(q, seconds, self.edge_bytes(state.setups[j], ids[k]))
        return [self.net.own_transfer_s(k, moved[k]) for k in range(n)]

    def _count_allreduce(self, state: RoundState, group: tuple[int, ...]) -> list[float]:
        """The group's members mix Δ with weight 1/|group| each; the others alone."""
        ids = state.roster
        share = 1.0 / len(group) if group else 1.0
        traffic = []
        for k in range(len(self.peers)):
            member = k in group
            state.counted.append({ids[j] for j in group if j != k} if member else set())
            state.rows.append({ids[j]: share for j in group} if member else {ids[k]: 1.0})
            traffic.append(self.net.own_allreduce_s(k, len(group)) if member else 0.0)
        return traffic

    @staticmethod
    def _refused(state: RoundState, e: EdgeTiming) -> bool:
        return (e.a, e.b) in state.refused or (e.b, e.a) in state.refused
