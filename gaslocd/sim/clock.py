"""A simulated clock: per-worker step time, per-link bandwidth and latency → wall-clock.

It models what a daemon does in a round (:mod:`gaslocd.daemon.driver`), with the
protocol's own rules (:mod:`gaslocd.protocol`) deciding; this module only does the time
arithmetic. Worker i's round t:

1. starts when its round t−1 ended, or later if it **paces** (a peer has not ended round
   t−2: the protocol's ``behind``, at most ``pace_until``), and trains its planned H_i
   (``ready_i = start_i + H_i·s_i``), then sends its partners a Ready notice, which
   arrives ``latency`` later;
2. **fills the wait** (adaptive H, gossip only): before each extra step it asks the
   protocol's :class:`~gaslocd.protocol.policy.FillWait` whether to stop, with
   ``partners_ready`` true once every partner's notice has arrived (:func:`fill_steps`);
   the extra steps are really trained;
3. opens its exchanges. Each edge starts when *both* ends have opened and lasts
   ``latency + message / (the slower of the two access links' fair share)``; it
   **fails** for both (no mixing on that edge) when it would end after the earlier
   side's deadline, ``min(opened_i + deadline_i, opened_j + deadline_j)``
   (:func:`time_edge`). A DiLoCo all-reduce is a barrier instead: it starts when the
   last member is ready and runs at the speed of the slowest member's link;
4. may fetch a live peer's state (resync) and, without partners while others exist,
   sleeps until the round has lasted T (the protocol's ``solo_wait_s``).

**Where the time goes** (:meth:`SimClock.finish_round`), per worker:

- *compute*: every inner step, the planned H and the steps that filled the wait alike
  (filling is useful work, not waiting);
- *comm*: moving its own bytes, i.e. what its successful exchanges would take on its
  own link alone, plus a resync's state fetch;
- *idle*: the rest of its exchange phase, time lost to others: a late partner, crawling
  at a partner's slower link, an exchange that fails at its deadline. This is the
  figure filling the wait and adaptive H exist to keep near zero;
- *pace*: the protocol holding a worker back so that round numbers stay together:
  waiting for a peer two rounds behind, and a partnerless round's sleep until it has
  lasted T. Not idle: it is the protocol's pacing, not a partner keeping this worker
  waiting in its exchange, and the daemon's idle counter does not count it either. Not
  compute: ``compute_fraction_per_worker`` (and ``pace_s``) show what it costs, so
  report idle and pace together when comparing with a simulator that had no pacing.

So ``compute + comm + idle + pace`` is each worker's elapsed time.

An all-reduce is never failed by the deadline here (an edge fault still removes a
member): DiLoCo is the reference the gossip runs are compared with, so it is modelled
as the barrier all-reduce it is meant to be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gaslocd.protocol.policy import FillWait

OK, DEADLINE, FAULT = "ok", "deadline", "fault"


@dataclass(frozen=True)
class NetworkModel:
    """Access-link bandwidth per worker (bytes/s), one latency, one message size."""

    bandwidth_bytes_per_s: tuple[float, ...]
    latency_s: float
    message_bytes: int

    @property
    def workers(self) -> int:
        return len(self.bandwidth_bytes_per_s)

    def edge_transfer_s(self, a: int, b: int, degree_a: int, degree_b: int) -> float:
        """One bidirectional exchange a–b while each also serves its other partners.

        Each access link is full duplex and split evenly over its concurrent exchanges.
        """
        share_a = self.bandwidth_bytes_per_s[a] / max(1, degree_a)
        share_b = self.bandwidth_bytes_per_s[b] / max(1, degree_b)
        return self.latency_s + self.message_bytes / min(share_a, share_b)

    def own_transfer_s(self, a: int, degree_a: int) -> float:
        """What a's exchanges would take if every partner were as fast as a."""
        if degree_a == 0:
            return 0.0
        return self.latency_s + degree_a * self.message_bytes / self.bandwidth_bytes_per_s[a]

    def allreduce_bytes(self, members: int | None = None) -> float:
        """Bytes each member sends in a bandwidth-optimal (ring) all-reduce."""
        n = self.workers if members is None else members
        return 2 * (n - 1) / n * self.message_bytes if n > 1 else 0.0

    def allreduce_s(self, members: Sequence[int] | None = None) -> float:
        """A ring all-reduce: 2(n−1) latency-bound steps, the slowest link sets the pace."""
        group = range(self.workers) if members is None else members
        n = len(group)
        if n <= 1:
            return 0.0
        slowest = min(self.bandwidth_bytes_per_s[k] for k in group)
        return 2 * (n - 1) * self.latency_s + self.allreduce_bytes(n) / slowest

    def own_allreduce_s(self, a: int, members: int | None = None) -> float:
        """What a's share of the all-reduce would take on its own link."""
        n = self.workers if members is None else members
        if n <= 1:
            return 0.0
        own = self.bandwidth_bytes_per_s[a]
        return 2 * (n - 1) * self.latency_s + self.allreduce_bytes(n) / own

    def state_fetch_s(self, a: int, b: int) -> float:
        """A resync: θ and the outer momentum, each the size of one message, from b to a."""
        slower = min(self.bandwidth_bytes_per_s[a], self.bandwidth_bytes_per_s[b])
        return self.latency_s + 2 * self.message_bytes / slower


def fill_steps(
    fill: FillWait | None, ready_s: float, step_s: float, notices_s: Sequence[float]
) -> int:
    """How many steps a worker trains after its planned H, asking ``fill`` before each.

    ``notices_s``: when each partner's Ready notice reaches this worker. The daemon
    checks the same rule between steps with the real clock; here ``now`` is the
    simulated time before the step.
    """
    if fill is None:
        return 0
    steps = 0
    while steps < fill.room:
        now = ready_s + steps * step_s
        if fill.done(now, all(arrival <= now for arrival in notices_s)):
            break
        steps += 1
    return steps


@dataclass(frozen=True)
class EdgeTiming:
    """One planned exchange on the clock: when it ran, and how it ended for each side."""

    a: int
    b: int
    start_s: float  # both sides open
    transfer_s: float  # what the transfer takes (or would have taken)
    end_a_s: float  # when a's side of the exchange ended (success or failure)
    end_b_s: float
    outcome: str  # OK, DEADLINE or FAULT

    @property
    def moved(self) -> bool:
        """Whether the bytes went through (refusing them afterwards is another matter)."""
        return self.outcome == OK

    def end_for(self, k: int) -> float:
        return self.end_a_s if k == self.a else self.end_b_s


def time_edge(
    a: int,
    b: int,
    opened: tuple[float, float],
    deadline_s: tuple[float, float],
    transfer_s: float,
    *,
    broken: bool = False,
) -> EdgeTiming:
    """The a–b exchange: it starts when both have opened and must end before the earlier
    side gives up (its opening time plus its deadline). A ``broken`` edge (a fault:
    a dead peer, a cut link) fails as soon as both sides try it."""
    start = max(opened)
    if broken:
        return EdgeTiming(a, b, start, transfer_s, start, start, FAULT)
    give_up = min(opened[0] + deadline_s[0], opened[1] + deadline_s[1])
    if start + transfer_s > give_up:
        # Each side learns of the failure when the first one gives up (or when it opens,
        # if that is later: the other has already closed the round).
        return EdgeTiming(
            a, b, start, transfer_s, max(opened[0], give_up), max(opened[1], give_up), DEADLINE
        )
    end = start + transfer_s
    return EdgeTiming(a, b, start, transfer_s, end, end, OK)


@dataclass
class SimClock:
    """Per-worker simulated time, and where it went (compute, comm, idle, pace)."""

    workers: int
    now_s: list[float] = field(init=False)
    compute_s: list[float] = field(init=False)
    comm_s: list[float] = field(init=False)
    idle_s: list[float] = field(init=False)
    pace_s: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.now_s = [0.0] * self.workers
        self.compute_s = [0.0] * self.workers
        self.comm_s = [0.0] * self.workers
        self.idle_s = [0.0] * self.workers
        self.pace_s = [0.0] * self.workers

    def finish_round(
        self,
        k: int,
        *,
        compute_s: float,
        exchange_s: float,
        own_traffic_s: float,
        fetch_s: float = 0.0,
        pause_s: float = 0.0,
    ) -> None:
        """Worker k's round: ``compute_s`` of steps, an exchange phase of ``exchange_s``
        (of which at most ``own_traffic_s`` moved its own bytes, the rest is idle), a
        state fetch, and ``pause_s`` of pacing (before the round, or a solo round's sleep)."""
        if min(compute_s, exchange_s, own_traffic_s, fetch_s, pause_s) < 0:
            raise ValueError(f"worker {k}: negative time in a round")
        traffic = min(exchange_s, own_traffic_s)
        self.compute_s[k] += compute_s
        self.comm_s[k] += traffic + fetch_s
        self.idle_s[k] += exchange_s - traffic
        self.pace_s[k] += pause_s
        self.now_s[k] += compute_s + exchange_s + fetch_s + pause_s

    @property
    def wall_clock_s(self) -> float:
        return max(self.now_s)

    def idle_fraction(self) -> float:
        """Share of all workers' elapsed time lost waiting on others."""
        total = sum(self.now_s)
        return sum(self.idle_s) / total if total > 0 else 0.0

    def idle_fraction_per_worker(self) -> list[float]:
        return _shares(self.idle_s, self.now_s)

    def pace_fraction(self) -> float:
        """Share of all workers' elapsed time the protocol held them back (pacing)."""
        total = sum(self.now_s)
        return sum(self.pace_s) / total if total > 0 else 0.0

    def compute_fraction_per_worker(self) -> list[float]:
        """Share of each worker's elapsed time spent on inner steps (filling included)."""
        return _shares(self.compute_s, self.now_s)


def _shares(part: Sequence[float], whole: Sequence[float]) -> list[float]:
    return [p / w if w > 0 else 0.0 for p, w in zip(part, whole, strict=True)]
