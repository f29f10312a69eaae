"""Stragglers whose link cannot carry the model within a round, in the simulator (issue 13).

    .venv/bin/python bench/stragglers.py              # the committed grid (6 workers), ~25 min
    .venv/bin/python bench/stragglers.py --quick      # a smoke check, a few minutes
    .venv/bin/python bench/stragglers.py --report-only

Every run is ``gaslocd simulate``'s own round (the daemon's protocol on a simulated clock)
with a fixed step time, so the clock does not depend on this machine's load and a run is
reproducible from its seed. The network: ``--workers`` peers whose fp16 exchange takes a
fifth of the round time T = H × step time, and stragglers whose link is slower by a factor
that makes their fp16 transfer 1×, 3× or 10× T (one straggler), or 3× and 10× (two).

Per scenario it compares GASLoC as a daemon runs it with ``--overlap`` (adaptive H, a codec
per link, long exchanges and sitting out) with DiLoCo (a barrier all-reduce every round,
the reference) and with the same GASLoC without any straggler, and reports the issue's
targets: time to DiLoCo's final loss (≤ 0.6× DiLoCo's time), cost against no straggler
(≤ 1.15×), every non-straggler's compute share (≥ 90 %). With no straggler, it measures
what overlap and each codec cost at equal tokens (≤ 0.01 final loss). Writes
``bench/results/stragglers.md``, PNG plots and the runs' JSON (``stragglers/``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

STEP_S = 0.5  # the simulated inner step
FAST_SHARE = 0.2  # a normal link moves fp16 θ̃ in this share of T


@dataclass(frozen=True)
class Run:
    name: str
    algo: str  # gasloc | diloco
    slow: tuple[float, ...] = ()  # per straggler: its fp16 transfer in units of T
    overlap: bool = True
    adapt_codec: bool = True
    codec: str = "fp16"
    adapt_h: bool = True
    seed: int | None = None  # None: the grid's
    longer: int = 1  # runs this many times the grid's rounds
    gossip: str = "momentum"  # --gossip (docs/design.md §1: "direct" keeps the mix out of m)
    schedule: str = "own"  # the inner LR schedule, one of SCHEDULES
    link: float = 1.0  # every link's bandwidth in units of the grid's normal link

    def argv(self, g: Grid, message_bytes: int) -> list[str]:
        """The ``gaslocd simulate`` command line of this run."""
        t = g.inner_steps * STEP_S
        nominal_mbps = self.link * message_bytes * 8 / 1e6 / (FAST_SHARE * t)
        argv = [
            "simulate", "--workers", str(g.workers), "--rounds", str(g.rounds * self.longer),
            "--inner-steps", str(g.inner_steps), "--step-time", str(STEP_S),
            "--bandwidth", f"{nominal_mbps:.6g}", "--latency", "20", "--codec", self.codec,
            "--eval-every", str(g.eval_every), "--run-id", "stragglers",
            "--seed", str(g.seed if self.seed is None else self.seed),
            "--topology", "complete" if self.algo == "diloco" else g.topology,
        ]  # fmt: skip
        if self.schedule == "constant":
            argv += ["--lr-schedule", "constant"]
        elif self.schedule == "shared":  # DiLoCo's budget: its rounds of H steps
            argv += ["--total-steps", str(g.rounds * g.inner_steps)]
        if self.algo == "diloco":
            argv += ["--algo", "diloco"]
        else:
            argv += ["--adapt-h"] if self.adapt_h else []
            argv += ["--overlap"] if self.overlap else []
            argv += ["--adapt-codec"] if self.adapt_codec else []
            argv += ["--gossip", self.gossip] if self.gossip != "momentum" else []
        for k, ratio in enumerate(self.slow):  # fp16 transfer = ratio × T
            argv += ["--straggler", f"{k}:{FAST_SHARE / ratio:.6g}"]
        return argv


@dataclass(frozen=True)
class Grid:
    workers: int
    rounds: int
    inner_steps: int
    eval_every: int
    topology: str
    seed: int


# The inner LR schedule of the scenario runs. "own": simulate's default, a cosine decay over
# each run's own rounds, so DiLoCo's final loss comes from a schedule GASLoC's 3× longer
# runs do not share (at this scale a short decayed run ends higher:
# bench/results/paper_decay.md). The time to DiLoCo's final loss is a fair ratio only when
# both train on one schedule: "shared" decays every run over DiLoCo's budget (the grid's
# rounds × H inner steps, the floor after), "constant" does not decay at all.
SCHEDULES = ("own", "shared", "constant")
FAIR = ("shared", "constant")

SEQUENTIAL = ("3x", "10x")  # scenarios also run without overlap and codec per link
SCENARIOS: dict[str, tuple[float, ...]] = {
    "1x": (1.0,),
    "3x": (3.0,),
    "10x": (10.0,),
    "3x+10x": (3.0, 10.0),
}


# Equal tokens, no straggler: what overlap and each codec cost. Fixed H (filling the wait
# would give the sequential runs more steps than the overlapped ones), three seeds (one
# seed's 20 rounds scatter by a few hundredths).
EQUAL_SEEDS = (0, 1, 2)
# With --gossip direct an overlapped round's landing moves θ by the mix alone, not by
# η(1 + μ) times it: is overlap cheaper there? Each run is compared with its reference.
# Overlap's cost is the steps a round trains from the eager point before the exchange
# lands (fp16 on a normal link: 3 of H = 10): the same overlap on a link 100× faster lands
# after the first step, int8 after 2 and q4 after 1.
EQUAL = {  # name: (overlap, a codec per link, codec, gossip, link, reference)
    "sequential-fp16": (False, False, "fp16", "momentum", 1.0, "sequential-fp16"),
    "overlap-fp16": (True, False, "fp16", "momentum", 1.0, "sequential-fp16"),
    "overlap-adaptive": (True, True, "fp16", "momentum", 1.0, "sequential-fp16"),
    "sequential-int8": (False, False, "int8", "momentum", 1.0, "sequential-fp16"),
    "sequential-q4": (False, False, "q4", "momentum", 1.0, "sequential-fp16"),
    "sequential-direct": (False, False, "fp16", "direct", 1.0, "sequential-fp16"),
    "overlap-direct": (True, False, "fp16", "direct", 1.0, "sequential-direct"),
    "overlap-fp16-fast-link": (True, False, "fp16", "momentum", 100.0, "sequential-fp16"),
    "overlap-int8": (True, False, "int8", "momentum", 1.0, "sequential-fp16"),
    "overlap-q4": (True, False, "q4", "momentum", 1.0, "sequential-fp16"),
}


# GASLoC's scenario runs take this many times the grid's rounds: its rounds last T while
# DiLoCo's wait for the straggler's all-reduce, so in the grid's rounds GASLoC stops long
# before DiLoCo's final loss (and its time to that loss could not be measured).
LONGER = 3


def runs() -> list[Run]:
    out = [Run("gasloc-none", "gasloc", longer=LONGER), Run("diloco-none", "diloco")]
    for name, (overlap, adaptive, codec, gossip, link, _) in EQUAL.items():
        out += [
            Run(f"{name}-s{s}", "gasloc", (), overlap, adaptive, codec, False, s, gossip=gossip,
                link=link)
            for s in EQUAL_SEEDS
        ]  # fmt: skip
    for tag, slow in SCENARIOS.items():
        out += [
            Run(f"gasloc-{tag}", "gasloc", slow, longer=LONGER),
            Run(f"diloco-{tag}", "diloco", slow),
        ]
        if tag in SEQUENTIAL:  # what overlap, codecs and sitting out buy
            name = f"gasloc-sequential-{tag}"
            out.append(Run(name, "gasloc", slow, False, False, longer=LONGER))
    for schedule in FAIR:  # the scenarios again, DiLoCo and GASLoC on one schedule
        out.append(Run(f"gasloc-none@{schedule}", "gasloc", longer=LONGER, schedule=schedule))
        for tag, slow in SCENARIOS.items():
            out += [
                Run(f"gasloc-{tag}@{schedule}", "gasloc", slow, longer=LONGER, schedule=schedule),
                Run(f"diloco-{tag}@{schedule}", "diloco", slow, schedule=schedule),
            ]
    return out


def _simulate(argv: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "gaslocd", *argv, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return dict(json.loads(out.read_text()))


def simulate_all(todo: dict[str, list[str]], data: Path, jobs: int) -> None:
    """Run each ``gaslocd simulate`` command line of ``todo``, its summary to
    ``data/<name>.json``, ``jobs`` at a time (other simulator benches use it too)."""
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {n: pool.submit(_simulate, a, data / f"{n}.json") for n, a in todo.items()}
        for name, fut in futures.items():
            fut.result()
            print(f"done {name}", flush=True)


def message_bytes_fp16(model: str) -> int:
    """fp16 bytes of the model's θ̃ (what a normal link must carry in a fifth of T)."""
    from gaslocd.train.model import build_model

    numel = sum(
        p.numel() for p in build_model(model, vocab_size=256, seq_len=128, seed=0).parameters()
    )
    return 2 * numel


# -- analysis: pure functions of the summaries (tested in tests/bench) -----------------------


def curve(summary: dict[str, Any]) -> list[tuple[float, float]]:
    """(simulated seconds, mean validation loss) per evaluated round."""
    return [(p["wall_clock_s"], p["val_loss"]) for p in summary["val_loss_curve"]]


def time_to(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """First time at or below ``target``, linearly interpolated between evaluations."""
    prev: tuple[float, float] | None = None
    for t, loss in points:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return t
            t0, l0 = prev
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        prev = (t, loss)
    return None


def compute_shares(summary: dict[str, Any], slow: int) -> tuple[float, float | None]:
    """(lowest compute share among non-stragglers, the lowest straggler share or None).
    The simulator's peers are w000.. and the stragglers are the first ``slow`` of them."""
    shares = summary["compute_fraction_per_worker"]
    others = shares[slow:]
    return min(others), (min(shares[:slow]) if slow else None)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def verdict(value: float | None, limit: float, below: bool = True) -> str:
    if value is None:
        return "not reached"
    ok = value <= limit if below else value >= limit
    return "met" if ok else "MISSED"


def analyse(results: dict[str, dict[str, Any]], schedule: str = "own") -> list[dict[str, Any]]:
    """One row per straggler scenario with the issue's three targets, of the runs on
    ``schedule`` (none when they have not run)."""
    at = "" if schedule == "own" else f"@{schedule}"
    rows: list[dict[str, Any]] = []
    base = results.get(f"gasloc-none{at}")
    for tag, slow in SCENARIOS.items():
        g, d = results.get(f"gasloc-{tag}{at}"), results.get(f"diloco-{tag}{at}")
        if base is None or g is None or d is None:
            continue
        seq = results.get(f"gasloc-sequential-{tag}{at}")
        target = d["final_val_loss"]
        t_g, t_d = time_to(curve(g), target), time_to(curve(d), target)
        common = max(g["final_val_loss"], base["final_val_loss"])
        t_gc, t_base = time_to(curve(g), common), time_to(curve(base), common)
        others, straggler = compute_shares(g, len(slow))
        rows.append(
            {
                "scenario": tag,
                "diloco_final": target,
                "gasloc_final": g["final_val_loss"],
                "t_gasloc": t_g,
                "t_diloco": t_d,
                "vs_diloco": ratio(t_g, t_d),
                "t_sequential": time_to(curve(seq), target) if seq else None,
                "vs_no_straggler": ratio(t_gc, t_base),
                "others_compute": others,
                "straggler_compute": straggler,
                "sequential_others_compute": compute_shares(seq, len(slow))[0] if seq else None,
                "bytes_max": max(g["bytes_sent_per_worker"]),
            }
        )
    return rows


def equal_tokens(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant at equal tokens, no straggler: the mean final loss over the seeds, and
    its difference from its reference run (mean, and the smallest and largest of the
    seeds' own differences). Refuses runs whose token counts differ: they would not
    compare. A variant without results (not trained yet) is left out."""
    first = "sequential-fp16-s"
    seeds = sorted({int(n.removeprefix(first)) for n in results if n.startswith(first)})
    rows = []
    for name, (*_, against) in EQUAL.items():
        if not all(f"{n}-s{s}" in results for n in (name, against) for s in seeds):
            continue
        runs_ = [results[f"{name}-s{s}"] for s in seeds]
        ref = {s: results[f"{against}-s{s}"] for s in seeds}
        for s, r in zip(seeds, runs_, strict=True):
            if r["tokens_per_worker"] != ref[s]["tokens_per_worker"]:
                raise ValueError(f"{name}-s{s}: not the tokens of {against}-s{s}")
        deltas = [
            r["final_val_loss"] - ref[s]["final_val_loss"]
            for s, r in zip(seeds, runs_, strict=True)
        ]
        rows.append(
            {
                "run": name,
                "against": against,
                "final": sum(r["final_val_loss"] for r in runs_) / len(runs_),
                "delta": sum(deltas) / len(deltas),
                "spread": (min(deltas), max(deltas)),
                "seeds": len(seeds),
            }
        )
    return rows


def _commits(meta: dict[str, Any]) -> str:
    """The commit the runs ran at, or each commit and its runs when they differ."""
    by: dict[str, list[str]] = {}
    for name, commit in meta.get("commits", {}).items():
        by.setdefault(commit, []).append(name)
    if len(by) <= 1:
        return next(iter(by), "?")
    return "; ".join(f"{c} ({', '.join(sorted(n))})" for c, n in sorted(by.items()))


# -- report -----------------------------------------------------------------------------------


SCHEDULE_TEXT = {
    "shared": "DiLoCo and GASLoC on one schedule: every run decays its inner LR over DiLoCo's "
    "budget (`--total-steps` = the grid's rounds × H; the floor after), so at DiLoCo's last "
    "round both have decayed alike and GASLoC's further rounds train at the floor.",
    "constant": "DiLoCo and GASLoC on one schedule: a constant inner LR "
    "(`--lr-schedule constant`), no decay at all.",
    "own": "Each run on its own schedule (`simulate`'s default, a decay over the run's own "
    "rounds): at DiLoCo's last round GASLoC's 3× longer runs are still at a higher LR, and "
    "at this scale a decay over a short run ends higher (bench/results/paper_decay.md: "
    "+0.07…+0.12 at 16 rounds), so DiLoCo's final loss here is a target its own schedule "
    "raised: the time to it is not a fair ratio (kept for the compute shares and the "
    "sequential twins).",
}


def _scenario_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| scenario | DiLoCo final | GASLoC final | GASLoC time to DiLoCo's final "
        "| ÷ DiLoCo's (≤ 0.6) | without overlap etc. | ÷ no straggler (≤ 1.15) "
        "| non-straggler compute (≥ 90 %) "
        "| straggler compute | sequential non-straggler compute |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['diloco_final']:.4f} | {r['gasloc_final']:.4f} "
            f"| {_fmt(r['t_gasloc'], '.0f')} s | {_fmt(r['vs_diloco'])} "
            f"({verdict(r['vs_diloco'], 0.6)}) | {_fmt(r['t_sequential'], '.0f')} s "
            f"| {_fmt(r['vs_no_straggler'])} ({verdict(r['vs_no_straggler'], 1.15)}) "
            f"| {r['others_compute']:.1%} ({verdict(r['others_compute'], 0.9, below=False)}) "
            f"| {_fmt(r['straggler_compute'], '.1%')} "
            f"| {_fmt(r['sequential_others_compute'], '.1%')} |"
        )
    return lines


def write_report(results: dict[str, dict[str, Any]], meta: dict[str, Any], out: Path) -> str:
    lines = [
        "# Stragglers whose link cannot carry a model within a round (simulator)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; date: {meta['date']}; gaslocd {meta['version']}; "
        f"commit {_commits(meta)}.  ",
        f"Grid: {meta['grid']}. T = H × {STEP_S} s (a fixed simulated step); a normal link "
        f"moves fp16 θ̃ in {FAST_SHARE:.0%} of T; a straggler's fp16 transfer is the "
        "scenario's multiple of T. GASLoC: 1-peer gossip, adaptive H, `--overlap`, a codec "
        "per link (fp16 → int8 → q4), long exchanges and sitting out; its scenario runs "
        f"(and their sequential twins) run {LONGER}× the grid's rounds, so that their time "
        "to DiLoCo's final loss can be measured. DiLoCo: the barrier all-reduce every "
        "round. Times are simulated seconds (the simulator runs the daemon's round, "
        "gaslocd/sim). Under `--overlap` an evaluation between rounds is of the models "
        "with the round in flight landed (a copy; the run trains on from the eager point): "
        "runs made before that change read the eager point, see each run's commit.",
    ]
    for schedule in (*FAIR, "own"):
        rows = analyse(results, schedule)
        if rows:
            lines += ["", f"**{schedule}**: {SCHEDULE_TEXT[schedule]}", ""]
            lines += _scenario_table(rows)
    lines += [
        "",
        "At equal tokens with no straggler (fixed H, the same steps in every run; final "
        "validation loss as the mean over seeds, and its difference from the reference run "
        "of the same seed; target for overlap + per-link codec: ≤ 0.01). `direct`: "
        "`--gossip direct`, the outer momentum on the worker's own pseudo-gradient and the "
        "mix beside it, so an overlapped landing moves θ by the mix alone:",
        "",
        "| run | seeds | mean final loss | against | Δ (mean) | Δ per seed (min … max) |",
        "|---|---|---|---|---|---|",
    ]
    for row in equal_tokens(results):
        low, high = row["spread"]
        lines.append(
            f"| {row['run']} | {row['seeds']} | {row['final']:.4f} | {row['against']} "
            f"| {row['delta']:+.4f} | {low:+.4f} … {high:+.4f} |"
        )
    lines += ["", "Every run's command line:", ""]
    lines += [f"- {name}: `gaslocd {shlex.join(r['argv'])}`" for name, r in sorted(results.items())]
    text = "\n".join(lines) + "\n"
    (out / "stragglers.md").write_text(text)
    _plots(results, out)
    return text


def _plots(results: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    schedules = [sc for sc in (*FAIR, "own") if analyse(results, sc)] or ["own"]
    fig, axes = plt.subplots(
        len(schedules), len(SCENARIOS), figsize=(4.5 * len(SCENARIOS), 3.4 * len(schedules)),
        sharey=True, squeeze=False,
    )  # fmt: skip
    for row, schedule in zip(axes, schedules, strict=True):
        at = "" if schedule == "own" else f"@{schedule}"
        for ax, tag in zip(row, SCENARIOS, strict=True):
            for name, style, color in (
                (f"gasloc-{tag}{at}", "-", "C0"),
                (f"gasloc-sequential-{tag}{at}", ":", "C3"),
                (f"diloco-{tag}{at}", "--", "C1"),
                (f"gasloc-none{at}", "-.", "C2"),
            ):  # one colour per kind of run in every panel
                if name not in results:
                    continue
                xs, ys = zip(*curve(results[name]), strict=True)
                label = name.replace(f"-{tag}", "").removesuffix(at)
                ax.plot(xs, ys, style, color=color, label=label)
            ax.set_title(f"straggler fp16 {tag} T, LR schedule {schedule}", fontsize=9)
            ax.set_xlabel("simulated seconds")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: no overprinting
            ax.legend(fontsize=6)
        row[0].set_ylabel("validation loss")
    fig.tight_layout()
    fig.savefig(out / "stragglers_loss.png", dpi=120)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for k, tag in enumerate(SCENARIOS):
        for offset, prefix in ((-0.2, "gasloc"), (0.2, "gasloc-sequential")):
            if f"{prefix}-{tag}" not in results:
                continue
            shares = results[f"{prefix}-{tag}"]["compute_fraction_per_worker"]
            a1.scatter([k + offset] * len(shares), shares, s=12, label=prefix if k == 0 else None)
        sent = results[f"gasloc-{tag}"]["bytes_sent_per_worker"]
        a2.bar([f"{tag} w{i}" for i in range(len(sent))], [b / 2**20 for b in sent])
    a1.set_xticks(range(len(SCENARIOS)), list(SCENARIOS))
    a1.set_ylabel("compute share per host")
    a1.axhline(0.9, color="grey", lw=0.5)
    a1.legend(fontsize=7)
    a2.set_ylabel("MiB sent (GASLoC)")
    a2.tick_params(axis="x", labelrotation=90, labelsize=5)
    fig.tight_layout()
    fig.savefig(out / "stragglers_hosts.png", dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 workers, 8 rounds, a scratch folder")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--only", nargs="+", default=None, metavar="RUN",
        help="run only these (the others' results stay, each with the commit it ran at)",
    )  # fmt: skip
    args = p.parse_args(argv)
    grid = (
        Grid(workers=4, rounds=8, inner_steps=10, eval_every=4, topology="1peer", seed=0)
        if args.quick
        else Grid(workers=6, rounds=20, inner_steps=10, eval_every=4, topology="1peer", seed=0)
    )
    out = args.out or (Path("/tmp/gaslocd-stragglers-quick") if args.quick else RESULTS)
    data = out / "stragglers"
    data.mkdir(parents=True, exist_ok=True)
    meta_path = data / "meta.json"
    if not args.report_only:
        message = message_bytes_fp16("tiny")
        todo = {r.name: r.argv(grid, message) for r in runs()}
        kept = json.loads(meta_path.read_text()) if args.only and meta_path.exists() else {}
        if args.only:
            unknown = set(args.only) - todo.keys()
            if unknown:
                p.error(f"no such run: {', '.join(sorted(unknown))}")
            todo = {n: a for n, a in todo.items() if n in args.only}
        commit = _commit()  # before the runs: the tree they ran
        simulate_all(todo, data, args.jobs)
        from gaslocd import __version__

        commits = {n: kept.get("commits", {}).get(n, "?") for n in kept.get("argv", {})}
        meta = {
            "command": shlex.join([sys.executable, *sys.argv]).replace(str(ROOT) + "/", ""),
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
            f"{_cores()} cores, Python {platform.python_version()}",
            "date": datetime.date.today().isoformat(),
            "version": __version__,
            "grid": f"{grid.workers} workers, {grid.rounds} rounds, H={grid.inner_steps}, "
            f"model tiny, {grid.topology}, seed {grid.seed}",
            "argv": {**kept.get("argv", {}), **todo},
            "commits": {**commits, **dict.fromkeys(todo, commit)},
        }
        meta_path.write_text(json.dumps(meta, indent=1))
    meta = json.loads(meta_path.read_text())
    results = {}
    for name, argv_ in meta["argv"].items():
        results[name] = {**json.loads((data / f"{name}.json").read_text()), "argv": argv_}
    print(write_report(results, meta, out))
    return 0


def _commit() -> str:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"]).returncode
    return proc.stdout.strip() + ("+changes" if dirty else "") if proc.returncode == 0 else "?"


def _cores() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    raise SystemExit(main())
