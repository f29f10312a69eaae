"""Reproduce the GASLoC paper's comparisons at CPU scale, in one command (issue 5).

    .venv/bin/python bench/paper.py --quick            # smoke check, a few minutes
    nice -n 10 .venv/bin/python bench/paper.py --mode shared   # the 8-worker slice, ~25 min
    nice -n 10 .venv/bin/python bench/paper.py --jobs 2   # the full grid, hours

Trains every run of the grid (``bench/paperlib/grid.py``) with the simulator, one JSON
summary per run, then writes the report (``paper.md``: tables and findings) and PNG plots.
Finished runs are cached: rerunning resumes an interrupted grid, and ``--report-only``
rebuilds the report from the JSON files without training anything.

Full mode writes into ``bench/results/`` (``paper.md``, ``paper_*.png``, ``paper/*.json``),
``--mode shared`` (the re-run of the 8-worker, H=30 and straggler comparisons with the
daemon's round) into ``bench/results/paper_shared*``; ``--quick`` into a scratch folder
(``--out`` to choose), so a smoke check never overwrites the committed results.

The committed full grid (``paper.md``) was trained by the simulator's own round, before
it ran the daemon's; its files carry no ``protocol`` tag, so they are not reused: the
full mode retrains everything, and refuses to rewrite a report from an empty cache.
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

from paperlib import decay
from paperlib.analysis import Run
from paperlib.execute import run_all
from paperlib.grid import MODES as GRIDS
from paperlib.grid import Mode, RunSpec
from paperlib.report import Meta, record_invocation, write_report
from paperlib.shared import write_shared_report
from paperlib.tables import best_h1_outer

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {**GRIDS, "decay": decay.DECAY}
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
        kept = mode.name in ("full", "shared", "decay")  # the committed grids
        out = RESULTS if kept else Path("/tmp/gaslocd-paper-quick")
    stem = "paper" if mode.name == "full" else f"paper_{mode.name}"
    return out / stem, out / f"{stem}.md", out


def run(
    mode: Mode,
    *,
    out: Path | None = None,
    jobs: int = 1,
    sections: tuple[str, ...] | None = None,
    train: bool = True,
    command: str = "",
    log: Callable[[str], None] = print,
) -> Path:
    """Train what is missing, write the report; return the markdown's path.

    ``sections``: a subset of the mode's (None: all of them)."""
    began = time.perf_counter()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    json_dir, md_path, png_dir = paths(mode, out)
    json_dir.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict[str, Any]] = {}
    trained = 0
    specs: list[RunSpec] = []
    if sections is None:
        sections = decay.SECTIONS if isinstance(mode, decay.DecayMode) else SECTIONS
    if isinstance(mode, decay.DecayMode):  # its own sections, the longest runs first
        specs = decay.ordered(mode, sections)
        sections = ()
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
    if not runs:
        raise SystemExit(f"no run of {mode.name!r} is trained yet: {md_path} left as it is")
    if isinstance(mode, decay.DecayMode):  # imported here: not needed to train
        from paperlib.decay_report import write_decay_report

        write_decay_report(mode, runs, meta, md_path, png_dir, json_dir)
    else:
        writer = write_shared_report if mode.name == "shared" else write_report
        writer(mode, runs, meta, md_path, png_dir, json_dir)
    log(f"{len(runs)}/{len(specs)} runs reported in {md_path} ({meta.wall_s / 60:.1f} min)")
    return md_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny grid for a smoke check (minutes)")
    p.add_argument(
        "--mode",
        choices=sorted(MODES),
        default=None,
        help="which grid: full (default), quick (= --quick), shared (the re-run slice), "
        "decay (issue 17: a decayed inner LR, the missing sweeps, the noise-scale study)",
    )
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once (one core each)")
    p.add_argument("--out", type=Path, default=None, help="results folder (see module doc)")
    p.add_argument(
        "--sections",
        default="",
        help=f"comma-separated subset of {','.join(SECTIONS)} to train and report "
        "(default: all; main,straggler for --mode shared)",
    )
    p.add_argument("--report-only", action="store_true", help="train nothing; report the cache")
    args = p.parse_args(argv)
    mode = MODES[args.mode or ("quick" if args.quick else "full")]
    known = decay.SECTIONS if isinstance(mode, decay.DecayMode) else SECTIONS
    default = ("main", "straggler") if mode.name == "shared" else known
    sections = tuple(s for s in args.sections.split(",") if s) if args.sections else default
    unknown = set(sections) - set(known)
    if unknown:
        p.error(f"unknown sections: {', '.join(sorted(unknown))}")
    command = "python bench/paper.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    run(
        mode,
        out=args.out,
        jobs=args.jobs,
        sections=sections,
        train=not args.report_only,
        command=command.strip(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
