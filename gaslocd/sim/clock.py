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

**Where the time goes** (:meth:`SimClock.finish_round`): each worker keeps the daemon's
own :class:`~gaslocd.protocol.account.TimeAccount`, in the same categories, so a
simulated run and a real one report the same quantities:

- ``train`` and ``fill``: the planned steps and the steps that filled the wait (useful
  work, not waiting);
- ``wait_ready``: the exchange phase before a partner opened (a late partner), and the
  whole of an exchange that fails at its deadline;
- ``transfer``: moving its own bytes at its own link speed; ``slow_link``: the rest of
  the exchange, spent at a partner's slower link;
- ``roster``: the protocol holding it back (pacing for a peer two rounds behind, a
  partnerless round's sleep until it lasted T) and a resync's state fetch.

"Idle" is every second not in ``train`` or ``fill``, as in the daemon (docs/design.md
§4), and the categories sum to each worker's elapsed time.

An all-reduce is never failed by the deadline here (an edge fault still removes a
member): DiLoCo is the reference the gossip runs are compared with, so it is modelled
as the barrier all-reduce it is meant to be.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gaslocd.protocol.account import TimeAccount
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

    def edge_transfer_s(
        self, a: int, b: int, degree_a: int, degree_b: int, nbytes: int | None = None
    ) -> float:
        """One bidirectional exchange a–b while each also serves its other partners.

        Each access link is full duplex and split evenly over its concurrent exchanges.
        ``nbytes``: the larger of the two messages (a link's own codec), else the model's.
        """
        share_a = self.bandwidth_bytes_per_s[a] / max(1, degree_a)
        share_b = self.bandwidth_bytes_per_s[b] / max(1, degree_b)
        size = self.message_bytes if nbytes is None else nbytes
        return self.latency_s + size / min(share_a, share_b)

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


def landing_step(arrival_s: float, start_s: float, step_s: float, steps: int) -> int:
    """Overlap: how many of a round's ``steps`` (started at ``start_s``) a worker trains
    before the previous round's exchange, ending at ``arrival_s``, lands its outer step.

    The daemon asks between steps whether the exchange is over, so a message that
    arrives during a step lands after it; one there before the round lands before its
    first step, and one still on the wire after the last lands after them.
    """
    if steps <= 0 or arrival_s <= start_s:
        return 0
    return min(steps, math.ceil((arrival_s - start_s) / step_s - 1e-9))


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
    """Per-worker simulated time, and its time account (the daemon's categories)."""

    workers: int
    now_s: list[float] = field(init=False)
    accounts: list[TimeAccount] = field(init=False)

    def __post_init__(self) -> None:
        self.now_s = [0.0] * self.workers
        self.accounts = [TimeAccount() for _ in range(self.workers)]

    def finish_round(self, k: int, parts: Mapping[str, float]) -> None:
        """Worker k's round, as seconds per activity (``TimeAccount`` names)."""
        if min(parts.values(), default=0.0) < 0:
            raise ValueError(f"worker {k}: negative time in a round: {dict(parts)}")
        self.accounts[k].add_all(parts)
        self.now_s[k] += sum(parts.values())

    @property
    def wall_clock_s(self) -> float:
        return max(self.now_s)

    def total(self) -> TimeAccount:
        """Every worker's account added up."""
        out = TimeAccount()
        for account in self.accounts:
            out.merge(account)
        return out

    def seconds(self, activity: str) -> list[float]:
        """Per worker, the seconds booked to ``activity``."""
        return [a.seconds[activity] for a in self.accounts]

    @property
    def idle_s(self) -> list[float]:
        """Per worker, the seconds not spent training."""
        return [a.idle_s() for a in self.accounts]

    def idle_fraction(self) -> float:
        """Share of all workers' elapsed time not spent training."""
        total = self.total()
        return total.idle_s() / total.total() if total.total() > 0 else 0.0

    def idle_fraction_per_worker(self) -> list[float]:
        return [1.0 - a.training_share() if a.total() > 0 else 0.0 for a in self.accounts]

    def pace_fraction(self) -> float:
        """Share of all workers' elapsed time the protocol held them back (``roster``)."""
        total = self.total()
        return total.seconds["roster"] / total.total() if total.total() > 0 else 0.0

    def compute_fraction_per_worker(self) -> list[float]:
        """Share of each worker's elapsed time spent on inner steps (filling included)."""
        return [a.training_share() for a in self.accounts]


def split_exchange_phase(phase_s: float, waited_s: float, own_traffic_s: float) -> dict[str, float]:
    """A worker's exchange phase (opening to its last exchange's end) as the daemon books
    it: ``waited_s`` of it before partners were there (or until a failed exchange's
    deadline), its own bytes at its own speed, and the rest at a partner's slower link."""
    wait = min(phase_s, max(0.0, waited_s))
    own = min(phase_s - wait, max(0.0, own_traffic_s))
    return {"wait_ready": wait, "transfer": own, "slow_link": phase_s - wait - own}
