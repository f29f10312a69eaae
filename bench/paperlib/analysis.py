"""From run summaries to the numbers in the tables: means over seeds, time to a target loss,
and a run on a straggler's network: trained there, or re-timed there when that is exact
(``gaslocd.sim.replay`` checks it round by round)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gaslocd.sim.replay import ReplayRefused, replay_clock

from .execute import configs
from .grid import Mode, RunSpec


@dataclass(frozen=True)
class Run:
    spec: RunSpec
    summary: dict[str, Any]

    @property
    def final(self) -> float:
        return float(self.summary["final_val_loss"])

    @property
    def val_curve(self) -> list[tuple[int, float, float]]:
        """(round, simulated wall-clock s, val loss), round 0 included."""
        return [
            (p["round"], p["wall_clock_s"], p["val_loss"]) for p in self.summary["val_loss_curve"]
        ]

    @property
    def consensus_curve(self) -> list[tuple[int, float]]:
        return [(p["round"], p["consensus"]) for p in self.summary["consensus_curve"]]

    @property
    def final_consensus(self) -> float:
        return float(self.summary["consensus_curve"][-1]["consensus"])

    @property
    def inner_steps(self) -> list[list[int]]:
        """H of every worker in every round."""
        curve = self.summary.get("inner_steps_curve")
        if curve is not None:
            return [p["inner_steps"] for p in curve]
        rounds = self.summary["val_loss_curve"][-1]["round"]
        return [[self.spec.inner_steps] * self.spec.workers] * rounds


@dataclass(frozen=True)
class Stat:
    """Mean over seeds and half the range (max − min) / 2; n seeds."""

    mean: float
    half_range: float
    n: int

    def fmt(self, digits: int = 3) -> str:
        if self.n == 0:
            return "—"
        if self.n == 1:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_range:.{digits}f}"


def stat(values: Iterable[float]) -> Stat:
    xs = list(values)
    if not xs:
        return Stat(float("nan"), float("nan"), 0)
    return Stat(statistics.fmean(xs), (max(xs) - min(xs)) / 2, len(xs))


def seeds_of(runs: dict[str, Run], spec: RunSpec, seeds: Sequence[int]) -> list[Run]:
    """The runs of ``spec`` for each seed that finished."""
    found = (runs.get(replace(spec, seed=s).key) for s in seeds)
    return [r for r in found if r is not None]


def paired(runs: dict[str, Run], spec: RunSpec, ref: RunSpec, seeds: Sequence[int]) -> list[float]:
    """final(spec) − final(ref) on each seed where both finished: a paired difference.

    A seed fixes the data streams and the held-out batches too, so losses move together
    across methods from one seed to the next (by ~0.05 nats here); their differences on
    the same seed are far less noisy than the losses themselves.
    """
    out = []
    for s in seeds:
        a, b = runs.get(replace(spec, seed=s).key), runs.get(replace(ref, seed=s).key)
        if a is not None and b is not None:
            out.append(a.final - b.final)
    return out


def time_to_target(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """First time a (time, loss) curve reaches ``target``, linear between points; None: never."""
    for (t0, l0), (t1, l1) in itertools.pairwise(points):
        if l1 <= target:
            if l0 <= target or l0 == l1:
                return t0 if l0 <= target else t1
            return t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    if points and points[0][1] <= target:
        return points[0][0]
    return None


@dataclass(frozen=True)
class Timed:
    """A run's validation curve on some network: (round, wall s, loss), its idle fraction."""

    curve: list[tuple[int, float, float]]
    idle_fraction: float
    wall_clock_s: float

    def time_to(self, target: float) -> float | None:
        return time_to_target([(t, v) for _, t, v in self.curve], target)


def timed(run: Run, mode: Mode, fraction: float | None) -> Timed:
    """``run`` on a network with worker 0 at ``fraction`` of the bandwidth.

    A run that trained on that very network keeps its own clock. Any other is re-timed
    by replaying the daemon's round on that network without models; the replay raises
    :class:`ReplayRefused` when some round would have come out otherwise there (another
    H, other filled steps, a missed deadline), since the models would then differ too.
    """
    spec = run.spec
    if spec.straggler == fraction:
        return Timed(
            run.val_curve, float(run.summary["idle_fraction"]), float(run.summary["wall_clock_s"])
        )
    rounds = run.summary.get("rounds")
    if rounds is None:
        raise ReplayRefused(f"{spec.key} predates the shared round: no per-round digests")
    algo, _, sim = configs(replace(spec, straggler=fraction), mode.budget, mode.network)
    digests = [r["digest"] for r in rounds]
    points, clock = replay_clock(algo, sim, run.summary["run_id"], digests)
    wall = {0: 0.0} | {p.round: p.wall_clock_s for p in points}
    curve = [(r, wall[r], v) for r, _, v in run.val_curve]
    return Timed(curve, clock.idle_fraction(), clock.wall_clock_s)


def on_network(
    runs: dict[str, Run], spec: RunSpec, mode: Mode, fraction: float | None
) -> tuple[Run, Timed, str] | None:
    """``spec``'s run on the network with worker 0 at ``fraction``: (run, clock, how).

    How: "trained" when a run of ``spec`` trained on that network exists, "re-timed" when
    ``spec``'s own run re-times exactly onto it; None when neither (or not run yet).
    """
    if spec.straggler != fraction:
        there = runs.get(replace(spec, straggler=fraction).key)
        if there is not None:
            return there, timed(there, mode, fraction), "trained"
    run = runs.get(spec.key)
    if run is None:
        return None
    try:
        clock = timed(run, mode, fraction)
    except ReplayRefused:
        return None
    return run, clock, "trained" if spec.straggler == fraction else "re-timed"


def straggler_mean_h(run: Run) -> float:
    """Mean H of the straggler (worker 0) over the run."""
    return statistics.fmean(steps[0] for steps in run.inner_steps)


def others_mean_h(run: Run) -> float:
    return statistics.fmean(statistics.fmean(steps[1:]) for steps in run.inner_steps)


def filled_per_round(run: Run) -> float:
    """Steps trained while waiting for partners, per worker and round (mean)."""
    rounds = run.summary["val_loss_curve"][-1]["round"]
    return float(run.summary.get("filled_steps", 0)) / (rounds * run.spec.workers)
