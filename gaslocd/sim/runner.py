"""N workers in one process: the daemon's algorithm over an in-memory wire and a fake clock.

Each worker is a real model with its own AdamW and its own data stream; a round is the
daemon's round (plan → H steps → exchange → outer step) with the network replaced by
:class:`~gaslocd.net.memory.InMemoryTransport` and time by :class:`SimClock`. The math
does not depend on the clock, so a run is reproducible from its seed; the clock only
turns it into wall-clock (time-to-loss, idle fraction) for a given network.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from gaslocd.algorithm.hpolicy import choose_inner_steps, target_round_time
from gaslocd.algorithm.outer import consensus_distance, mix, outer_step_, renormalized_weights
from gaslocd.algorithm.topology import RoundPlan, plan_round
from gaslocd.config import AlgoConfig, SimConfig, TrainConfig
from gaslocd.net.memory import EdgeFault, InMemoryTransport
from gaslocd.sim.clock import NetworkModel, SimClock
from gaslocd.train.data import BatchSampler, Corpus, fixed_batches, load_corpus
from gaslocd.train.flat import FlatParameters
from gaslocd.train.inner import InnerTrainer
from gaslocd.train.model import build_model

log = logging.getLogger(__name__)


@dataclass
class SimWorker:
    peer_id: str
    flat: FlatParameters
    trainer: InnerTrainer
    momentum: torch.Tensor


@dataclass(frozen=True)
class RoundRecord:
    """What one round did; the CLI prints it, the summary collects it."""

    round: int
    inner_steps: tuple[int, ...]
    train_loss: float
    val_loss: float | None
    consensus: float
    wall_clock_s: float
    idle_fraction: float
    exchange_failures: int


@dataclass
class SimResult:
    records: list[RoundRecord] = field(default_factory=list)
    initial_val_loss: float = float("nan")
    bytes_sent_per_worker: list[float] = field(default_factory=list)
    idle_fraction: float = 0.0
    idle_fraction_per_worker: list[float] = field(default_factory=list)
    wall_clock_s: float = 0.0
    step_time_s: float = 0.0
    message_bytes: int = 0
    tokens_per_worker: int = 0
    real_elapsed_s: float = 0.0

    @property
    def final_val_loss(self) -> float:
        vals = [r.val_loss for r in self.records if r.val_loss is not None]
        return vals[-1] if vals else self.initial_val_loss


def worker_roster(workers: int) -> list[str]:
    """The simulated peers' ids, sorted as the roster is."""
    return [f"w{k:03d}" for k in range(workers)]


def network_model(sim: SimConfig, encoded_message_bytes: int) -> NetworkModel:
    """The clock's network for ``sim``: its own message size if set, else the encoded model."""
    return NetworkModel(
        tuple(sim.bandwidth_bytes_per_s(k) for k in range(sim.workers)),
        sim.latency_ms / 1000,
        sim.message_bytes or encoded_message_bytes,
    )


def advance_clock(
    clock: SimClock,
    net: NetworkModel,
    plan: RoundPlan,
    inner_steps: Sequence[int],
    step_times: Sequence[float],
    *,
    allreduce: bool,
    exchanged: Mapping[str, set[str]] | None = None,
) -> None:
    """Advance ``clock`` through one round of ``plan``: a barrier all-reduce or gossip.

    ``exchanged`` (peer → partners it did exchange with) drops failed gossip edges; None
    means every planned edge went through. The run and :func:`~gaslocd.sim.replay.replay_clock`
    both advance their clocks here, so a replay cannot drift from the run it re-times.
    """
    if allreduce:
        clock.allreduce_round(inner_steps, step_times, net)
        return
    index = {p: k for k, p in enumerate(plan.roster)}
    edges = [
        (index[a], index[b]) for a, b in plan.edges() if exchanged is None or b in exchanged[a]
    ]
    clock.gossip_round(inner_steps, step_times, edges, net)


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
        self.corpus = corpus if corpus is not None else load_corpus(train.data)
        self.roster = worker_roster(sim.workers)
        self.workers = [self._make_worker(k, peer) for k, peer in enumerate(self.roster)]
        numel = self.workers[0].flat.numel
        self.transport = InMemoryTransport(sim.codec, numel, edge_fails)
        self.eval_batches = fixed_batches(
            self.corpus.val,
            batch_size=train.batch_size,
            seq_len=train.seq_len,
            n=train.eval_batches,
            seed=train.seed,
        )
        self.net = network_model(sim, self.transport.message_bytes)
        self.clock = SimClock(sim.workers)
        self._bytes_sent = [0.0] * sim.workers

    def _make_worker(self, k: int, peer_id: str) -> SimWorker:
        # Every worker starts from the same θ0 (same init seed), as DiLoCo does; they
        # differ by their data streams.
        model = build_model(
            self.train.model,
            vocab_size=self.corpus.vocab_size,
            seq_len=self.train.seq_len,
            seed=self.train.seed,
        )
        flat = FlatParameters(model)
        sampler = BatchSampler(
            self.corpus.train,
            batch_size=self.train.batch_size,
            seq_len=self.train.seq_len,
            seed=self.train.seed,
            worker=k,
        )
        trainer = InnerTrainer(model, flat, sampler, self.train)
        return SimWorker(peer_id, flat, trainer, torch.zeros_like(flat.flat))

    # -- one round ----------------------------------------------------------------------

    def _uses_allreduce(self) -> bool:
        # The complete graph is run as an all-reduce: that is how anyone would implement
        # it, and it is what DiLoCo does.
        return self.algo.topology == "complete"

    def _transfer_estimates(self, plan: RoundPlan) -> tuple[list[float], list[float]]:
        """(expected transfer this round, typical transfer) per worker, in seconds.

        The first is what worker k's exchanges will take with *this round's* partners;
        the second what they would take on its own link alone: its median over workers
        is the network's "typical transfer time" in the target T, so a straggler's slow
        link shortens its own round's compute without raising everyone's target.
        """
        if self._uses_allreduce():
            typical = [self.net.own_allreduce_s(k) for k in range(self.sim.workers)]
            return [self.net.allreduce_s()] * self.sim.workers, typical
        index = {p: k for k, p in enumerate(self.roster)}
        expected, typical = [], []
        for k, peer in enumerate(self.roster):
            times = [
                self.net.edge_transfer_s(k, index[q], plan.degree(peer), plan.degree(q))
                for q in plan.partners_of(peer)
            ]
            expected.append(max(times, default=0.0))
            typical.append(self.net.own_transfer_s(k, max(1, plan.degree(peer))))
        return expected, typical

    def _inner_steps(self, plan: RoundPlan, step_times: list[float]) -> list[int]:
        h_base = self.algo.inner_steps
        if not self.algo.adapt_h:
            return [h_base] * self.sim.workers
        expected, typical = self._transfer_estimates(plan)
        target = target_round_time(h_base, step_times, typical)
        return [
            choose_inner_steps(target, x, s, self.algo.h_min, self.algo.h_upper)
            for x, s in zip(expected, step_times, strict=True)
        ]

    def _exchange(self, plan: RoundPlan, t: int) -> tuple[dict[str, set[str]], int]:
        ok: dict[str, set[str]] = {p: set() for p in self.roster}
        failures = 0
        for a, b in plan.edges():
            if self.transport.exchange(t, a, b):
                ok[a].add(b)
                ok[b].add(a)
            else:
                failures += 1
        index = {p: k for k, p in enumerate(self.roster)}
        if self._uses_allreduce():
            for k in range(self.sim.workers):
                self._bytes_sent[k] += self.net.allreduce_bytes() if ok[self.roster[k]] else 0
        else:
            for p, partners in ok.items():
                self._bytes_sent[index[p]] += len(partners) * self.net.message_bytes
        return ok, failures

    def _round(self, t: int, step_times: list[float]) -> tuple[list[int], float, int]:
        plan = plan_round(self.algo.topology, self.roster, t, self.train.seed)
        inner_steps = self._inner_steps(plan, step_times)
        starts, losses = [], []
        for w, h in zip(self.workers, inner_steps, strict=True):
            starts.append(w.flat.clone())
            losses.extend(w.trainer.train_steps(h))
            self.transport.post(t, w.peer_id, w.flat.flat)
        ok, failures = self._exchange(plan, t)
        for w, start in zip(self.workers, starts, strict=True):
            row = renormalized_weights(plan.mixing_weights(w.peer_id), w.peer_id, ok[w.peer_id])
            tensors = {q: self.transport.fetch(t, q) for q in row if q != w.peer_id}
            tensors[w.peer_id] = w.flat.flat  # one's own θ̃ is known exactly
            mixed = mix(row, tensors)
            w.flat.load_(start)
            outer_step_(w.flat.flat, w.momentum, mixed, self.algo.outer)
        self.transport.end_round(t)
        advance_clock(
            self.clock,
            self.net,
            plan,
            inner_steps,
            step_times,
            allreduce=self._uses_allreduce(),
            exchanged=ok,
        )
        return inner_steps, statistics.fmean(losses), failures

    # -- the run ------------------------------------------------------------------------

    def evaluate(self) -> float:
        """Mean validation loss of the workers' own models (what each peer would serve).

        Bit-identical replicas (every worker after a lossless all-reduce, for DiLoCo) are
        evaluated once and counted once each: the same number, up to 1/n of the cost.
        """
        losses: list[float] = []
        seen: list[tuple[torch.Tensor, float]] = []
        for w in self.workers:
            twin = next((loss for flat, loss in seen if torch.equal(flat, w.flat.flat)), None)
            if twin is None:
                twin = w.trainer.evaluate(self.eval_batches)
                seen.append((w.flat.flat, twin))
            losses.append(twin)
        return statistics.fmean(losses)

    def consensus(self) -> float:
        return consensus_distance({w.peer_id: w.flat.flat for w in self.workers})

    def measure_step_time(self, steps: int = 3) -> float:
        """Seconds per inner step on this machine, timed on a throwaway worker.

        A separate model and data stream, so measuring changes nothing in the run.
        """
        probe = self._make_worker(self.sim.workers, "probe")
        probe.trainer.train_steps(1)  # warm-up: first-call allocations are not a step
        began = time.perf_counter()
        probe.trainer.train_steps(steps)
        return (time.perf_counter() - began) / steps

    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> SimResult:
        began = time.perf_counter()
        result = SimResult(initial_val_loss=self.evaluate(), message_bytes=self.net.message_bytes)
        step_s = self.sim.step_time_s or self.measure_step_time()
        step_times = [step_s] * self.sim.workers
        for t in range(self.sim.rounds):
            inner_steps, train_loss, failures = self._round(t, step_times)
            last = t == self.sim.rounds - 1
            val = self.evaluate() if (t + 1) % self.sim.eval_every == 0 or last else None
            record = RoundRecord(
                round=t + 1,
                inner_steps=tuple(inner_steps),
                train_loss=train_loss,
                val_loss=val,
                consensus=self.consensus(),
                wall_clock_s=self.clock.wall_clock_s,
                idle_fraction=self.clock.idle_fraction(),
                exchange_failures=failures,
            )
            result.records.append(record)
            if on_round is not None:
                on_round(record)
        result.bytes_sent_per_worker = list(self._bytes_sent)
        result.idle_fraction = self.clock.idle_fraction()
        result.idle_fraction_per_worker = self.clock.idle_fraction_per_worker()
        result.wall_clock_s = self.clock.wall_clock_s
        result.step_time_s = step_s
        result.tokens_per_worker = (
            self.workers[0].trainer.steps_done * self.train.batch_size * self.train.seq_len
        )
        result.real_elapsed_s = time.perf_counter() - began
        return result
