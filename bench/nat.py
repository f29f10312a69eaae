"""Peers behind NAT in the simulator: what it costs when they outnumber reachable ones.

    .venv/bin/python bench/nat.py                 # the committed grid, ~10 min on 2 cores
    .venv/bin/python bench/nat.py --report-only   # rebuild the report from nat/*.json

A peer started with ``--reachable no`` can dial out but cannot be dialled, so the run
never pairs two of them (gaslocd.algorithm.topology): with K of N workers behind NAT and
K > N − K, the K − (N − K) extra ones sit out every round, by turns. Each run is
``gaslocd simulate --unreachable K`` (the daemon's own round on a simulated clock with a
fixed step time, so the result does not depend on this machine's load), for K = 0 … N−1
and both random topologies. Reported per run: the final validation loss, the consensus
distance at the end, and the share of rounds in which the workers behind NAT, and the
reachable ones, had a partner. Writes ``bench/results/nat.md``, ``nat.png`` and the runs'
JSON (``nat/``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stragglers import simulate_all

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORKERS, ROUNDS, H, STEP_S = 8, 30, 10, 0.5
SHUT = (0, 2, 4, 6, 7)
TOPOLOGIES = ("1peer", "2peer")


def argv_of(topology: str, shut: int) -> list[str]:
    """The ``gaslocd simulate`` command line of one run."""
    return [
        "simulate", "--workers", str(WORKERS), "--rounds", str(ROUNDS),
        "--inner-steps", str(H), "--step-time", str(STEP_S), "--codec", "fp16",
        "--topology", topology, "--unreachable", str(shut), "--eval-every", "5",
        "--seed", "0", "--run-id", "nat",
    ]  # fmt: skip


def paired_shares(summary: dict[str, Any], shut: int) -> tuple[float | None, float | None]:
    """Share of (worker, round) slots with a partner: behind NAT, and reachable. Worker k
    is the k-th id of the roster in worker order (gaslocd.sim.schedule.worker_roster)."""
    from gaslocd.sim.schedule import worker_roster

    ids = worker_roster(WORKERS)
    groups = (set(ids[:shut]), set(ids[shut:]))
    counts = [[0, 0], [0, 0]]  # per group: paired slots, all slots
    for r in summary["rounds"]:
        ends = {p for e in r["edges"] for p in e}
        for g, members in enumerate(groups):
            present = members & set(r["roster"])
            counts[g][0] += len(present & ends)
            counts[g][1] += len(present)
    shares = [c[0] / c[1] if c[1] else None for c in counts]
    return shares[0], shares[1]


def row(summary: dict[str, Any], topology: str, shut: int) -> dict[str, Any]:
    nat, reachable = paired_shares(summary, shut)
    tail = [c["consensus"] for c in summary["consensus_curve"][-3:] if c["consensus"] is not None]
    return {
        "topology": topology,
        "shut": shut,
        "final_val_loss": summary["final_val_loss"],
        "consensus": statistics.fmean(tail) if tail else None,
        "paired_nat": nat,
        "paired_reachable": reachable,
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def report(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> str:
    lines = [
        "# Peers behind NAT (simulator)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; date: {meta['date']}; gaslocd {meta['version']}.  ",
        f"Grid: {WORKERS} workers, {ROUNDS} rounds, H={H}, model tiny, fp16, fixed step "
        f"{STEP_S} s, seed 0; workers 0..K−1 behind NAT (`--unreachable K`). Loss and "
        "consensus are the simulator's (the network-mean validation loss at the end, the "
        "mean distance to the network mean over the last three rounds).",
        "",
        "| topology | behind NAT (K of 8) | final val loss | Δ vs K=0 | consensus | "
        "rounds with a partner, behind NAT | …, reachable |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {r["topology"]: r["final_val_loss"] for r in rows if r["shut"] == 0}
    for r in rows:
        delta = r["final_val_loss"] - base[r["topology"]]
        lines.append(
            f"| {r['topology']} | {r['shut']} | {r['final_val_loss']:.4f} | {delta:+.4f} | "
            f"{r['consensus']:.4g} | {_pct(r['paired_nat'])} | {_pct(r['paired_reachable'])} |"
        )
    lines += ["", "Every run's command line:", ""]
    lines += [f"- {n}: `gaslocd {shlex.join(a)}`" for n, a in meta["argv"].items()]
    text = "\n".join(lines) + "\n"
    (out / "nat.md").write_text(text)
    _plot(rows, out / "nat.png")
    return text


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for topology in TOPOLOGIES:
        mine = [r for r in rows if r["topology"] == topology]
        ks = [r["shut"] for r in mine]
        a.plot(ks, [r["final_val_loss"] for r in mine], marker="o", label=topology)
        b.plot(ks, [r["consensus"] for r in mine], marker="o", label=topology)
    a.set(xlabel=f"workers behind NAT (of {WORKERS})", ylabel="final validation loss")
    b.set(xlabel=f"workers behind NAT (of {WORKERS})", ylabel="consensus distance", yscale="log")
    for ax in (a, b):
        ax.axvline(WORKERS / 2, color="grey", lw=0.8, ls=":")
        ax.legend()
    fig.suptitle("Peers behind NAT: never paired together (simulator)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    data = args.out / "nat"
    data.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        todo = {f"{t}-k{k}": argv_of(t, k) for t in TOPOLOGIES for k in SHUT}
        simulate_all(todo, data, args.jobs)
        from gaslocd import __version__

        meta = {
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}",
            "date": datetime.date.today().isoformat(),
            "version": __version__,
            "argv": todo,
        }
        (data / "meta.json").write_text(json.dumps(meta, indent=1))
    meta = json.loads((data / "meta.json").read_text())
    rows = []
    for name in meta["argv"]:
        topology, shut = name.split("-k")
        summary = json.loads((data / f"{name}.json").read_text())
        rows.append(row(summary, topology, int(shut)))
    print(report(rows, meta, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
