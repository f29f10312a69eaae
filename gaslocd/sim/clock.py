"""A simulated clock: per-worker step time, per-link bandwidth and latency → wall-clock.

Worker i's round t unfolds as events: it starts when its previous round ended, computes
H_i,t steps (ready_i = start_i + H_i,t · s_i), then each exchange with a partner j starts
when *both* are ready and lasts latency + message / (the slower of the two access links'
fair share). Its round ends when its last exchange ends. A gossip exchange therefore
waits only for this round's partners, while an all-reduce (DiLoCo) is a barrier: it
starts when the last worker is ready and runs at the speed of the slowest link.

Idle time is what a worker loses to others: the time from ready to end minus what its
own traffic would have taken on its own link alone. Waiting for a late partner and
crawling at a partner's slower link both count; moving one's own bytes does not. This is
the figure the H policy must keep near zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


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

    def allreduce_bytes(self) -> float:
        """Bytes each worker sends in a bandwidth-optimal (ring) all-reduce."""
        n = self.workers
        return 2 * (n - 1) / n * self.message_bytes if n > 1 else 0.0

    def allreduce_s(self) -> float:
        """A ring all-reduce: 2(n−1) latency-bound steps, the slowest link sets the pace."""
        n = self.workers
        if n == 1:
            return 0.0
        return 2 * (n - 1) * self.latency_s + self.allreduce_bytes() / min(
            self.bandwidth_bytes_per_s
        )

    def own_allreduce_s(self, a: int) -> float:
        n = self.workers
        if n == 1:
            return 0.0
        return 2 * (n - 1) * self.latency_s + self.allreduce_bytes() / self.bandwidth_bytes_per_s[a]


@dataclass
class SimClock:
    """Per-worker simulated time, and where it went (compute, communication, idle)."""

    workers: int
    now_s: list[float] = field(init=False)
    compute_s: list[float] = field(init=False)
    comm_s: list[float] = field(init=False)
    idle_s: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.now_s = [0.0] * self.workers
        self.compute_s = [0.0] * self.workers
        self.comm_s = [0.0] * self.workers
        self.idle_s = [0.0] * self.workers

    def _compute(self, inner_steps: Sequence[int], step_time_s: Sequence[float]) -> list[float]:
        ready = []
        for i in range(self.workers):
            busy = inner_steps[i] * step_time_s[i]
            self.compute_s[i] += busy
            ready.append(self.now_s[i] + busy)
        return ready

    def _finish(self, ready: Sequence[float], end: Sequence[float], own: Sequence[float]) -> None:
        for i in range(self.workers):
            waited = end[i] - ready[i]
            self.comm_s[i] += min(waited, own[i])
            self.idle_s[i] += max(0.0, waited - own[i])
            self.now_s[i] = end[i]

    def gossip_round(
        self,
        inner_steps: Sequence[int],
        step_time_s: Sequence[float],
        edges: Sequence[tuple[int, int]],
        net: NetworkModel,
    ) -> None:
        """Advance every worker through one round of pairwise exchanges."""
        ready = self._compute(inner_steps, step_time_s)
        degree = [0] * self.workers
        for a, b in edges:
            degree[a] += 1
            degree[b] += 1
        end = list(ready)
        for a, b in edges:
            finish = max(ready[a], ready[b]) + net.edge_transfer_s(a, b, degree[a], degree[b])
            end[a] = max(end[a], finish)
            end[b] = max(end[b], finish)
        own = [net.own_transfer_s(i, degree[i]) for i in range(self.workers)]
        self._finish(ready, end, own)

    def allreduce_round(
        self, inner_steps: Sequence[int], step_time_s: Sequence[float], net: NetworkModel
    ) -> None:
        """Advance every worker through one barrier all-reduce (DiLoCo)."""
        ready = self._compute(inner_steps, step_time_s)
        finish = max(ready) + net.allreduce_s()
        own = [net.own_allreduce_s(i) for i in range(self.workers)]
        self._finish(ready, [finish] * self.workers, own)

    @property
    def wall_clock_s(self) -> float:
        return max(self.now_s)

    def idle_fraction(self) -> float:
        """Share of all workers' elapsed time lost waiting on others."""
        total = sum(self.now_s)
        return sum(self.idle_s) / total if total > 0 else 0.0

    def idle_fraction_per_worker(self) -> list[float]:
        return [
            idle / now if now > 0 else 0.0
            for idle, now in zip(self.idle_s, self.now_s, strict=True)
        ]
