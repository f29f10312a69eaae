"""Run specs: one simulation each, cached as a small JSON file, several processes at once.

A run's file holds the simulator's own summary (``gaslocd.sim.summary``), thinned so that
a hundred runs stay small, plus the spec, the budget, the network and the equivalent
``gaslocd simulate`` command. A file whose spec, budget, network and protocol match is
reused, so an interrupted grid resumes where it stopped and a report can be rebuilt
without training; one trained by an older simulator (another ``PROTOCOL``) is not.
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from gaslocd.config import AlgoConfig, OuterConfig, SimConfig, Straggler, TrainConfig
from gaslocd.sim.runner import Simulation
from gaslocd.sim.summary import simulation_summary, write_json
from gaslocd.train.data import Corpus, load_corpus

from .grid import Budget, Mode, Network, RunSpec

MAX_CURVE_POINTS = 100  # the consensus curve is thinned to about this many rounds
# What the simulator runs: "shared-round" is the daemon's round (gaslocd.sim.schedule).
# Files without it were trained by the simulator's own round, which no daemon ran.
PROTOCOL = "shared-round"


def configs(
    spec: RunSpec, budget: Budget, network: Network
) -> tuple[AlgoConfig, TrainConfig, SimConfig]:
    lr, mom = spec.outer
    budget = replace(
        budget,
        batch_size=spec.batch_size or budget.batch_size,
        steps_per_worker=spec.steps_per_worker or budget.steps_per_worker,
        inner_lr=spec.inner_lr or budget.inner_lr,
    )
    rounds = budget.rounds(spec.inner_steps, spec.budget_scale)
    decays = budget.lr_schedule != "constant"
    algo = AlgoConfig(
        algo=spec.algo,
        topology=spec.topology,
        inner_steps=spec.inner_steps,
        outer=OuterConfig(lr=lr, momentum=mom, gossip=spec.gossip),
        adapt_h=spec.adapt_h,
    )
    train = TrainConfig(
        model=spec.model,
        seq_len=budget.seq_len,
        batch_size=budget.batch_size,
        inner_lr=budget.inner_lr,
        warmup_steps=budget.warmup_steps,
        eval_batches=budget.eval_batches,
        seed=spec.seed,
        lr_schedule=budget.lr_schedule,
        total_steps=rounds * spec.inner_steps if decays else None,
        lr_floor=budget.lr_floor,
    )
    sim = SimConfig(
        workers=spec.workers,
        rounds=rounds,
        codec=spec.codec,
        bandwidth_mbps=network.bandwidth_mbps,
        latency_ms=network.latency_ms,
        step_time_s=network.step_time_s,
        stragglers=() if spec.straggler is None else (Straggler(0, spec.straggler),),
        eval_every=budget.eval_every(spec.inner_steps, spec.budget_scale),
        message_bytes=network.message_bytes,
    )
    return algo, train, sim


def cli_command(spec: RunSpec, budget: Budget, network: Network) -> str:
    """The ``gaslocd simulate`` line that trains the same run (run id: the default)."""
    algo, train, sim = configs(spec, budget, network)
    flags = [
        f"--workers {sim.workers}",
        f"--rounds {sim.rounds}",
        f"--algo {algo.algo}",
        f"--topology {algo.topology}",
        f"--inner-steps {algo.inner_steps}",
    ]
    if algo.algo in ("gasloc", "diloco"):
        flags.append(f"--outer-lr {algo.outer.lr:g} --outer-momentum {algo.outer.momentum:g}")
    if train.model != "tiny":
        flags.append(f"--model {train.model}")
    flags += [
        f"--batch-size {train.batch_size} --seq-len {train.seq_len}",
        f"--inner-lr {train.inner_lr:g} --warmup-steps {train.warmup_steps}",
        f"--eval-batches {train.eval_batches} --eval-every {sim.eval_every}",
        f"--lr-schedule {train.lr_schedule}"
        + (f" --lr-floor {train.lr_floor:g}" if train.lr_schedule != "constant" else ""),
        f"--seed {train.seed} --codec {sim.codec}",
        f"--step-time {network.step_time_s:g} --message-bytes {network.message_bytes}",
        f"--bandwidth {network.bandwidth_mbps:g} --latency {network.latency_ms:g}",
    ]
    if spec.straggler is not None:
        flags.append(f"--straggler 0:{spec.straggler:g}")
    if spec.adapt_h:
        flags.append("--adapt-h")
    if spec.gossip != "momentum":
        flags.append(f"--gossip {spec.gossip}")
    return "gaslocd simulate " + " ".join(flags)


def _identity(spec: RunSpec, budget: Budget, network: Network) -> dict[str, Any]:
    fields = asdict(budget)
    if budget.lr_schedule == "constant":  # files from before the schedule existed match
        del fields["lr_schedule"], fields["lr_floor"]
    return {
        "spec": spec.as_dict(),
        "budget": fields,
        "network": asdict(network),
        "protocol": PROTOCOL,
    }


def load_cached(
    path: Path, spec: RunSpec, budget: Budget, network: Network
) -> dict[str, Any] | None:
    """The run's summary if ``path`` holds this very run, else None."""
    try:
        summary: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    bench = summary.get("args", {}).get("bench")
    return summary if bench == _identity(spec, budget, network) else None


def _thin(summary: dict[str, Any], adaptive: bool) -> dict[str, Any]:
    """Drop what the report never reads and thin the per-round curves."""
    curve = summary["consensus_curve"]
    stride = max(1, math.ceil(len(curve) / MAX_CURVE_POINTS))
    keep = {p["round"] for p in summary["val_loss_curve"]}
    summary["consensus_curve"] = [
        p for p in curve if p["round"] % stride == 0 or p["round"] in keep
    ]
    del summary["train_loss_curve"]
    if not adaptive:
        del summary["inner_steps_curve"]  # constant H: the spec says it
    for entry in summary["rounds"]:  # the digest stands for W (what a replay checks)
        for key in ("roster", "edges", "mixing_matrix"):
            del entry[key]
    return summary


_corpus: Corpus | None = None


def _init_process(threads: int) -> None:
    global _corpus
    torch.set_num_threads(threads)
    _corpus = load_corpus(None)


def mean_model_loss(simulation: Simulation) -> float:
    """Validation loss of the workers' average θ̄: what the run would give if it ended with
    one exact all-reduce. Its gap to the mean of the workers' own losses is the price of
    the consensus error; the rest is optimization."""
    worker = simulation.workers[0]
    own = worker.flat.clone()
    worker.flat.load_(torch.stack([w.flat.flat for w in simulation.workers]).mean(dim=0))
    try:
        return worker.trainer.evaluate(simulation.eval_batches)
    finally:
        worker.flat.load_(own)


def run_one(spec: RunSpec, budget: Budget, network: Network, path: Path) -> dict[str, Any]:
    """Train ``spec`` (in this process) and write its summary to ``path``."""
    if _corpus is None:
        _init_process(1)
    assert _corpus is not None
    algo, train, sim = configs(spec, budget, network)
    began = time.perf_counter()
    simulation = Simulation(algo, train, sim, corpus=_corpus)
    result = simulation.run()
    args = {
        "bench": _identity(spec, budget, network),
        "command": cli_command(spec, budget, network),
        "corpus": _corpus.source,
    }
    summary = _thin(simulation_summary(result, args), spec.adapt_h)
    summary["initial_val_loss"] = result.initial_val_loss
    summary["mean_model_val_loss"] = mean_model_loss(simulation)
    summary["steps_per_worker"] = [w.trainer.steps_done for w in simulation.workers]
    summary["real_elapsed_s"] = time.perf_counter() - began
    write_json(path, summary)
    return summary


def run_all(
    specs: Iterable[RunSpec],
    mode: Mode,
    out_dir: Path,
    *,
    jobs: int = 1,
    train: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, dict[str, Any]], int]:
    """(every spec's summary by key, how many were trained now).

    Cached runs are read; the rest are trained ``jobs`` at a time (in this process when
    ``jobs`` is 1), or skipped when ``train`` is False. A run that fails is logged and left
    out: one broken run must not sink a grid of a hundred.
    """
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for spec in specs:
        cached = load_cached(out_dir / f"{spec.key}.json", spec, mode.budget, mode.network)
        if cached is not None:
            results[spec.key] = cached
        else:
            todo.append(spec)
    log(f"{len(results)} runs cached, {len(todo) if train else 0} to train with {jobs} process(es)")
    if not todo or not train:
        return results, 0
    began = time.perf_counter()
    trained = 0

    def record(done: int, spec: RunSpec, get: Callable[[], dict[str, Any]]) -> None:
        nonlocal trained
        try:
            summary = get()
        except Exception as exc:
            log(f"[{done}/{len(todo)}] {spec.key} FAILED: {exc!r}")
            return
        results[spec.key] = summary
        trained += 1
        log(
            f"[{done}/{len(todo)}] {spec.key}: val {summary['final_val_loss']:.4f} "
            f"in {summary['real_elapsed_s']:.0f}s real "
            f"({(time.perf_counter() - began) / 60:.1f} min elapsed)"
        )

    def path(spec: RunSpec) -> Path:
        return out_dir / f"{spec.key}.json"

    if jobs == 1:
        for done, spec in enumerate(todo, 1):
            record(
                done, spec, functools.partial(run_one, spec, mode.budget, mode.network, path(spec))
            )
        return results, trained
    context = multiprocessing.get_context("spawn")  # no torch threads inherited through fork
    with ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_init_process, initargs=(1,)
    ) as pool:
        futures = {
            pool.submit(run_one, spec, mode.budget, mode.network, path(spec)): spec for spec in todo
        }
        for done, future in enumerate(as_completed(futures), 1):
            record(done, futures[future], future.result)
    return results, trained
