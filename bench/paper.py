"""Reproduce the GASLoC paper's comparisons at CPU scale, in one command (issue 5).

    .venv/bin/python bench/paper.py --quick            # smoke check, a few minutes
    nice -n 10 .venv/bin/python bench/paper.py --jobs 2   # the full grid, about an hour+

Trains every run of the grid (``bench/paperlib/grid.py``) with the simulator, one JSON
summary per run, then writes the report (``paper.md``: tables and findings) and PNG plots.
Finished runs are cached: rerunning resumes an interrupted grid, and ``--report-only``
rebuilds the report from the JSON files without training anything.

Full mode writes into ``bench/results/`` (``paper.md``, ``paper_*.png``, ``paper/*.json``);
``--quick`` into a scratch folder (``--out`` to choose), so a smoke check never overwrites
the committed results.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paperlib.analysis import Run
from paperlib.execute import run_all
from paperlib.grid import MODES, Mode, RunSpec
from paperlib.report import Meta, record_invocation, write_report
from paperlib.tables import best_h1_outer

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = (
    "h1",
    "main",
    "long",
    "straggler",
    "straggler_long",
    "outer",
    "h_sweep",
    "diagnose",
    "codec",
)


def paths(mode: Mode, out: Path | None) -> tuple[Path, Path, Path]:
    """(JSON folder, markdown file, PNG folder) of a mode."""
    if out is None:
        out = RESULTS if mode.name == "full" else Path("/tmp/gaslocd-paper-quick")
    stem = "paper" if mode.name == "full" else f"paper_{mode.name}"
    return out / stem, out / f"{stem}.md", out


def run(
    mode: Mode,
    *,
    out: Path | None = None,
    jobs: int = 1,
    sections: tuple[str, ...] = SECTIONS,
    train: bool = True,
    command: str = "",
    log: Callable[[str], None] = print,
) -> Path:
    """Train what is missing, write the report; return the markdown's path."""
    began = time.perf_counter()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    json_dir, md_path, png_dir = paths(mode, out)
    json_dir.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict[str, Any]] = {}
    trained = 0
    specs: list[RunSpec] = []
    if "h1" in sections:  # the tuned H=1 runs depend on the tuning runs: those go first
        specs = mode.all_runs(("h1_tune",))
        summaries, trained = run_all(specs, mode, json_dir, jobs=jobs, train=train, log=log)
        done = {s.key: Run(s, summaries[s.key]) for s in specs if s.key in summaries}
        best = best_h1_outer(mode, done)
        if best is not None:
            log(
                f"H=1 GASLoC outer settings: η={best[0]:g}, μ={best[1]:g} (best of the tuning runs)"
            )
            specs += mode.tuned_h1(best)
    specs += mode.all_runs(sections)
    specs = list({s.key: s for s in specs}.values())
    more, trained_more = run_all(specs, mode, json_dir, jobs=jobs, train=train, log=log)
    summaries |= more
    trained += trained_more
    runs = {spec.key: Run(spec, summaries[spec.key]) for spec in specs if spec.key in summaries}
    meta = Meta(
        command=command,
        started=started,
        wall_s=time.perf_counter() - began,
        trained=trained,
        train_s=sum(r.summary.get("real_elapsed_s", 0.0) for r in runs.values()),
        jobs=jobs,
    )
    if trained:
        record_invocation(json_dir, meta)
    write_report(mode, runs, meta, md_path, png_dir, json_dir)
    log(f"{len(runs)}/{len(specs)} runs reported in {md_path} ({meta.wall_s / 60:.1f} min)")
    return md_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny grid for a smoke check (minutes)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once (one core each)")
    p.add_argument("--out", type=Path, default=None, help="results folder (see module doc)")
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} to train and report",
    )
    p.add_argument("--report-only", action="store_true", help="train nothing; report the cache")
    args = p.parse_args(argv)
    sections = tuple(s for s in args.sections.split(",") if s)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections: {', '.join(sorted(unknown))}")
    command = "python bench/paper.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    run(
        MODES["quick" if args.quick else "full"],
        out=args.out,
        jobs=args.jobs,
        sections=sections,
        train=not args.report_only,
        command=command.strip(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
