"""Re-time a finished run on another network, without training it again — when that is exact.

A round's math is fixed by its H and filled steps per worker and the W it applied
(:func:`~gaslocd.sim.schedule.round_digest`); none of those depends on the models. So
the protocol can be replayed on another network with no model at all
(:class:`~gaslocd.sim.schedule.Schedule` without the runner): if every round comes out
with the run's own digest, that network would have trained exactly the same models and
only the clock differs; the replay returns that clock. If any round differs (an
adaptive H chose otherwise, the wait was filled with other steps, an exchange missed
its deadline, a resync), the models would differ too: the replay refuses, and the run
must be trained on that network.

In practice a fixed-H run re-times exactly onto a network where no exchange fails, and
DiLoCo (a barrier all-reduce, fixed H) onto any network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gaslocd.config import AlgoConfig, SimConfig
from gaslocd.sim.clock import SimClock
from gaslocd.sim.schedule import Schedule


class ReplayRefused(ValueError):
    """The run's rounds would not be the same on this network: it cannot be re-timed."""


@dataclass(frozen=True)
class ClockPoint:
    """The clock after a round: wall-clock and the idle fraction so far."""

    round: int
    wall_clock_s: float
    idle_fraction: float


def replay_clock(
    algo: AlgoConfig, sim: SimConfig, run_id: str, digests: Sequence[str]
) -> tuple[list[ClockPoint], SimClock]:
    """The clock of rounds 1..len(digests) of a run on ``sim``'s network.

    ``digests``: the run's per-round ``digest`` (its summary's ``rounds``); ``run_id``:
    the run id its pairings were drawn from. ``sim`` must fix ``step_time_s`` and
    ``message_bytes``: a replay has no model to time. Raises :class:`ReplayRefused`
    at the first round whose H, filled steps or W would differ on this network.
    """
    if sim.step_time_s is None or sim.message_bytes is None:
        raise ValueError("a replay needs the network's step_time_s and message_bytes set")
    algo = algo.resolved()
    schedule = Schedule(
        algo, sim, run_id, sim.message_bytes, [sim.step_time_s] * sim.workers, "replay"
    )
    points = []
    for t, expected in enumerate(digests):
        state = schedule.begin(t)
        schedule.exchange(state, lambda _r, _a, _b: True)
        schedule.settle(state)
        if state.digest() != expected:
            raise ReplayRefused(
                f"round {t + 1} would differ on this network (H {state.planned}, filled "
                f"{state.filled}, failures {state.failures or 'none'}, resyncs "
                f"{len(state.resyncs)}): the run trained other models than this network "
                "would, so it cannot be re-timed; train it on this network"
            )
        if t == len(digests) - 1:
            schedule.drain()  # overlap: the last exchange lands before the run ends
        clock = schedule.clock
        points.append(ClockPoint(t + 1, clock.wall_clock_s, clock.idle_fraction()))
    return points, schedule.clock
