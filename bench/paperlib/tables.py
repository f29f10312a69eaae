"""The report's tables, one function per claim; each returns markdown lines and the numbers
the findings quote. Markdown is built by hand: a table is a header, a rule and rows."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .analysis import Run, paired, seeds_of, stat
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


def _delta(values: list[float]) -> str:
    """A paired difference over seeds: mean ± half-range, and how many seeds agree in sign."""
    if not values:
        return "—"
    s = stat(values)
    if s.n == 1:
        return f"{s.mean:+.3f}"
    below = sum(v < 0 for v in values)
    return f"{s.mean:+.3f} ± {s.half_range:.3f} ({below}/{s.n} < 0)"


def _h1_row(label: str, found: list[Run], spec: RunSpec, delta: list[float]) -> list[str]:
    lr, mom = spec.outer
    return [
        label,
        f"{lr:g}, {mom:g}",
        f"{_msgs_per_round(found[0]):.2f}",
        stat(r.final for r in found).fmt(),
        _delta(delta),
        stat(r.summary["mean_model_val_loss"] for r in found).fmt(),
        stat(r.final_consensus for r in found).fmt(digits=4),
        f"{found[0].summary['wall_clock_s'] / 3600:.2f}",
    ]


def h1_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    best = best_h1_outer(mode, runs)
    rows = []
    dadam = [s for s in mode.sections["h1"] if s.algo == "dadam"]
    ref = dadam[0]  # DAdam-1peer, seed 0
    one_seed = [*mode.sections["h1_tune"], mode.sections["h1"][0]]
    for spec in one_seed:
        if spec.key in runs:
            delta = paired(runs, spec, ref, (spec.seed,))
            label = f"{spec.method} (seed {spec.seed} only)"
            rows.append(_h1_row(label, [runs[spec.key]], spec, delta))
    tuned = mode.tuned_h1(best) if best is not None else []
    for spec in [*tuned, *dadam]:
        if spec.seed != mode.seeds[0]:
            continue
        found = seeds_of(runs, spec, mode.seeds)
        if found:
            out.numbers[spec.method] = stat(r.final for r in found)
            out.numbers[(spec.method, "delta")] = paired(runs, spec, ref, mode.seeds)
            same_topology = replace(ref, topology=spec.topology)
            out.numbers[(spec.method, "vs same topology")] = paired(
                runs, spec, same_topology, mode.seeds
            )
            label = f"{spec.method} (tuned η, μ)" if spec.algo == "gasloc" else spec.method
            rows.append(_h1_row(label, found, spec, out.numbers[(spec.method, "delta")]))
    out.numbers["best"] = best
    out.lines = table(
        [
            "method (H=1)",
            "η, μ",
            "messages sent / worker / round",
            "final val loss",
            "Δ vs DAdam-1peer, same seed",
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
    loss_rows, delta_rows, mean_rows, cons_rows = [], [], [], []
    for method in MAIN_METHODS:
        loss_row, delta_row, mean_row, cons_row = [method], [method], [method], [method]
        for n in mode.workers:
            spec = by_method.get(method, {}).get(n)
            found = [] if spec is None else seeds_of(runs, spec, mode.seeds)
            if spec is None or not found:
                for row in (loss_row, delta_row, mean_row, cons_row):
                    row.append("(not run)" if spec is None else "—")
                continue
            final = stat(r.final for r in found)
            out.numbers[(method, n)] = final
            diloco = by_method["DiLoCo"][n]
            out.numbers[(method, n, "delta")] = paired(runs, spec, diloco, mode.seeds)
            delta_row.append(_delta(out.numbers[(method, n, "delta")]))
            out.numbers[(method, n, "mean")] = stat(r.summary["mean_model_val_loss"] for r in found)
            loss_row.append(final.fmt())
            mean_row.append(out.numbers[(method, n, "mean")].fmt())
            cons_row.append(stat(r.final_consensus for r in found).fmt(digits=4))
        loss_rows.append(loss_row)
        delta_rows.append(delta_row)
        mean_rows.append(mean_row)
        cons_rows.append(cons_row)
    header = [f"H={mode.h_main}", *(f"{n} workers" for n in mode.workers)]
    out.lines = ["Final validation loss (mean of the workers' own models):", ""]
    out.lines += table(header, loss_rows)
    out.lines += ["Difference to DiLoCo on the same seed (paired; negative: better):", ""]
    out.lines += table(header, delta_rows)
    out.lines += ["Validation loss of the workers' average θ̄ at the end:", ""]
    out.lines += table(header, mean_rows)
    out.lines += ["Final consensus error:", "", *table(header, cons_rows)]
    return out


def ceil2(x: float) -> float:
    return math.ceil(x * 100 - 1e-9) / 100


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


H_SWEEP_METHODS = ("GASLoC-1peer", "DiLoCo", "Local-DAdam-2peer")


def h_sweep_section(mode: Mode, runs: dict[str, Run]) -> Section:
    out = Section()
    rows = []
    for h in mode.h_sweep:
        row = [str(h), str(mode.budget.rounds(h))]
        for method in H_SWEEP_METHODS:
            spec = next(
                s for s in mode.sections["h_sweep"] if s.inner_steps == h and s.method == method
            )
            run = runs.get(spec.key)
            row.append("—" if run is None else f"{run.final:.3f}")
            if run is not None:
                out.numbers[(method, h)] = run.final
        rows.append(row)
    out.lines = table(["H", "rounds", *H_SWEEP_METHODS], rows)
    return out


def long_section(mode: Mode, runs: dict[str, Run]) -> Section:
    """The H=h_main comparison at 1× and ``long_scale``× the budget (seed 0, n=h1_workers)."""
    out = Section()
    rows = []
    scale = mode.long_scale
    for spec in mode.sections["long"]:
        short = runs.get(replace(spec, budget_scale=1).key)
        long = runs.get(spec.key)
        cells = [spec.method]
        for run in (short, long):
            if run is None:
                cells += ["—", "—"]
            else:
                cells += [f"{run.final:.3f}", f"{run.summary['mean_model_val_loss']:.3f}"]
        if short is not None and long is not None:
            out.numbers[spec.method] = (short.final, long.final)
        rows.append(cells)
    r1, r2 = mode.budget.rounds(mode.h_main), mode.budget.rounds(mode.h_main, scale)
    out.lines = table(
        [
            "method",
            f"{r1} rounds: val loss",
            "mean model",
            f"{r2} rounds: val loss",
            "mean model",
        ],
        rows,
    )
    return out


def diagnose_section(mode: Mode, runs: dict[str, Run]) -> Section:
    """Small-H runs that separate the outer momentum's effect on consensus by topology."""
    out = Section()
    h = min(mode.h_sweep)
    specs = [s for s in mode.sections["h_sweep"] if s.inner_steps == h]
    specs += mode.sections["diagnose"]
    rows = []
    for spec in specs:
        run = runs.get(spec.key)
        lr, mom = spec.outer
        if run is None:
            rows.append([spec.method, f"{lr:g}, {mom:g}", "—", "—", "—"])
            continue
        out.numbers[(spec.method, spec.outer)] = run.final
        rows.append(
            [
                spec.method,
                f"{lr:g}, {mom:g}",
                f"{run.final:.3f}",
                f"{run.summary['mean_model_val_loss']:.3f}",
                f"{run.final_consensus:.4f}",
            ]
        )
    header = [f"H={h}, {mode.budget.rounds(h)} rounds", "η, μ", "final val loss"]
    out.lines = table([*header, "mean model", "consensus"], rows)
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
