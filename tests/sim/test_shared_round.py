"""`gaslocd simulate` runs the daemon's round on real models: the steps that fill the wait
are trained, failed exchanges leave W doubly stochastic, a resync takes a live peer's
state, every round's pairing and W are in the summary, and a run is reproducible."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from gaslocd.algorithm.topology import plan_round
from gaslocd.config import AlgoConfig, SimConfig, Straggler, TrainConfig
from gaslocd.net.memory import fail_at
from gaslocd.sim.runner import SimResult, Simulation
from gaslocd.sim.summary import simulation_summary
from gaslocd.train.data import Corpus

pytestmark = pytest.mark.slow

FAST = TrainConfig(seq_len=16, batch_size=2, inner_lr=3e-3, warmup_steps=1, eval_batches=1, seed=2)
MB = 1_000_000


def _net(workers: int, rounds: int, **kw: Any) -> SimConfig:
    # 2 MB at 100 Mbit/s: 0.16 s per exchange; 4 × 0.1 s of compute per round.
    base: dict[str, Any] = dict(
        workers=workers,
        rounds=rounds,
        bandwidth_mbps=100,
        latency_ms=5,
        step_time_s=0.1,
        message_bytes=2 * MB,
        eval_every=rounds,
    )
    return SimConfig(**(base | kw))


def _summary(result: SimResult) -> dict[str, Any]:
    return json.loads(json.dumps(simulation_summary(result, {})))


def test_each_rounds_pairing_and_w_are_in_the_summary(corpus: Corpus) -> None:
    algo = AlgoConfig(topology="2peer", inner_steps=4)
    for run_id, expected_id in ((None, "sim-2"), ("my-run", "my-run")):
        sim = _net(5, 3, run_id=run_id)
        summary = _summary(Simulation(algo, FAST, sim, corpus=corpus).run())
        assert summary["run_id"] == expected_id
        for entry in summary["rounds"]:
            plan = plan_round("2peer", entry["roster"], entry["round"] - 1, expected_id)
            assert entry["edges"] == [list(e) for e in plan.edges()]
            w = torch.tensor(entry["mixing_matrix"], dtype=torch.float64)
            assert torch.allclose(w.sum(dim=0), torch.ones(5, dtype=torch.float64))
            assert torch.allclose(w, w.T)
            assert entry["inner_steps"] == [4] * 5 and entry["filled_steps"] == [0] * 5
        assert len(summary["compute_fraction_per_worker"]) == 5


def test_the_steps_that_fill_the_wait_are_trained(corpus: Corpus) -> None:
    sim = _net(4, 4, stragglers=(Straggler(0, 0.1),))
    simulation = Simulation(
        AlgoConfig(topology="1peer", inner_steps=4, adapt_h=True), FAST, sim, corpus=corpus
    )
    result = simulation.run()
    filled = [sum(r.filled_steps[k] for r in result.records) for k in range(4)]
    planned = [sum(r.inner_steps[k] for r in result.records) for k in range(4)]
    assert sum(filled) > 0
    assert [w.trainer.steps_done for w in simulation.workers] == [
        p + f for p, f in zip(planned, filled, strict=True)
    ]


def test_a_missed_deadline_is_a_failed_exchange_and_w_stays_doubly_stochastic(
    corpus: Corpus,
) -> None:
    sim = _net(4, 2, stragglers=(Straggler(0, 0.0005),))  # 2 MB at 25 kB/s per partner
    result = Simulation(AlgoConfig(topology="2peer", inner_steps=4), FAST, sim, corpus=corpus).run()
    assert result.records[0].failure_reasons == {"deadline": 2}  # worker 0's two edges
    # In round 2 its partners of round 1 open 60 s late: their new partners give up on them.
    assert result.records[1].exchange_failures > 2
    for record in result.records:
        assert record.exchange_failures == record.failure_reasons["deadline"]
        w = torch.tensor(record.mixing_matrix, dtype=torch.float64)
        assert w[0].tolist() == [1.0, 0.0, 0.0, 0.0]
        assert torch.allclose(w.sum(dim=0), torch.ones(4, dtype=torch.float64))
        assert torch.allclose(w, w.T)


def test_after_three_failed_rounds_a_peer_takes_a_live_peers_state(corpus: Corpus) -> None:
    simulation = Simulation(
        AlgoConfig(topology="2peer", inner_steps=2),
        FAST,
        _net(4, 3),
        corpus=corpus,
        edge_fails=fail_at([(t, "w000") for t in range(3)]),
    )
    result = simulation.run()
    assert [r.resyncs for r in result.records] == [(), (), (("w000", "w001"),)]
    me, source = simulation.workers[0], simulation.workers[1]
    assert torch.equal(me.theta_start, source.theta_start)
    assert torch.equal(me.momentum, source.momentum)
    assert me.round == source.round == 3


def test_a_run_is_reproducible_bit_for_bit(corpus: Corpus) -> None:
    sim = _net(4, 3, stragglers=(Straggler(1, 0.2),), eval_every=1)
    algo = AlgoConfig(topology="1peer", inner_steps=3, adapt_h=True)
    first, second = (_summary(Simulation(algo, FAST, sim, corpus=corpus).run()) for _ in range(2))
    for summary in (first, second):
        del summary["real_elapsed_s"]
    assert first == second
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
