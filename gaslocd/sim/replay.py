"""Re-time a finished run on another network, without training it again.

The simulated clock never feeds back into the math unless H adapts to it: a run with a
fixed H trains exactly the same models whatever the bandwidth, latency or stragglers, and
only its wall-clock changes. So a run's per-round H (``inner_steps_curve`` in its summary)
plus the round plans (a pure function of topology, roster, round and seed) are enough to
ask "how long would this have taken with one worker at 10% bandwidth?" for free.

A run whose H adapted to its network is only re-timed faithfully on that same network:
on another one the policy would have chosen other H, hence other models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gaslocd.algorithm.topology import plan_round
from gaslocd.config import SimConfig
from gaslocd.sim.clock import SimClock
from gaslocd.sim.runner import advance_clock, network_model, worker_roster


@dataclass(frozen=True)
class ClockPoint:
    """The clock after a round: wall-clock and the idle fraction so far."""

    round: int
    wall_clock_s: float
    idle_fraction: float


def replay_clock(
    topology: str,
    seed: int,
    sim: SimConfig,
    inner_steps: Sequence[Sequence[int]],
) -> tuple[list[ClockPoint], SimClock]:
    """The clock of rounds 1..len(inner_steps) of a run, on ``sim``'s network.

    ``sim`` must fix ``step_time_s`` and ``message_bytes``: a replay has no model to time.
    Every planned exchange is assumed to have succeeded.
    """
    if sim.step_time_s is None or sim.message_bytes is None:
        raise ValueError("a replay needs the network's step_time_s and message_bytes set")
    roster = worker_roster(sim.workers)
    net = network_model(sim, sim.message_bytes)
    clock = SimClock(sim.workers)
    step_times = [sim.step_time_s] * sim.workers
    points = []
    for t, steps in enumerate(inner_steps):
        if len(steps) != sim.workers:
            raise ValueError(f"round {t + 1} has H for {len(steps)} workers, not {sim.workers}")
        plan = plan_round(topology, roster, t, seed)
        advance_clock(clock, net, plan, steps, step_times, allreduce=topology == "complete")
        points.append(ClockPoint(t + 1, clock.wall_clock_s, clock.idle_fraction()))
    return points, clock
