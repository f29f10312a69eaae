"""Assemble ``paper.md`` and the PNG plots from the runs' summaries."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from . import findings, plots, straggler, tables
from .analysis import Run
from .grid import Mode

NOTES = "paper_notes.md"  # hand-written discussion, included verbatim when present


@dataclass(frozen=True)
class Meta:
    command: str
    started: str  # ISO date-time
    wall_s: float  # real time of the invocation that wrote the report
    trained: int  # runs trained by that invocation (the rest were cached)
    train_s: float  # real time summed over every run's training, cached ones included
    jobs: int


INVOCATIONS = "invocations.json"  # every invocation that trained runs, appended in order


def record_invocation(json_dir: Path, meta: Meta) -> None:
    """Append ``meta`` (with this machine) to the JSON folder's list of training invocations.

    The report then states how long the grid really took even when it was trained over
    several invocations (an interrupted grid resumes) and the report is rebuilt later.
    """
    path = json_dir / INVOCATIONS
    entries = json.loads(path.read_text()) if path.is_file() else []
    entries.append(asdict(meta) | {"machine": machine()})
    path.write_text(json.dumps(entries, indent=1) + "\n")


def _invocations(json_dir: Path) -> list[str]:
    path = json_dir / INVOCATIONS
    if not path.is_file():
        return []
    lines = []
    for e in json.loads(path.read_text()):
        lines.append(
            f"  - `{e['command']}` started {e['started']}: {e['wall_s'] / 60:.1f} min real, "
            f"{e['trained']} runs trained, {e['jobs']} at a time"
            + (f"; {e['note']}" if e.get("note") else "")
        )
    return ["- training invocations (real time):", *lines]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    u = platform.uname()
    return (
        f"`{u.system} {u.release} {u.machine}`, {os.cpu_count()} CPUs ({cpu}), "
        f"Python {platform.python_version()}, torch {torch.__version__}, 1 torch thread per run"
    )


def _setup(mode: Mode, meta: Meta, corpus: str, json_dir: Path) -> list[str]:
    b, net = mode.budget, mode.network
    compute = mode.h_main * net.step_time_s
    transfer = net.message_bytes / (net.bandwidth_mbps * 1e6 / 8)
    return [
        f"- report written by: `{meta.command}` on {meta.started} ({meta.wall_s / 60:.1f} "
        f"min, {meta.trained} runs trained by it); machine: {machine()}",
        *_invocations(json_dir),
        f"- {meta.train_s / 60:.1f} min of real time summed over the single runs in the "
        "tables (a run's time depends on what else the machine was running)",
        f"- model `tiny` (246,240 parameters); corpus: {corpus}",
        f"- budget per worker, every run: {b.steps_per_worker} AdamW steps of {b.batch_size} × "
        f"{b.seq_len} tokens = {b.tokens_per_worker:,} tokens; inner lr {b.inner_lr:g} after "
        f"{b.warmup_steps} warm-up steps, weight decay 0.1, clip 1.0",
        f"- validation loss: mean of the workers' own models on {b.eval_batches} fixed held-out "
        f"batches, about {b.evals_per_run} times per run; seeds {', '.join(map(str, mode.seeds))}; "
        "`a ± b` is the mean over seeds ± half their range",
        "- simulated clock (it shapes the training too: adaptive H, filling the wait, "
        f"exchange deadlines): step "
        f"{net.step_time_s:g} s, message {net.message_bytes / 1e6:.0f} MB (134M parameters × "
        f"2 bytes), {net.bandwidth_mbps:g} Mbit/s links, {net.latency_ms:g} ms latency. "
        f"H={mode.h_main} is {compute:.1f} s of compute per round against {transfer:.2f} s for "
        "one exchange on a normal link",
        "- outer settings unless stated: GASLoC and DiLoCo η=0.7, μ=0.9 (Nesterov); "
        "DAdam and Local-DAdam η=1, μ=0 (plain gossip of θ̃)",
        "",
    ]


def _straggler_model(mode: Mode) -> list[str]:
    """The clock arithmetic behind the straggler tables, from the network's numbers."""
    net, h, n = mode.network, mode.h_main, mode.h1_workers
    bw = net.bandwidth_mbps * 1e6 / 8
    lat = net.latency_ms / 1000
    x = lat + net.message_bytes / bw
    target = h * net.step_time_s + x
    ring = 2 * (n - 1) / n * net.message_bytes
    lines = [
        f"Clock arithmetic ({n} workers): one exchange takes {x:.2f} s on a normal link; "
        f"DESIGN §1's target round time is T = H·s + typical transfer = {target:.2f} s. "
        f"A DiLoCo ring all-reduce moves {ring / 1e6:.0f} MB per worker at the slowest link's "
        f"speed: {2 * (n - 1) * lat + ring / bw:.2f} s with equal links.",
        "",
    ]
    for f in mode.straggler_fractions:
        xs = lat + net.message_bytes / (bw * f)
        h_s = max(1, round((target - xs) / net.step_time_s))
        fits = xs + net.step_time_s <= target
        lines.append(
            f"- {f:.0%}: the straggler's exchange takes {xs:.1f} s; DiLoCo's all-reduce "
            f"{2 * (n - 1) * lat + ring / (bw * f):.1f} s every round. Adaptive H gives the "
            f"straggler and its partner H ≈ {h_s}"
            + (
                f", and the pair ends on time ({h_s * net.step_time_s + xs:.1f} s ≤ T)."
                if fits
                else f" (H_min), and the pair still ends {xs + net.step_time_s - target:.1f} s "
                "after T: the slow transfer alone exceeds T, so no H can hide it and the "
                "straggler's next partners wait (with adaptive H, training on: filling the "
                "wait)."
            )
        )
    return [*lines, ""]


CLOCK_LEGEND = (
    "'trained': the run trained on this network (the daemon's round: exchange deadlines, "
    "filling the wait and resyncs make even a fixed-H gossip run depend on its network); "
    "'re-timed': a run from (2) timed on this network with `gaslocd.sim.replay`, which "
    "replays the protocol without models and refuses unless every round's H, filled steps "
    "and W come out the same (so the models are the same; DiLoCo, a barrier all-reduce "
    "with a fixed H, always does). Idle: time lost waiting on others (late partners, "
    "crawling at a partner's slower link, exchanges that failed at their deadline), share "
    "of all workers' time; filling the wait is compute. Filled steps: steps trained after "
    "the planned H while waiting for partners, per worker and round."
)


def write_report(
    mode: Mode, runs: dict[str, Run], meta: Meta, md_path: Path, png_dir: Path, json_dir: Path
) -> str:
    """Write the markdown report and its plots; return the markdown."""
    png_dir.mkdir(parents=True, exist_ok=True)
    prefix = "paper" if mode.name == "full" else f"paper_{mode.name}"
    corpus = next(iter(runs.values())).summary["args"].get("corpus", "?") if runs else "?"
    h1 = tables.h1_section(mode, runs)
    main = tables.main_section(mode, runs)
    strag = straggler.straggler_section(mode, runs)
    outer = tables.outer_section(mode, runs)
    hs = tables.h_sweep_section(mode, runs)
    long = tables.long_section(mode, runs)
    diag = tables.diagnose_section(mode, runs)
    codec = tables.codec_section(mode, runs)
    targets = strag.numbers.get("targets", {})
    pngs = _plots(mode, runs, png_dir, prefix, targets.get(mode.seeds[0], (None,))[0])
    lines = [
        "# GASLoC paper comparisons at CPU scale (issue 5)",
        "",
        "Generated by `bench/paper.py`; every number below comes from the JSON files in "
        f"`{_rel(json_dir)}/` (one per run, each with its `gaslocd simulate` command).",
        "",
        "## Setup",
        "",
        *_setup(mode, meta, corpus, json_dir),
        "## Findings",
        "",
        f"- {findings.claim1(h1.numbers)}",
        f"- {findings.claim2(mode, main.numbers)}",
        f"- {findings.claim3(mode, strag.numbers)}",
        f"- {findings.claim4(outer.numbers, hs.numbers, mode)}",
        "",
    ]
    notes = md_path.parent / NOTES
    if mode.name == "full" and notes.is_file():
        lines += [notes.read_text().rstrip(), ""]
    lines += [
        f"## (1) One local step per round (H=1, {mode.h1_workers} workers)",
        "",
        *h1.lines,
        *_images(pngs, "h1"),
        f"## (2) H={mode.h_main}: GASLoC vs DiLoCo vs Local-DAdam",
        "",
        *main.lines,
        *_images(pngs, "main"),
        f"A longer horizon ({mode.h1_workers} workers, seed {mode.seeds[0]}, H={mode.h_main}, "
        f"{mode.long_scale}× the token budget): does the ranking change with more rounds?",
        "",
        *long.lines,
        f"## (3) A bandwidth straggler ({mode.h1_workers} workers, H_base={mode.h_main})",
        "",
        *_straggler_model(mode),
        "Targets, per seed (a seed moves every method's loss together): A = a loss every "
        "run of the section reaches on that seed, B = DiLoCo's final loss without a straggler "
        "(runs that do less compute may not reach it): "
        + "; ".join(f"seed {seed}: A {a:.2f}, B {b:.2f}" for seed, (a, b) in targets.items())
        + ". '× vs DiLoCo' is DiLoCo's time over the method's on the same seed, averaged. "
        f"Rows '({mode.long_scale}× rounds)' (seed {mode.seeds[0]}) run {mode.long_scale}× the "
        "token budget, so a method that finishes its rounds sooner on the clock can go on to "
        "lower losses (target B); they compare with DiLoCo run as long. "
        "Time to target is interpolated between validation points on the simulated clock. "
        + CLOCK_LEGEND,
        "",
        *strag.lines,
        *_images(pngs, "straggler"),
        f"## (4) Sensitivity ({mode.h1_workers} workers, seed {mode.seeds[0]})",
        "",
        f"Outer learning rate η × momentum μ at H={mode.h_main} (final validation loss):",
        "",
        *outer.lines,
        "Local steps H at the same token budget (fewer rounds for larger H):",
        "",
        *hs.lines,
        f"GASLoC-1peer at small H: the same H={min(mode.h_sweep)} with other topologies "
        "and outer settings (seed 0), to tell gossip from the outer setting:",
        "",
        *diag.lines,
        f"## Codecs (GASLoC-1peer, H={mode.h_main}, {mode.h1_workers} workers, seed "
        f"{mode.seeds[0]}, error feedback on)",
        "",
        *codec.lines,
    ]
    text = "\n".join(lines).rstrip() + "\n"
    md_path.write_text(text)
    return text


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _images(pngs: dict[str, list[Path]], group: str) -> list[str]:
    return [f"![{p.stem}]({p.name})" for p in pngs.get(group, [])] + [""]


def _plots(
    mode: Mode, runs: dict[str, Run], png_dir: Path, prefix: str, target: Any
) -> dict[str, list[Path]]:
    s0 = mode.seeds[0]
    out: dict[str, list[Path]] = {}
    best = tables.best_h1_outer(mode, runs)
    h1_specs = [
        *(mode.tuned_h1(best) if best is not None else []),
        *(s for s in mode.sections["h1"] if s.algo == "dadam"),
    ]
    h1 = [runs[s.key] for s in h1_specs if s.seed == s0 and s.key in runs]
    if h1:
        path = png_dir / f"{prefix}_h1.png"
        title = f"H=1, {mode.h1_workers} workers (seed {s0})"
        if best is not None:
            title += f"; GASLoC with its tuned η={best[0]:g}, μ={best[1]:g}"
        plots.loss_and_consensus(h1, title, path)
        out["h1"] = [path]
    for n in mode.workers:
        group = [
            runs[s.key]
            for s in mode.sections["main"]
            if s.workers == n and s.seed == s0 and s.key in runs
        ]
        if group:
            path = png_dir / f"{prefix}_h{mode.h_main}_n{n}.png"
            plots.loss_and_consensus(group, f"H={mode.h_main}, {n} workers (seed {s0})", path)
            out.setdefault("main", []).append(path)
    for long, suffix in ((False, ""), (True, "_long")):
        horizon = f", {mode.long_scale}× rounds" if long else ""
        panels = [
            (
                f"worker 0 at {f:.0%} bandwidth (seed {s0}{horizon})",
                straggler.straggler_curves(mode, runs, f, long=long),
            )
            for f in mode.straggler_fractions
        ]
        if any(curves for _, curves in panels):
            path = png_dir / f"{prefix}_straggler{suffix}.png"
            plots.loss_vs_time(panels, target, path)
            out.setdefault("straggler", []).append(path)
    return out
