"""The straggler benchmark's arithmetic (bench/network.py): what its table reports."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import network


def test_the_network_mean_starts_once_every_host_has_a_value_and_follows_the_latest() -> None:
    evals = [[(1.0, 4.0), (5.0, 2.0)], [(2.0, 3.0), (4.0, 1.0)]]
    assert network.mean_loss_curve(evals) == [(2.0, 3.5), (4.0, 2.5), (5.0, 1.5)]
    assert network.mean_loss_curve([[(1.0, 4.0)], []]) == []


def test_time_to_target_and_final_loss() -> None:
    curve = [(1.0, 3.0), (2.0, 2.5), (3.0, 2.6), (4.0, 2.0)]
    assert network.time_to(curve, 2.55) == 2.0
    assert network.time_to(curve, 1.0) is None
    assert network.final_loss(curve, tail=2) == 2.3
    assert math.isnan(network.final_loss([]))


def test_host_fractions_count_only_rounds_inside_the_window() -> None:
    rounds = [
        {"unix_time": 5.0, "idle_s": 9.0, "compute_s": 9.0, "inner_steps": 99},  # before
        {"unix_time": 12.0, "idle_s": 1.0, "compute_s": 6.0, "inner_steps": 30},
        {"unix_time": 18.0, "idle_s": 0.0, "compute_s": 2.0, "inner_steps": 10},
        {"unix_time": 25.0, "idle_s": 9.0, "compute_s": 9.0, "inner_steps": 99},  # after
    ]
    got = network.host_fractions(rounds, 10.0, 20.0)
    assert got == {"idle": 0.1, "compute": 0.8, "rounds": 2, "mean_h": 20.0}


def test_scenarios_pair_each_straggler_run_with_its_diloco_and_no_straggler_runs() -> None:
    names = [s.name for s in network.scenarios([0.1])]
    assert names == ["gasloc-none", "diloco-none", "gasloc-10", "gasloc-fixedh-10", "diloco-10"]
    assert network.scenarios([0.2])[2].label == "GASLoC 1-peer, adaptive H, 20% straggler"
