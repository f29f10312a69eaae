"""N workers in one process: the daemon's round over an in-memory wire and a simulated clock.

Each worker is a :class:`~gaslocd.train.worker.Worker`, the class a daemon trains with,
and each round is decided by the daemon's protocol (:mod:`gaslocd.sim.schedule` calls
:mod:`gaslocd.protocol` with the simulated ``now``): H from measured step times and
links, filling the wait, exchange deadlines, the one-sided discard, resync, solo rounds.
The network is :class:`~gaslocd.net.memory.InMemoryTransport` (the codec's encoding and
error feedback, edge faults). So a ``gaslocd simulate`` result measures the protocol a
daemon runs, and a run is reproducible from its seed and run id.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch

from gaslocd.algorithm.outer import consensus_distance
from gaslocd.config import AlgoConfig, SimConfig, TrainConfig, WireConfig
from gaslocd.net.memory import EdgeFault, InMemoryTransport
from gaslocd.sim.clock import SimClock, landing_step
from gaslocd.sim.schedule import RoundState, Schedule, network_model, worker_roster
from gaslocd.train.data import Corpus, held_out_batches, load_corpus
from gaslocd.train.device import on_host
from gaslocd.train.worker import Worker

log = logging.getLogger(__name__)

__all__ = ["RoundRecord", "SimResult", "Simulation", "worker_roster"]


@dataclass(frozen=True)
class RoundRecord:
    """What one round did; the CLI prints it, the summary collects it."""

    round: int  # 1-based, as the daemon's run log; its pairing is plan_round(..., round - 1)
    inner_steps: tuple[int, ...]  # planned H per worker (filled steps not included)
    train_loss: float
    val_loss: float | None
    consensus: float
    wall_clock_s: float
    idle_fraction: float
    exchange_failures: int
    filled_steps: tuple[int, ...] = ()  # steps trained while waiting for partners
    roster: tuple[str, ...] = ()  # sorted: the order of W's rows and columns
    edges: tuple[tuple[str, str], ...] = ()  # the planned exchanges
    mixing_matrix: tuple[tuple[float, ...], ...] = ()  # W as applied
    failure_reasons: dict[str, int] = field(default_factory=dict)
    resyncs: tuple[tuple[str, str], ...] = ()  # (peer, the peer whose state it took)
    digest: str = ""  # gaslocd.sim.schedule.round_digest of this round
    # When the evaluated model exists, if later than the round's end: overlapped, the
    # model evaluated between rounds has the round in flight landed, which needs its
    # exchanges to be over (a time to a loss must not read it earlier).
    val_at_s: float | None = None


@dataclass
class SimResult:
    records: list[RoundRecord] = field(default_factory=list)
    initial_val_loss: float = float("nan")
    bytes_sent_per_worker: list[float] = field(default_factory=list)
    idle_fraction: float = 0.0
    idle_fraction_per_worker: list[float] = field(default_factory=list)
    pace_fraction: float = 0.0  # the ``roster`` share: pacing, solo pauses, resync fetches
    compute_fraction_per_worker: list[float] = field(default_factory=list)  # training share
    time: dict[str, float] = field(default_factory=dict)  # all workers, by activity
    wall_clock_s: float = 0.0
    step_time_s: float = 0.0
    message_bytes: int = 0
    tokens_per_worker: int = 0
    real_elapsed_s: float = 0.0
    run_id: str = ""
    pace_timeouts: int = 0

    @property
    def final_val_loss(self) -> float:
        vals = [r.val_loss for r in self.records if r.val_loss is not None]
        return vals[-1] if vals else self.initial_val_loss


class Simulation:
    """Build once, then :meth:`run`. Construction trains nothing and opens no sockets."""

    def __init__(
        self,
        algo: AlgoConfig,
        train: TrainConfig,
        sim: SimConfig,
        *,
        corpus: Corpus | None = None,
        edge_fails: EdgeFault | None = None,
    ) -> None:
        self.algo = algo.resolved()
        self.train = train
        self.sim = sim
        self.run_id = sim.run_id or f"sim-{train.seed}"
        self.corpus = corpus if corpus is not None else load_corpus(train.data)
        self.roster = worker_roster(sim.workers)
        self.eval_batches = held_out_batches(self.corpus, train)
        # Data streams by index (as the simulator always had); a daemon derives its own
        # from its peer id. Every worker starts from the same θ0.
        self.workers = [
            Worker(train, self.corpus, k, self.eval_batches) for k in range(sim.workers)
        ]
        self.transport = InMemoryTransport(sim.codec, self.workers[0].numel, edge_fails)
        self.message_bytes = sim.message_bytes or self.transport.message_bytes
        self.net = network_model(sim, self.transport.message_bytes)
        self.norm_bound = WireConfig().norm_bound
        self._schedule: Schedule | None = None
        self._held: RoundState | None = None  # overlap: the round on the wire
        # Long exchanges in flight: (round, receiver, sender) -> what the receiver got.
        self._long_messages: dict[tuple[int, int, int], torch.Tensor] = {}
        self.index = {p: k for k, p in enumerate(self.roster)}
        self._bytes_sent = [0.0] * sim.workers

    @property
    def schedule(self) -> Schedule:
        if self._schedule is None:
            raise RuntimeError("the schedule exists once run() knows the step time")
        return self._schedule

    @property
    def clock(self) -> SimClock:
        return self.schedule.clock

    # -- one round ----------------------------------------------------------------------

    def _train(self, state: RoundState) -> list[float]:
        """Every worker's planned and filled steps. Overlapped, the previous round's
        outer step lands between the steps, at the first one after its exchange ended,
        as a daemon lands it (the steps after it train from the corrected point)."""
        losses: list[float] = []
        held = self._held
        for k, w in enumerate(self.workers):
            w.begin_round()
            losses += w.train(state.paced[k])  # held back by pacing, it trained (overlap)
            steps = state.planned[k] + state.filled[k]  # filled: the wait, real steps
            at = steps
            if held is not None:
                step_s = self.schedule.peers[k].step_time_s
                at = landing_step(held.exchange_end_s[k], state.start_s[k], step_s, steps)
            losses += w.train(at)  # a non-finite loss rolls the round back
            if held is not None:
                self._mix_one(held, k)
            losses += w.train(steps - at)
        return losses

    def _post(self, state: RoundState) -> None:
        """What each worker offers: θ̃ for gossip (held aside under overlap), the
        pseudo-gradient Δ = θ − θ̃ for an all-reduce (encoded as the wire would)."""
        for k, w in enumerate(self.workers):
            if self.schedule.overlap:
                offer = w.hold_tilde(self.algo.outer)
            else:
                offer = w.flat.flat if state.group is None else w.theta_start - w.flat.flat
            self.transport.post(state.round, self.roster[k], on_host(offer))

    def _finish(self, state: RoundState) -> None:
        """The round's outer steps and resyncs, once its exchanges are over."""
        self._mix(state)
        self._close(state)

    def _close(self, state: RoundState) -> None:
        """What follows the round's outer steps (overlapped, those landed between the
        next round's steps): resyncs, and the round's messages and bytes."""
        self._resync(state)
        self.transport.end_round(state.round)
        self._count_bytes(state)

    def flush(self) -> None:
        """Overlap: land the last round's outer step (the run's model is final after it)."""
        if self._held is not None:
            self.schedule.drain()
            self._finish(self._held)
            self._held = None

    def _refusals(self, state: RoundState) -> set[tuple[int, int]]:
        """(receiver, sender) pairs where the receiver's wire would refuse the sender's θ̃
        (farther than the norm bound from its own θ̃): the daemon's one-sided discard.
        Overlapped, θ̃ is the held one: the live parameters are the eager point."""
        refused = set()
        for e in (e for e in state.edges if e.moved):
            for me, other in ((e.a, e.b), (e.b, e.a)):
                w = self.workers[me]
                own = on_host(w.flat.flat if w.pending is None else w.pending)
                theirs = self._fetch(state, other, me)
                if float((theirs - own).norm()) > self.norm_bound * float(own.norm()):
                    refused.add((me, other))
        return refused

    def _mix(self, state: RoundState) -> None:
        """The outer step of every worker through the daemon's own Worker methods."""
        t, cfg = state.round, self.algo.outer
        if state.group is not None:
            members = [self.transport.fetch(t, self.roster[k]) for k in state.group]
            average = torch.stack(members).mean(dim=0) if members else None
            for k, w in enumerate(self.workers):
                if average is not None and k in state.group:
                    w.outer_update_from_average(average, cfg)
                else:  # out of the group: its own pseudo-gradient, as the daemon falls back
                    w.outer_update_from_average(w.theta_start - w.flat.flat, cfg)
            return
        for k in range(len(self.workers)):
            self._mix_one(state, k)

    def _mix_one(self, state: RoundState, k: int) -> None:
        """Worker k's gossip outer step of ``state``'s round (the all-reduce mixes all)."""
        peer, row = self.roster[k], state.rows[k]
        received = {q: self._fetch(state, self.index[q], k) for q in row if q != peer}
        self.workers[k].outer_update(row, received, peer, self.algo.outer)

    def _fetch(self, state: RoundState, sender: int, receiver: int) -> torch.Tensor:
        """What ``receiver`` decodes of ``sender``'s θ̃ this round, in that link's codec."""
        codec = state.setups[sender].codecs.get(self.roster[receiver])
        return self.transport.fetch(state.round, self.roster[sender], codec)

    def _keep_long(self, state: RoundState) -> None:
        """A long exchange of this round lands rounds later: both ends keep their own θ̃
        and what they will receive, until then."""
        for e in state.long_edges:
            for me, other in ((e.a, e.b), (e.b, e.a)):
                self.workers[me].keep_for_long(state.round)
                if e.moved:
                    message = self._fetch(state, other, me).clone()
                    self._long_messages[(state.round, me, other)] = message

    def _land_long(self, state: RoundState) -> None:
        """Each worker mixes the long exchanges that ended before it lands this round."""
        for k, w in enumerate(self.workers):
            for e in self.schedule.long_due(k, state.opened_s[k]):
                other = e.b if k == e.a else e.a
                message = self._long_messages.pop((e.round, k, other), None)
                w.apply_pair_mix(e.round, e.weight, message if e.moved else None)

    def _resync(self, state: RoundState) -> None:
        """Peers that failed to exchange for several rounds take a live peer's θ, m and
        round (their AdamW state and data position stay), as ``Membership.resync``."""
        snapshots = {src: self.workers[src].snapshot() for _, src in state.resyncs}
        for k, src in state.resyncs:
            snap, w = snapshots[src], self.workers[k]
            w.adopt(max(snap.round, w.round), snap.theta, snap.momentum)

    def _count_bytes(self, state: RoundState) -> None:
        if state.group is not None:
            for k in state.group:
                self._bytes_sent[k] += self.net.allreduce_bytes(len(state.group))
            return
        ids = state.roster
        ends = [(e.a, e.b) for e in state.edges if e.moved]
        for a, b in ends + [(e.a, e.b) for e in state.long_edges if e.moved]:
            self._bytes_sent[a] += self.schedule.edge_bytes(state.setups[a], ids[b])
            self._bytes_sent[b] += self.schedule.edge_bytes(state.setups[b], ids[a])

    def _round(self, t: int) -> tuple[RoundState, float]:
        schedule = self.schedule
        state = schedule.begin(t)
        losses = self._train(state)
        if self._held is not None:  # overlap: resyncs after the delayed outer step
            self._close(self._held)
        self._land_long(state)
        self._post(state)
        schedule.exchange(state, self.transport.exchange)
        self._keep_long(state)
        if state.group is None:
            state.refused = self._refusals(state)
        schedule.settle(state)
        if schedule.overlap:
            self._held = state
        else:
            self._finish(state)
        if any(w.round != t + 1 for w in self.workers):
            raise RuntimeError(f"round {t}: a worker's round number left the lockstep")
        return state, statistics.fmean(losses)

    def _record(self, state: RoundState, train_loss: float, val: float | None) -> RoundRecord:
        ids = state.roster
        matrix = state.mixing_matrix()
        return RoundRecord(
            round=state.round + 1,
            inner_steps=tuple(state.planned),
            train_loss=train_loss,
            val_loss=val,
            consensus=self.consensus(),
            wall_clock_s=self.clock.wall_clock_s,
            idle_fraction=self.clock.idle_fraction(),
            exchange_failures=sum(state.failures.values()),
            filled_steps=tuple(f + p for f, p in zip(state.filled, state.paced, strict=True)),
            roster=ids,
            edges=tuple(state.planned_edges()),
            mixing_matrix=tuple(tuple(r) for r in matrix),
            failure_reasons=dict(sorted(state.failures.items())),
            resyncs=tuple((ids[k], ids[src]) for k, src in state.resyncs),
            digest=state.digest(),
        )

    # -- the run ------------------------------------------------------------------------

    def evaluate(self) -> float:
        """Mean validation loss of the workers' own models (what each peer would serve).

        Overlapped, between rounds, the models are evaluated with the round in flight
        landed (:meth:`_landed`): the eager point they train on is not a model anyone
        would serve, and reads far from it (better early, worse later), so a time to a
        loss read off it says little. The run itself goes on from the eager point.
        """
        if self._held is None:
            return self._evaluate_live()
        with self._landed(self._held):
            return self._evaluate_live()

    def _evaluate_live(self) -> float:
        """Bit-identical replicas (every worker after a lossless all-reduce, for DiLoCo)
        are evaluated once and counted once each: the same number, up to 1/n of the cost."""
        losses: list[float] = []
        seen: list[tuple[torch.Tensor, float]] = []
        for w in self.workers:
            twin = next((loss for flat, loss in seen if torch.equal(flat, w.flat.flat)), None)
            if twin is None:
                twin = w.evaluate()
                seen.append((w.flat.flat, twin))
            losses.append(twin)
        return statistics.fmean(losses)

    @contextlib.contextmanager
    def _landed(self, state: RoundState) -> Iterator[None]:
        """Every worker with ``state``'s outer step taken, then put back bit for bit: θ,
        m, the held θ̃, the trust radius's memory and the counters it touches."""
        saved = [
            (w.flat.flat.clone(), w.momentum.clone(), w.theta_start, w.pending,
             w.pending_base, copy.deepcopy(w.trust), copy.copy(w.rollbacks), w.round)
            for w in self.workers
        ]  # fmt: skip
        try:
            self._mix(state)
            yield
        finally:
            for w, (flat, momentum, start, pending, base, trust, rollbacks, round_) in zip(
                self.workers, saved, strict=True
            ):
                w.flat.load_(flat)
                w.momentum.copy_(momentum)
                w.theta_start, w.pending, w.pending_base = start, pending, base
                w.trust, w.rollbacks, w.round = trust, rollbacks, round_

    def consensus(self) -> float:
        pairs = zip(self.roster, self.workers, strict=True)
        return consensus_distance({p: w.flat.flat for p, w in pairs})

    def measure_step_time(self, steps: int = 3) -> float:
        """Seconds per inner step on this machine, timed on a throwaway worker.

        A separate model and data stream, so measuring changes nothing in the run.
        """
        probe = Worker(self.train, self.corpus, self.sim.workers, self.eval_batches)
        probe.trainer.train_steps(1)  # warm-up: first-call allocations are not a step
        began = time.perf_counter()
        probe.trainer.train_steps(steps)
        return (time.perf_counter() - began) / steps

    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> SimResult:
        began = time.perf_counter()
        result = SimResult(
            initial_val_loss=self.evaluate(), message_bytes=self.message_bytes, run_id=self.run_id
        )
        step_s = self.sim.step_time_s or self.measure_step_time()
        self._schedule = Schedule(
            self.algo,
            self.sim,
            self.run_id,
            self.message_bytes,
            [step_s] * self.sim.workers,
            self.workers[0].fingerprint,
        )
        for t in range(self.sim.rounds):
            state, train_loss = self._round(t)
            last = t == self.sim.rounds - 1
            if last:
                self.flush()
            val = self.evaluate() if (t + 1) % self.sim.eval_every == 0 or last else None
            record = self._record(state, train_loss, val)
            if val is not None and self._held is not None:
                ended = max(self._held.exchange_end_s, default=0.0)
                record = replace(record, val_at_s=max(record.wall_clock_s, ended))
            result.records.append(record)
            if on_round is not None:
                on_round(record)
        clock = self.clock
        result.bytes_sent_per_worker = list(self._bytes_sent)
        result.idle_fraction = clock.idle_fraction()
        result.idle_fraction_per_worker = clock.idle_fraction_per_worker()
        result.pace_fraction = clock.pace_fraction()
        result.compute_fraction_per_worker = clock.compute_fraction_per_worker()
        result.time = dict(clock.total().seconds)
        result.wall_clock_s = clock.wall_clock_s
        result.step_time_s = step_s
        result.pace_timeouts = self.schedule.pace_timeouts
        steps = sum(w.trainer.steps_done for w in self.workers) // len(self.workers)
        result.tokens_per_worker = steps * self.train.batch_size * self.train.seq_len
        result.real_elapsed_s = time.perf_counter() - began
        return result
