"""The simulator end to end: it trains, DiLoCo is GASLoC on the complete graph, the clock
rewards adaptive H under a straggler, failures are survived, and the CLI contract holds."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gaslocd.config import AlgoConfig, OuterConfig, SimConfig, Straggler, TrainConfig
from gaslocd.net.memory import fail_at
from gaslocd.sim.runner import Simulation
from gaslocd.train.data import Corpus

pytestmark = pytest.mark.slow

FAST = TrainConfig(seq_len=32, batch_size=4, inner_lr=3e-3, warmup_steps=2, eval_batches=2, seed=1)


def test_a_short_tiny_run_lowers_the_validation_loss(corpus: Corpus) -> None:
    sim = Simulation(
        AlgoConfig(topology="2peer", inner_steps=5),
        FAST,
        SimConfig(workers=4, rounds=6, step_time_s=0.05),
        corpus=corpus,
    )
    result = sim.run()
    assert result.initial_val_loss == pytest.approx(math.log(256), rel=0.05)
    assert result.final_val_loss < result.initial_val_loss - 1.0
    assert all(math.isfinite(r.consensus) and r.consensus < 0.1 for r in result.records)
    assert len(result.records) == 6
    assert result.tokens_per_worker == 6 * 5 * 4 * 32


def test_diloco_equals_gasloc_on_the_complete_graph(corpus: Corpus) -> None:
    outer = OuterConfig(lr=0.7, momentum=0.9)
    sim = SimConfig(workers=3, rounds=3, step_time_s=0.05)
    diloco = Simulation(
        AlgoConfig(algo="diloco", topology="complete", inner_steps=3, outer=outer),
        FAST,
        sim,
        corpus=corpus,
    ).run()
    gasloc = Simulation(
        AlgoConfig(algo="gasloc", topology="complete", inner_steps=3, outer=outer),
        FAST,
        sim,
        corpus=corpus,
    ).run()
    assert [r.train_loss for r in diloco.records] == [r.train_loss for r in gasloc.records]
    assert [r.val_loss for r in diloco.records] == [r.val_loss for r in gasloc.records]
    # DiLoCo keeps every replica identical: consensus is exactly zero.
    assert all(r.consensus == pytest.approx(0.0, abs=1e-6) for r in diloco.records)


def test_adaptive_h_beats_diloco_wall_clock_with_a_bandwidth_straggler(corpus: Corpus) -> None:
    net = SimConfig(
        workers=4,
        rounds=4,
        step_time_s=0.1,
        bandwidth_mbps=100,
        latency_ms=5,
        stragglers=(Straggler(0, 0.1),),
        message_bytes=5_000_000,  # 0.4 s on a fast link, 4 s on the straggler's
    )
    diloco = Simulation(
        AlgoConfig(algo="diloco", topology="complete", inner_steps=30), FAST, net, corpus=corpus
    ).run()
    adapted = Simulation(
        AlgoConfig(topology="1peer", inner_steps=30, adapt_h=True), FAST, net, corpus=corpus
    ).run()
    assert adapted.wall_clock_s < 0.6 * diloco.wall_clock_s
    assert adapted.idle_fraction < diloco.idle_fraction
    assert min(min(r.inner_steps) for r in adapted.records) < 30  # the straggler's pairs did fewer


def test_a_dead_worker_costs_its_partners_that_round_only(corpus: Corpus) -> None:
    sim = Simulation(
        AlgoConfig(topology="2peer", inner_steps=2),
        FAST,
        SimConfig(workers=4, rounds=3, step_time_s=0.05),
        corpus=corpus,
        edge_fails=fail_at([(1, "w000")]),
    )
    result = sim.run()
    assert [r.exchange_failures for r in result.records] == [0, 2, 0]
    assert all(math.isfinite(r.val_loss or 0.0) for r in result.records)


def _simulate(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gaslocd", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_prints_a_line_per_round_and_writes_the_json_summary(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = _simulate(
        "--workers",
        "3",
        "--rounds",
        "2",
        "--inner-steps",
        "2",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--eval-batches",
        "1",
        "--straggler",
        "0:0.2",
        "--adapt-h",
        "--codec",
        "int8",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert sum(line.startswith("round ") for line in proc.stdout.splitlines()) == 2
    summary = json.loads(out.read_text())
    for key in (
        "final_val_loss",
        "val_loss_curve",
        "consensus_curve",
        "wall_clock_s",
        "bytes_sent_per_worker",
        "idle_fraction",
        "args",
        "run_id",
        "rounds",
        "compute_fraction_per_worker",
    ):
        assert key in summary
    # pairings come from the run id: --run-id if given, else the seed's "sim-<seed>"
    assert summary["run_id"] == (summary["args"].get("run_id") or "sim-0")
    first = summary["rounds"][0]
    assert {"mixing_matrix", "edges", "inner_steps", "filled_steps"} <= first.keys()
    assert len(first["mixing_matrix"]) == 3 and len(first["filled_steps"]) == 3
    assert summary["val_loss_curve"][0]["round"] == 0
    assert {"round", "wall_clock_s", "val_loss"} <= summary["val_loss_curve"][-1].keys()
    assert len(summary["bytes_sent_per_worker"]) == 3
    assert summary["args"]["codec"] == "int8"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--straggler", "7:0.1", "--workers", "2"], "straggler worker 7 does not exist"),
        (["--straggler", "0-0.1"], "WORKER:FRACTION"),
        (["--outer-momentum", "1.5"], "outer momentum"),
        (["--data", "/nonexistent/corpus"], "/nonexistent/corpus"),
        (["--algo", "diloco", "--topology", "1peer"], "complete"),
        (["--model", "nope"], "tiny"),
    ],
)
def test_cli_refuses_bad_settings_with_one_clear_line(args: list[str], message: str) -> None:
    proc = _simulate("--rounds", "1", *args, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
