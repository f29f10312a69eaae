"""What an insider at the norm bound does to honest peers, with and without robust mixing
(issue 14), on the simulator (the daemon's round, Worker and clipping), in one command.

    .venv/bin/python bench/security_mixing.py                 # 1 seed, a few minutes
    nice -n 10 .venv/bin/python bench/security_mixing.py --seeds 0 1 2

For each seed: an honest run with robust mixing off and on (its cost: the final loss
difference), then an insider (worker 0) offering a scaled θ̃ (``shrink``), noise, or one
fixed direction, at ``--fraction`` of the norm bound every round, off and on. The
insider's own model is never evaluated: losses are the honest workers' mean validation
loss, and the worst honest worker's. Writes ``security_mixing.md``, ``.json`` and
``security_mixing_<attack>.png`` (loss against round) into ``--out`` (bench/results/).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gaslocd.algorithm.robust import TrustConfig
from gaslocd.config import AlgoConfig, SimConfig, TrainConfig
from gaslocd.sim.insider import ATTACKS, Insider, InsiderSimulation
from gaslocd.train.data import Corpus, load_corpus

RESULTS = Path(__file__).resolve().parent / "results"
WORKERS, H, ROUNDS = 8, 10, 20


@functools.cache
def _corpus() -> Corpus:
    return load_corpus(None, max_bytes=2 * 2**20)


def run_one(seed: int, attack: str | None, clip: bool, fraction: float) -> dict[str, Any]:
    """One simulated run; its honest losses per evaluated round and at the end."""
    algo = AlgoConfig(inner_steps=H)
    train = TrainConfig(
        batch_size=4, seq_len=32, eval_batches=2, inner_lr=3e-3, warmup_steps=5, seed=seed
    )
    sim = SimConfig(workers=WORKERS, rounds=ROUNDS, step_time_s=0.1, eval_every=2)
    insider = Insider(attack=attack, fraction=fraction, seed=seed) if attack else None
    s = InsiderSimulation(
        algo,
        train,
        sim,
        insider=insider,
        trust=TrustConfig(enabled=clip),
        corpus=_corpus(),
    )
    curve: list[tuple[int, float, float]] = []

    def on_round(record: Any) -> None:
        if record.val_loss is not None:
            curve.append((record.round, record.val_loss, max(s.honest_val)))

    began = time.perf_counter()
    result = s.run(on_round=on_round)
    return {
        "seed": seed,
        "attack": attack or "none",
        "clip": clip,
        "final_mean": result.final_val_loss,
        "final_worst": max(s.honest_val),
        "curve": curve,
        "clipped": s.clipped(),
        "rescaled": s.rescaled(),
        "rollbacks": s.rollbacks(),
        "seconds": time.perf_counter() - began,
    }


def _table(runs: list[dict[str, Any]]) -> list[str]:
    """Mean over seeds of each (attack, clip), and the rise over the honest run."""
    rows = [
        "| attack | robust mixing | honest mean loss | worst honest peer | rise (mean) | "
        "rise (worst) | clipped (distance) | norm only | rollbacks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = {c: _mean(runs, "none", c, "final_mean") for c in (False, True)}
    for attack in ("none", *sorted({r["attack"] for r in runs} - {"none"})):
        for clip in (False, True):
            mean = _mean(runs, attack, clip, "final_mean")
            worst = _mean(runs, attack, clip, "final_worst")
            clipped = _mean(runs, attack, clip, "clipped")
            rescaled = _mean(runs, attack, clip, "rescaled")
            rolled = _mean(runs, attack, clip, "rollbacks")
            rows.append(
                f"| {attack} | {'on' if clip else 'off'} | {mean:.4f} | {worst:.4f} | "
                f"{mean - base[clip]:+.4f} | {worst - base[clip]:+.4f} | {clipped:.0f} | "
                f"{rescaled:.0f} | {rolled:.0f} |"
            )
    return rows


def _mean(runs: list[dict[str, Any]], attack: str, clip: bool, key: str) -> float:
    return statistics.fmean(r[key] for r in runs if r["attack"] == attack and r["clip"] == clip)


def _plot(runs: list[dict[str, Any]], attack: str, seed: int, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, want_attack, clip, color, dash in (
        ("honest, clipping off", "none", False, "C0", ":"),
        ("honest, clipping on", "none", True, "C0", "-"),
        (f"{attack}, clipping off", attack, False, "C3", ":"),
        (f"{attack}, clipping on", attack, True, "C3", "-"),
    ):
        run = next(
            r for r in runs if (r["attack"], r["clip"], r["seed"]) == (want_attack, clip, seed)
        )
        xs = [c[0] for c in run["curve"]]
        ax.plot(xs, [c[1] for c in run["curve"]], dash, color=color, label=label, marker=".")
    ax.set_xlabel("round")
    ax.set_ylabel("honest workers' mean validation loss")
    ax.set_title(f"insider '{attack}' at the norm bound, {WORKERS} workers, seed {seed}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _machine() -> str:
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    return f"`{uname}`, nproc {os.cpu_count()}, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--fraction", type=float, default=0.9, help="of the norm bound")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--attacks", nargs="*", choices=ATTACKS, default=list(ATTACKS), help="(none: honest only)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    began = time.perf_counter()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    runs = []
    for seed in args.seeds:
        for attack in (None, *args.attacks):
            for clip in (False, True):
                run = run_one(seed, attack, clip, args.fraction)
                runs.append(run)
                print(
                    f"seed {seed} {run['attack']:9s} clip {'on ' if clip else 'off'} "
                    f"mean {run['final_mean']:.4f} worst {run['final_worst']:.4f} "
                    f"clipped {run['clipped']}+{run['rescaled']} rollbacks {run['rollbacks']} "
                    f"({run['seconds']:.0f} s)",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    for attack in args.attacks:
        _plot(runs, attack, args.seeds[0], args.out / f"security_mixing_{attack}.png")
    (args.out / "security_mixing.json").write_text(json.dumps(runs, indent=1))
    table = _table(runs)
    print("\n".join(table))
    cmd = shlex.join([".venv/bin/python", "bench/security_mixing.py", *(argv or sys.argv[1:])])
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    md = [
        "# Robust mixing against an insider at the norm bound",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {_machine()}  ",
        f"Date: {started} (UTC), commit {head.stdout.strip()}, "
        f"{time.perf_counter() - began:.0f} s in all",
        "",
        f"Simulator (the daemon's round), {WORKERS} workers, gasloc 1peer, H = {H}, "
        f"{ROUNDS} rounds, tiny model (batch 4 × 32 tokens, inner lr 3e-3), fp32 wire, "
        f"seeds {args.seeds}. Worker 0 is the insider from round 0 to the end, at "
        f"{args.fraction} of the norm bound, crafted against its partner's θ̃ (omniscient). "
        "Losses: the honest workers' validation loss after the last round (mean over "
        "them, and the worst one), averaged over seeds; rises are against the honest run "
        "with the same robust-mixing setting.",
        "",
        *table,
        "",
    ]
    (args.out / "security_mixing.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
