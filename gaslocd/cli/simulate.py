"""``gaslocd simulate``: N workers in one process, a simulated network and clock."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gaslocd.cli.configs import algo_config, sim_config, train_config
from gaslocd.cli.settings import SIMULATE
from gaslocd.cli.sources import Command
from gaslocd.cli.values import json_args

if TYPE_CHECKING:
    from gaslocd.sim.runner import RoundRecord


def _fmt_steps(steps: Sequence[int]) -> str:
    lo, hi = min(steps), max(steps)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _print_round(r: RoundRecord, rounds: int) -> None:
    val = f"{r.val_loss:.4f}" if r.val_loss is not None else "   -  "
    failed = f"  failed {r.exchange_failures}" if r.exchange_failures else ""
    print(
        f"round {r.round:4d}/{rounds}  H {_fmt_steps(r.inner_steps):>7}  "
        f"train {r.train_loss:.4f}  val {val}  consensus {r.consensus:.2e}  "
        f"clock {r.wall_clock_s:9.1f}s  idle {100 * r.idle_fraction:5.1f}%{failed}",
        flush=True,
    )


def run_simulate(command: str, resolved: dict[str, Any]) -> int:
    """Configs first (a wrong setting exits 2 before torch loads), then the simulation."""
    algo, train, sim = algo_config(resolved), train_config(resolved), sim_config(resolved)
    import torch

    from gaslocd.sim.runner import Simulation
    from gaslocd.sim.summary import simulation_summary, write_json

    torch.set_num_threads(resolved["threads"])
    from gaslocd.train.device import resolve_device, resolve_precision

    # A device or precision this machine lacks is a wrong setting: one line, exit 2.
    resolve_precision(train.precision, resolve_device(train.device))
    simulation = Simulation(algo, train, sim)
    done = simulation.algo
    adaptive = " adaptive" if done.adapt_h else ""
    gossip = "" if done.outer.gossip == "momentum" else f" gossip {done.outer.gossip}"
    print(
        f"simulate: {sim.workers} workers, {done.algo}/{done.topology}, "
        f"H={done.inner_steps}{adaptive}, η={done.outer.lr} μ={done.outer.momentum}{gossip}, "
        f"model {train.model} ({simulation.workers[0].flat.numel:,} params), codec {sim.codec}, "
        f"corpus {simulation.corpus.source}",
        flush=True,
    )
    result = simulation.run(lambda r: _print_round(r, sim.rounds))
    print(
        f"done: val loss {result.initial_val_loss:.4f} -> {result.final_val_loss:.4f}, "
        f"simulated {result.wall_clock_s:.1f}s (real {result.real_elapsed_s:.1f}s), "
        f"idle {100 * result.idle_fraction:.1f}%, "
        f"sent {max(result.bytes_sent_per_worker) / 2**20:.1f} MiB per worker (max)",
        flush=True,
    )
    if resolved["json"] is not None:
        args = json_args(resolved)
        args["resolved"] = {
            "topology": done.topology,
            "inner_steps": done.inner_steps,
            "outer_lr": done.outer.lr,
            "outer_momentum": done.outer.momentum,
            "gossip": done.outer.gossip,
        }
        write_json(Path(resolved["json"]), simulation_summary(result, args))
        print(f"summary written to {resolved['json']}")
    return 0


SIMULATE_COMMAND = Command(
    SIMULATE,
    help="N workers in one process, a simulated network and clock (for research)",
    description="Train N workers in one process with the daemon's algorithm over an "
    "in-memory wire; a simulated clock turns step time, bandwidth and latency into "
    "wall-clock, so algorithms and topologies compare on time-to-loss.",
    run=run_simulate,
)
