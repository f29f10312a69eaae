"""The straggler tables: each method on a network with worker 0 at a fraction of the
bandwidth, trained there or re-timed there exactly, against DiLoCo's time to a loss."""

from __future__ import annotations

import statistics
from dataclasses import replace

from .analysis import (
    Run,
    Timed,
    filled_per_round,
    on_network,
    others_mean_h,
    stat,
    straggler_mean_h,
)
from .grid import Mode, RunSpec
from .tables import Section, ceil2, table


def straggler_targets(mode: Mode, runs: dict[str, Run]) -> dict[int, tuple[float, float]]:
    """Per seed: (a loss every straggler-section run of that seed reaches, DiLoCo's final loss
    without a straggler), each rounded up to 0.01.

    Per seed because a seed moves every method's loss together (by ~0.1 nats here): one
    target for all seeds would be easy for one seed and barely reached by the other.
    """
    targets = {}
    specs = [*mode.sections["straggler"], *_straggler_fixed(mode)]
    for seed in mode.seeds:
        best = [
            min(v for _, _, v in runs[s.key].val_curve)
            for s in specs
            if s.seed == seed and s.key in runs
        ]
        diloco = next((s for s in _straggler_fixed(mode) if s.algo == "diloco"), None)
        ref = runs.get(replace(diloco, seed=seed).key) if diloco is not None else None
        if best and ref is not None:
            targets[seed] = (ceil2(max(best)), ceil2(ref.final))
    return targets


def _straggler_fixed(mode: Mode) -> list[RunSpec]:
    """The homogeneous fixed-H runs of (2) whose rows the straggler tables show: DiLoCo
    re-timed on the straggler's network, GASLoC trained on it (its ``straggler`` runs)."""
    n = mode.h1_workers
    return [
        s
        for s in mode.sections["main"]
        if s.workers == n and s.method in ("DiLoCo", "GASLoC-1peer", "GASLoC-2peer")
    ]


def _on(
    mode: Mode, runs: dict[str, Run], spec: RunSpec, fraction: float | None
) -> list[tuple[Run, Timed, str]]:
    """``spec`` on that network for every seed where it is known (trained or re-timed)."""
    found = (on_network(runs, replace(spec, seed=s), mode, fraction) for s in mode.seeds)
    return [x for x in found if x is not None]


def _times(
    mode: Mode, runs: dict[str, Run], spec: RunSpec, fraction: float | None, which: int
) -> dict[int, float | None]:
    """Seed → time to that seed's target ``which`` (0 loose, 1 strict) on the network."""
    targets = straggler_targets(mode, runs)
    out = {}
    for run, clock, _ in _on(mode, runs, spec, fraction):
        if run.spec.seed in targets:
            out[run.spec.seed] = clock.time_to(targets[run.spec.seed][which])
    return out


def _speedups(base: dict[int, float | None], mine: dict[int, float | None]) -> list[float]:
    """DiLoCo's time over this method's, on each seed where both reached the target."""
    return [b / m for seed, m in mine.items() if m and (b := base.get(seed)) is not None and m > 0]


def _fmt_times(times: dict[int, float | None]) -> str:
    if not times:
        return "—"
    if any(t is None for t in times.values()):
        return f"not reached ({sum(t is None for t in times.values())}/{len(times)} seeds)"
    return stat(t for t in times.values() if t is not None).fmt(0)


def _fmt_speed(values: list[float]) -> str:
    return "—" if not values else stat(values).fmt(2) + "×"


STRAGGLER_HEADER = [
    "method",
    "time to target A (s)",
    "× vs DiLoCo",
    "time to target B (s)",
    "× vs DiLoCo",
    "s / round",
    "idle %",
    "H straggler / others",
    "filled steps / round",
    "failed exchanges",
    "final val loss",
    "seeds",
    "clock",
]


def _straggler_rows(
    mode: Mode, runs: dict[str, Run], fraction: float | None, specs: list[RunSpec], out: Section
) -> list[list[str]]:
    bases = {}
    for spec in specs:
        if spec.algo == "diloco":
            bases[spec.budget_scale] = [_times(mode, runs, spec, fraction, k) for k in (0, 1)]
    rows = []
    for spec in specs:
        on = _on(mode, runs, spec, fraction)
        if not on:
            rows.append([spec.label, *["—"] * (len(STRAGGLER_HEADER) - 1)])
            continue
        found = [run for run, _, _ in on]
        clocks = [clock for _, clock, _ in on]
        times = [_times(mode, runs, spec, fraction, k) for k in (0, 1)]
        base = bases.get(spec.budget_scale, [{}, {}])
        speeds = [_speedups(b, t) for b, t in zip(base, times, strict=True)]
        out.numbers[(spec.label, fraction)] = {
            "speed": stat(speeds[0]) if speeds[0] else None,
            "speed_strict": stat(speeds[1]) if speeds[1] else None,
            "idle": stat(c.idle_fraction for c in clocks),
            "final": stat(r.final for r in found),
            "seeds": len(found),
        }
        rounds = found[0].val_curve[-1][0]
        rows.append(
            [
                spec.label,
                _fmt_times(times[0]),
                _fmt_speed(speeds[0]),
                _fmt_times(times[1]),
                _fmt_speed(speeds[1]),
                f"{statistics.fmean(c.wall_clock_s for c in clocks) / rounds:.1f}",
                stat(100 * c.idle_fraction for c in clocks).fmt(1),
                f"{straggler_mean_h(found[0]):.1f} / {others_mean_h(found[0]):.1f}",
                f"{filled_per_round(found[0]):.1f}",
                str(sum(int(r.summary.get("exchange_failures", 0)) for r in found)),
                stat(r.final for r in found).fmt(),
                str(len(found)),
                "/".join(sorted({how for _, _, how in on})),
            ]
        )
    return rows


def straggler_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    out.numbers["targets"] = straggler_targets(mode, runs)
    s0 = mode.seeds[0]
    fixed = [s for s in _straggler_fixed(mode) if s.seed == s0]
    long_fixed = [s for s in mode.sections["long"] if s.method in ("DiLoCo", "GASLoC-1peer")]
    for fraction in (None, *mode.straggler_fractions):
        adaptive = [
            s
            for s in mode.sections["straggler"]
            if s.adapt_h and s.straggler == fraction and s.seed == s0
        ]
        long_adaptive = [
            s for s in mode.sections["straggler_long"] if s.adapt_h and s.straggler == fraction
        ]
        specs = [*fixed, *adaptive, *long_fixed, *long_adaptive]
        rows = _straggler_rows(mode, runs, fraction, specs, out)
        title = "no straggler" if fraction is None else f"worker 0 at {fraction:.0%} bandwidth"
        out.lines += [f"**{title}**", "", *table(STRAGGLER_HEADER, rows)]
    return out


def straggler_curves(
    mode: Mode, runs: dict[str, Run], fraction: float, *, long: bool = False
) -> list[tuple[str, Timed]]:
    """Seed-0 curves of the straggler comparison on one network, for the plot."""
    s0 = mode.seeds[0]
    if long:
        specs = [s for s in mode.sections["long"] if s.method in ("DiLoCo", "GASLoC-1peer")]
        specs += [
            s for s in mode.sections["straggler_long"] if s.adapt_h and s.straggler == fraction
        ]
    else:
        specs = [s for s in _straggler_fixed(mode) if s.seed == s0]
        specs += [
            s
            for s in mode.sections["straggler"]
            if s.adapt_h and s.straggler == fraction and s.seed == s0
        ]
    found = ((s.label, on_network(runs, s, mode, fraction)) for s in specs)
    return [(label, x[1]) for label, x in found if x is not None]
