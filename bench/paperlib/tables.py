"""The report's tables, one function per claim; each returns markdown lines and the numbers
the findings quote. Markdown is built by hand: a table is a header, a rule and rows."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .analysis import Run, Timed, others_mean_h, seeds_of, stat, straggler_mean_h, timed
from .grid import Mode, RunSpec


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


@dataclass
class Section:
    """Markdown lines, plus named numbers for the findings."""

    lines: list[str] = field(default_factory=list)
    numbers: dict[Any, Any] = field(default_factory=dict)


def _msgs_per_round(run: Run) -> float:
    """Model-sized messages each worker sends per round (mean over workers)."""
    rounds = run.val_curve[-1][0]
    sent = statistics.fmean(run.summary["bytes_sent_per_worker"])
    return sent / rounds / run.summary["message_bytes"]


def best_h1_outer(mode: Mode, runs: dict[str, Run]) -> tuple[float, float] | None:
    """The (η, μ) of the best GASLoC-1peer H=1 tuning run (seed 0), None before any ran."""
    done = [runs[s.key] for s in mode.sections["h1_tune"] if s.key in runs]
    return min(done, key=lambda r: r.final).spec.outer if done else None


def _h1_row(label: str, found: list[Run], spec: RunSpec) -> list[str]:
    lr, mom = spec.outer
    return [
        label,
        f"{lr:g}, {mom:g}",
        f"{_msgs_per_round(found[0]):.2f}",
        stat(r.final for r in found).fmt(),
        stat(r.summary["mean_model_val_loss"] for r in found).fmt(),
        stat(r.final_consensus for r in found).fmt(digits=4),
        f"{found[0].summary['wall_clock_s'] / 3600:.2f}",
    ]


def h1_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    best = best_h1_outer(mode, runs)
    rows = []
    one_seed = [*mode.sections["h1_tune"], mode.sections["h1"][0]]
    for spec in one_seed:
        if spec.key in runs:
            rows.append(_h1_row(f"{spec.method} (seed {spec.seed} only)", [runs[spec.key]], spec))
    tuned = mode.tuned_h1(best) if best is not None else []
    dadam = [s for s in mode.sections["h1"] if s.algo == "dadam"]
    for spec in [*tuned, *dadam]:
        if spec.seed != mode.seeds[0]:
            continue
        found = seeds_of(runs, spec, mode.seeds)
        if found:
            out.numbers[spec.method] = stat(r.final for r in found)
            label = f"{spec.method} (tuned η, μ)" if spec.algo == "gasloc" else spec.method
            rows.append(_h1_row(label, found, spec))
    out.numbers["best"] = best
    out.lines = table(
        [
            "method (H=1)",
            "η, μ",
            "messages sent / worker / round",
            "final val loss",
            "val loss of the mean model",
            "final consensus",
            "simulated hours",
        ],
        rows,
    )
    return out


MAIN_METHODS = ("GASLoC-1peer", "GASLoC-2peer", "DiLoCo", "Local-DAdam-2peer", "Local-DAdam-1peer")


def main_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    by_method: dict[str, dict[int, RunSpec]] = {}
    for s in mode.sections["main"]:
        by_method.setdefault(s.method, {})[s.workers] = s
    loss_rows, mean_rows, cons_rows = [], [], []
    for method in MAIN_METHODS:
        loss_row, mean_row, cons_row = [method], [method], [method]
        for n in mode.workers:
            spec = by_method.get(method, {}).get(n)
            found = [] if spec is None else seeds_of(runs, spec, mode.seeds)
            if not found:
                for row in (loss_row, mean_row, cons_row):
                    row.append("(not run)" if spec is None else "—")
                continue
            final = stat(r.final for r in found)
            out.numbers[(method, n)] = final
            out.numbers[(method, n, "mean")] = stat(r.summary["mean_model_val_loss"] for r in found)
            loss_row.append(final.fmt())
            mean_row.append(out.numbers[(method, n, "mean")].fmt())
            cons_row.append(stat(r.final_consensus for r in found).fmt(digits=4))
        loss_rows.append(loss_row)
        mean_rows.append(mean_row)
        cons_rows.append(cons_row)
    header = [f"H={mode.h_main}", *(f"{n} workers" for n in mode.workers)]
    out.lines = ["Final validation loss (mean of the workers' own models):", ""]
    out.lines += table(header, loss_rows)
    out.lines += ["Validation loss of the workers' average θ̄ at the end:", ""]
    out.lines += table(header, mean_rows)
    out.lines += ["Final consensus error:", "", *table(header, cons_rows)]
    return out


def straggler_target(mode: Mode, runs: dict[str, Run]) -> float:
    """A loss every straggler-section run reaches: the worst run's best loss, rounded up."""
    keys = {s.key for s in mode.sections["straggler"]}
    keys |= {s.key for s in _straggler_fixed(mode)}
    best = [min(v for _, _, v in runs[k].val_curve) for k in keys if k in runs]
    return math.ceil(max(best) * 100 + 1e-9) / 100 if best else float("nan")


def _straggler_fixed(mode: Mode) -> list[RunSpec]:
    """The homogeneous fixed-H runs that the straggler section re-times."""
    n = mode.h1_workers
    return [
        s
        for s in mode.sections["main"]
        if s.workers == n and s.method in ("DiLoCo", "GASLoC-1peer", "GASLoC-2peer")
    ]


def straggler_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    target = straggler_target(mode, runs)
    out.numbers["target"] = target
    fixed = [s for s in _straggler_fixed(mode) if s.seed == mode.seeds[0]]
    for fraction in (None, *mode.straggler_fractions):
        adaptive = [
            s
            for s in mode.sections["straggler"]
            if s.straggler == fraction and s.seed == mode.seeds[0]
        ]
        rows = []
        for spec in [*fixed, *adaptive]:
            found = seeds_of(runs, spec, mode.seeds)
            if not found:
                rows.append([spec.method, *["—"] * 7])
                continue
            clocks = [timed(r, mode, fraction) for r in found]
            reach = [c.time_to(target) for c in clocks]
            reached = [t for t in reach if t is not None]
            out.numbers[(spec.method, fraction)] = {
                "time": stat(reached) if len(reached) == len(reach) else None,
                "idle": stat(c.idle_fraction for c in clocks),
                "final": stat(r.final for r in found),
            }
            rounds = found[0].val_curve[-1][0]
            rows.append(
                [
                    spec.method,
                    stat(reached).fmt(0) if len(reached) == len(reach) else "not reached",
                    "",
                    f"{statistics.fmean(c.wall_clock_s for c in clocks) / rounds:.1f}",
                    stat(100 * c.idle_fraction for c in clocks).fmt(1),
                    f"{straggler_mean_h(found[0]):.1f} / {others_mean_h(found[0]):.1f}",
                    stat(r.final for r in found).fmt(),
                    "trained" if spec.adapt_h else "re-timed",
                ]
            )
        base = out.numbers.get(("DiLoCo", fraction), {}).get("time")
        for row in rows:
            t = out.numbers.get((row[0], fraction), {}).get("time")
            if base is not None and t is not None and t.mean > 0:
                row[2] = f"{base.mean / t.mean:.2f}×"
        title = "no straggler" if fraction is None else f"worker 0 at {fraction:.0%} bandwidth"
        out.lines += [f"**{title}** (target val loss {target:.2f})", ""]
        out.lines += table(
            [
                "method",
                "time to target (s)",
                "speed-up vs DiLoCo",
                "s / round",
                "idle %",
                "H straggler / others",
                "final val loss",
                "clock",
            ],
            rows,
        )
    return out


def straggler_curves(mode: Mode, runs: dict[str, Run], fraction: float) -> list[tuple[str, Timed]]:
    """Seed-0 curves of the straggler comparison on one network, for the plot."""
    specs = [s for s in _straggler_fixed(mode) if s.seed == mode.seeds[0]]
    specs += [
        s for s in mode.sections["straggler"] if s.straggler == fraction and s.seed == mode.seeds[0]
    ]
    return [(s.method, timed(runs[s.key], mode, fraction)) for s in specs if s.key in runs]


def outer_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    rows = []
    finals: dict[str, list[float]] = {"GASLoC-1peer": [], "DiLoCo": []}
    for lr in mode.outer_lrs:
        row = [f"η = {lr:g}"]
        for mom in mode.outer_momenta:
            cell = []
            for spec in mode.sections["outer"]:
                if spec.outer == (lr, mom):
                    run = runs.get(spec.key)
                    cell.append("—" if run is None else f"{run.final:.3f}")
                    if run is not None:
                        finals[spec.method].append(run.final)
            row.append(" / ".join(cell))
        rows.append(row)
    out.lines = table(["GASLoC-1peer / DiLoCo", *(f"μ = {m:g}" for m in mode.outer_momenta)], rows)
    for method, values in finals.items():
        if values:
            out.numbers[method] = (min(values), max(values))
            out.lines.append(
                f"- {method}: best {min(values):.3f}, worst {max(values):.3f}, "
                f"range {max(values) - min(values):.3f} over the {len(values)} settings"
            )
    out.lines.append("")
    return out


def h_sweep_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    rows = []
    for h in mode.h_sweep:
        row = [str(h), str(mode.budget.rounds(h))]
        for method in ("GASLoC-1peer", "DiLoCo"):
            spec = next(
                s for s in mode.sections["h_sweep"] if s.inner_steps == h and s.method == method
            )
            run = runs.get(spec.key)
            row.append("—" if run is None else f"{run.final:.3f}")
            if run is not None:
                out.numbers[(method, h)] = run.final
        rows.append(row)
    out.lines = table(["H", "rounds", "GASLoC-1peer", "DiLoCo"], rows)
    return out


BYTES_PER_PARAM = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}


def codec_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    specs = mode.sections["codec"]
    base_spec = next((s for s in specs if s.codec == "fp32"), None)
    base = runs.get(base_spec.key) if base_spec is not None else None
    rows = []
    for spec in specs:
        run = runs.get(spec.key)
        if run is None:
            rows.append([spec.codec, "—", "—", "—", "—"])
            continue
        delta = "" if base is None else f"{run.final - base.final:+.4f}"
        out.numbers[spec.codec] = run.final - base.final if base is not None else None
        rows.append(
            [
                spec.codec,
                f"≈{BYTES_PER_PARAM[spec.codec]}",
                f"{run.final:.4f}",
                delta,
                f"{run.final_consensus:.4f}",
            ]
        )
    out.lines = table(
        ["codec", "bytes / param", "final val loss", "Δ vs fp32", "final consensus"], rows
    )
    return out
