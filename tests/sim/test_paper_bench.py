"""The paper bench (bench/paper.py) and what it added to the simulator: a clock replay that
re-times a finished run on another network when that is exact (and refuses otherwise),
evaluation that skips identical replicas, and an end-to-end micro grid that must produce
every table, finding and plot."""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gaslocd.config import AlgoConfig, SimConfig, Straggler, TrainConfig
from gaslocd.sim.clock import SimClock
from gaslocd.sim.replay import ClockPoint, ReplayRefused, replay_clock
from gaslocd.sim.runner import SimResult, Simulation
from gaslocd.train.data import Corpus

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import paper  # noqa: E402
from paperlib import execute  # noqa: E402
from paperlib.analysis import time_to_target  # noqa: E402
from paperlib.grid import QUICK, Budget  # noqa: E402

pytestmark = pytest.mark.slow

FAST = TrainConfig(seq_len=16, batch_size=2, inner_lr=3e-3, warmup_steps=1, eval_batches=1, seed=3)
MB = 1_000_000


def _straggler_net(workers: int, rounds: int, fraction: float = 0.1) -> SimConfig:
    # 20 MB at 100 Mbit/s: 1.6 s per exchange, 16 s on the straggler's link; 10 × 0.5 s compute.
    return SimConfig(
        workers=workers,
        rounds=rounds,
        bandwidth_mbps=100,
        latency_ms=5,
        step_time_s=0.5,
        stragglers=(Straggler(0, fraction),),
        message_bytes=20 * MB,
    )


def _replay(
    algo: AlgoConfig, net: SimConfig, result: SimResult
) -> tuple[list[ClockPoint], SimClock]:
    return replay_clock(algo, net, result.run_id, [r.digest for r in result.records])


@pytest.mark.parametrize(
    ("topology", "adapt_h"), [("1peer", True), ("2peer", False), ("complete", False)]
)
def test_replay_reproduces_the_clock_of_the_run(
    corpus: Corpus, topology: str, adapt_h: bool
) -> None:
    net = _straggler_net(4, 3)
    algo = AlgoConfig(topology=topology, inner_steps=10, adapt_h=adapt_h)
    result = Simulation(algo, FAST, net, corpus=corpus).run()
    points, clock = _replay(algo, net, result)
    assert [p.wall_clock_s for p in points] == [r.wall_clock_s for r in result.records]
    assert [p.idle_fraction for p in points] == [r.idle_fraction for r in result.records]
    assert clock.idle_fraction_per_worker() == result.idle_fraction_per_worker


def test_diloco_re_times_exactly_onto_a_straggler_network(corpus: Corpus) -> None:
    algo = AlgoConfig(algo="diloco", topology="complete", inner_steps=10)
    slow = _straggler_net(4, 3)
    even = replace(slow, stragglers=())
    there = Simulation(algo, FAST, slow, corpus=corpus).run()
    here = Simulation(algo, FAST, even, corpus=corpus).run()
    assert [r.val_loss for r in here.records] == [r.val_loss for r in there.records]
    points, _ = _replay(algo, slow, here)
    assert [p.wall_clock_s for p in points] == [r.wall_clock_s for r in there.records]


def test_replay_refuses_a_run_whose_rounds_would_differ_on_that_network(corpus: Corpus) -> None:
    slow = _straggler_net(4, 3)
    even = replace(slow, stragglers=())
    adaptive = AlgoConfig(topology="1peer", inner_steps=10, adapt_h=True)
    result = Simulation(adaptive, FAST, slow, corpus=corpus).run()
    with pytest.raises(ReplayRefused, match="round 2 would differ"):
        _replay(adaptive, even, result)  # H adapted to the straggler, and the wait was filled
    fixed = AlgoConfig(topology="2peer", inner_steps=10)
    result = Simulation(fixed, FAST, even, corpus=corpus).run()
    hopeless = replace(slow, stragglers=(Straggler(0, 0.01),))  # 2 × 20 MB at 125 kB/s
    with pytest.raises(ReplayRefused, match="deadline"):
        _replay(fixed, hopeless, result)


def test_replay_needs_a_step_time_and_a_message_size() -> None:
    with pytest.raises(ValueError, match="step_time_s and message_bytes"):
        replay_clock(AlgoConfig(), SimConfig(workers=2, rounds=1), "r", ["x"])


@pytest.mark.parametrize("topology", ["complete", "1peer"])
def test_evaluate_equals_the_mean_of_every_workers_own_loss(corpus: Corpus, topology: str) -> None:
    algo = AlgoConfig(
        algo="diloco" if topology == "complete" else "gasloc", topology=topology, inner_steps=3
    )
    sim = Simulation(algo, FAST, SimConfig(workers=3, rounds=2, step_time_s=0.1), corpus=corpus)
    sim.run()
    each = [w.trainer.evaluate(sim.eval_batches) for w in sim.workers]
    assert sim.evaluate() == statistics.fmean(each)
    distinct = {tuple(w.flat.flat[:5].tolist()) for w in sim.workers}
    assert len(distinct) == (1 if topology == "complete" else 3)


def test_time_to_target_interpolates_between_validation_points() -> None:
    points = [(0.0, 5.0), (10.0, 3.0), (20.0, 2.0), (30.0, 2.5)]
    assert time_to_target(points, 4.0) == pytest.approx(5.0)
    assert time_to_target(points, 2.0) == pytest.approx(20.0)
    assert time_to_target(points, 1.0) is None
    assert time_to_target(points, 6.0) == 0.0


MICRO = replace(
    QUICK,
    name="micro",
    budget=Budget(
        steps_per_worker=4,
        batch_size=2,
        seq_len=16,
        eval_batches=1,
        inner_lr=3e-3,
        warmup_steps=1,
        evals_per_run=2,
    ),
    h1_workers=4,
    h1_outer=((0.7, 0.9), (0.5, 0.5)),
    workers=(4,),
    single_seed_workers=(),
    h_main=2,
    h_sweep=(1, 2),
    outer_lrs=(0.7,),
    outer_momenta=(0.9,),
    codecs=("fp32", "int8"),
    seeds=(0, 1),
)


def test_a_micro_grid_writes_every_table_finding_and_plot(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(execute, "_corpus", corpus)
    logged: list[str] = []
    md = paper.run(MICRO, out=tmp_path, jobs=1, log=logged.append)
    text = md.read_text()
    for heading in ("## Setup", "## Findings", "## (1)", "## (2)", "## (3)", "## (4)", "## Codecs"):
        assert heading in text
    for claim in ("(1) H=1", "(2) H=2", "(3) stragglers", "(4) sensitivity"):
        assert f"- {claim}" in text
    assert "incomplete" not in text and "| — | — |" not in text  # every run was reported
    assert "± " in text  # two seeds: spreads are shown
    for png in ("paper_micro_h1.png", "paper_micro_h2_n4.png", "paper_micro_straggler.png"):
        assert (tmp_path / png).stat().st_size > 10_000
    files = sorted(p for p in (tmp_path / "paper_micro").glob("*_*.json"))
    assert len(files) > len(MICRO.all_runs())  # the grid and the tuned H=1 runs
    invocations = json.loads((tmp_path / "paper_micro" / "invocations.json").read_text())
    assert [e["trained"] for e in invocations] == [len(files)]
    summary = json.loads(files[0].read_text())
    for key in ("final_val_loss", "val_loss_curve", "consensus_curve", "wall_clock_s", "args"):
        assert key in summary
    assert summary["args"]["command"].startswith("gaslocd simulate --workers 4")
    assert math.isfinite(summary["mean_model_val_loss"])

    # A second invocation trains nothing and reports the same numbers.
    again: list[str] = []
    paper.run(MICRO, out=tmp_path, jobs=1, train=False, log=again.append)
    assert md.read_text().split("## Findings")[1] == text.split("## Findings")[1]
    assert not any(line.startswith("[") for line in again)  # no "[i/n] trained" lines
