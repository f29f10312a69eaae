"""The report of the re-run with the daemon's round (``bench/paper.py --mode shared``).

The H=30 grid (8, 16 and 32 workers) and the straggler scenarios, trained by the
simulator that runs the daemon's protocol, beside the full grid's numbers, which the
simulator's own round produced (``paper.md``; its files in ``paper/``): a table sets the
two side by side, run by run. Besides the usual tables it shows what the protocol did in
each run: steps that filled the wait, failed exchanges, resyncs, and each worker's share
of time spent computing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import plots, straggler, tables
from .analysis import Run, filled_per_round
from .grid import Mode
from .report import CLOCK_LEGEND, Meta, _images, _rel, _setup, _straggler_model

# The straggler tables' legend, with idle as the time account books it since the
# simulator keeps the daemon's (the full grid's report keeps the older definition).
IDLE_BEFORE = (
    "Idle: time lost waiting on others (late partners, crawling at a partner's slower "
    "link, exchanges that failed at their deadline), share of all workers' time"
)
IDLE_NOW = (
    "Idle: time not spent on inner steps (own transfers included, as the daemon's time "
    "account books it), share of all workers' time"
)


def protocol_table(mode: Mode, runs: dict[str, Run]) -> list[str]:
    """One row per trained run: where its time went and what the round's rules did."""
    specs = [*mode.sections["main"], *mode.sections["straggler"]]
    rows = []
    for spec in specs:
        run = runs.get(spec.key)
        if run is None:
            continue
        s = run.summary
        compute = s.get("compute_fraction_per_worker") or [float("nan")]
        network = "no straggler" if spec.straggler is None else f"worker 0 at {spec.straggler:.0%}"
        rows.append(
            [
                spec.label,
                str(spec.workers),
                str(spec.seed),
                network,
                f"{s['wall_clock_s']:.0f}",
                f"{100 * s['idle_fraction']:.1f}",
                f"{100 * s.get('pace_fraction', 0.0):.1f}",
                f"{100 * min(compute):.0f}–{100 * max(compute):.0f}",
                f"{filled_per_round(run):.1f}",
                str(s.get("exchange_failures", 0)),
                str(s.get("resyncs", 0)),
                str(s.get("pace_timeouts", 0)),
                f"{run.final:.3f}",
                f"{s['real_elapsed_s']:.0f}",
            ]
        )
    header = [
        "run",
        "workers",
        "seed",
        "network",
        "simulated s",
        "idle %",
        "pace %",
        "compute % per worker (min–max)",
        "filled steps / worker / round",
        "failed exchanges",
        "resyncs",
        "pace timeouts",
        "final val loss",
        "real s",
    ]
    return tables.table(header, rows)


def against_own_round(mode: Mode, runs: dict[str, Run], old_dir: Path) -> list[str]:
    """Run by run, the daemon's round beside the simulator's own (the full grid's files,
    same spec, same seed): final loss and simulated time."""
    rows = []
    for spec in [*mode.sections["main"], *mode.sections["straggler"]]:
        run, path = runs.get(spec.key), old_dir / f"{spec.key}.json"
        if run is None or not path.is_file():
            continue
        old = json.loads(path.read_text())
        network = "—" if spec.straggler is None else f"{spec.straggler:.0%}"
        new_loss, old_loss = run.final, float(old["final_val_loss"])
        rows.append(
            [
                spec.label,
                str(spec.workers),
                str(spec.seed),
                network,
                f"{old_loss:.3f}",
                f"{new_loss:.3f}",
                f"{new_loss - old_loss:+.3f}",
                f"{old['wall_clock_s']:.0f}",
                f"{run.summary['wall_clock_s']:.0f}",
            ]
        )
    if not rows:
        return ["(no run of the full grid to compare with)", ""]
    header = [
        "run",
        "workers",
        "seed",
        "straggler",
        "final loss, own round",
        "final loss, daemon's round",
        "Δ",
        "simulated s, own round",
        "simulated s, daemon's round",
    ]
    return tables.table(header, rows)


def write_shared_report(
    mode: Mode, runs: dict[str, Run], meta: Meta, md_path: Path, png_dir: Path, json_dir: Path
) -> str:
    """Write ``paper_shared.md`` and its straggler plot; return the markdown."""
    png_dir.mkdir(parents=True, exist_ok=True)
    corpus = next(iter(runs.values())).summary["args"].get("corpus", "?") if runs else "?"
    main = tables.main_section(mode, runs)
    strag = straggler.straggler_section(mode, runs)
    targets = strag.numbers.get("targets", {})
    panels = [
        (
            f"worker 0 at {f:.0%} bandwidth (seed {mode.seeds[0]})",
            straggler.straggler_curves(mode, runs, f),
        )
        for f in mode.straggler_fractions
    ]
    pngs: dict[str, list[Path]] = {}
    if any(curves for _, curves in panels):
        path = png_dir / f"paper_{mode.name}_straggler.png"
        plots.loss_vs_time(panels, targets.get(mode.seeds[0], (None,))[0], path)
        pngs["straggler"] = [path]
    real = math.fsum(r.summary.get("real_elapsed_s", 0.0) for r in runs.values())
    lines = [
        "# GASLoC vs DiLoCo with the daemon's round (issue: one protocol, two clocks)",
        "",
        f"Generated by `bench/paper.py --mode {mode.name}`; every number below comes from the "
        f"JSON files in `{_rel(json_dir)}/`. The simulator runs the daemon's protocol "
        "(`gaslocd.protocol` through `gaslocd.sim.schedule`): pairings from the run id "
        "(`sim-<seed>`), H from measured estimates starting at H_base, T from published "
        "bandwidths, filling the wait, exchange deadlines, resyncs. "
        f"{len(runs)} runs, {real / 60:.1f} min of training summed.",
        "",
        "## Setup",
        "",
        *_setup(mode, meta, corpus, json_dir),
        "## What the round's rules did in each run",
        "",
        *protocol_table(mode, runs),
        "Idle: share of all workers' time not spent on inner steps (the daemon's time "
        "account: sending and receiving, waiting for partners, crawling at a partner's "
        "slower link, pacing, resyncs), so a fast network without stragglers still shows "
        "its transfers (2.1 s of a 14 s round here); the full grid's `paper.md` counted only "
        "the waiting. Pace: the part of it the protocol held workers back (waiting for a "
        "peer two rounds behind, a partnerless round lasting T). "
        "'pace timeouts': pace waits that hit their bound (the daemon would then run ahead "
        "of the slow peer, which the lockstep simulator cannot; 0 means it did not). "
        "Compute share: inner steps, filling the wait included.",
        "",
        f"## H={mode.h_main}, {', '.join(map(str, mode.workers))} workers "
        f"(seeds {', '.join(map(str, mode.seeds))}; "
        f"{', '.join(map(str, mode.single_seed_workers))} workers: seed {mode.seeds[0]} only)",
        "",
        *main.lines,
        "## Against the simulator's own round",
        "",
        "The same runs (spec and seed) in the full grid (`paper.md`), which the simulator's "
        "own round trained before it ran the daemon's. Fixed-H gossip and DiLoCo train the "
        "same steps on the same data in both, so a difference is the protocol's: exchange "
        "deadlines, resyncs, and the pairing seed (the run id `sim-<seed>` here, the "
        "training seed there); with adaptive H also the H the daemon's rules choose and "
        "filling the wait.",
        "",
        *against_own_round(mode, runs, json_dir.parent / "paper"),
        f"## A bandwidth straggler ({mode.h1_workers} workers, H_base={mode.h_main})",
        "",
        *_straggler_model(mode),
        "Targets: A = a loss every run of the section reaches, B = DiLoCo's final loss "
        "without a straggler: "
        + "; ".join(f"seed {seed}: A {a:.2f}, B {b:.2f}" for seed, (a, b) in targets.items())
        + ". '× vs DiLoCo' is DiLoCo's time over the method's. "
        + CLOCK_LEGEND.replace(IDLE_BEFORE, IDLE_NOW),
        "",
        *strag.lines,
        *_images(pngs, "straggler"),
    ]
    text = "\n".join(lines).rstrip() + "\n"
    md_path.write_text(text)
    return text
