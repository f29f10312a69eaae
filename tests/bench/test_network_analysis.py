"""The straggler benchmark's arithmetic (bench/network.py): what its table reports."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from gaslocd.protocol.account import ACTIVITIES

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


def _round(end: float, h: int, **seconds: float) -> dict[str, Any]:
    """A round record of a daemon's JSON summary: its end, H and time by activity."""
    time = {**dict.fromkeys(ACTIVITIES, 0.0), **seconds}
    return {"unix_time": end, "inner_steps": h, "time": time, "round_s": sum(time.values())}


def test_host_fractions_account_only_rounds_inside_the_window_by_activity() -> None:
    rounds = [
        _round(5.0, 99, train=9.0, wait_ready=9.0),  # before the window
        _round(12.0, 30, train=5.0, fill=1.0, wait_ready=0.5, transfer=0.5),
        _round(18.0, 10, train=1.0, slow_link=1.0),
        _round(25.0, 99, train=9.0, other=9.0),  # after it
    ]
    got = network.host_fractions(rounds, 10.0, 20.0)
    assert got["time_s"] == {
        **dict.fromkeys(ACTIVITIES, 0.0),
        **{"train": 6.0, "fill": 1.0, "wait_ready": 0.5, "transfer": 0.5, "slow_link": 1.0},
    }
    assert (got["accounted_s"], got["rounds"], got["mean_h"]) == (9.0, 2, 20.0)
    assert got["training"] == pytest.approx(7 / 9)  # train and fill are training
    shares = network.host_shares(got)
    assert shares is not None and sum(shares.values()) == pytest.approx(1.0)
    assert network.training_share(got) == pytest.approx(7 / 9)
    assert network.waiting_share(got) == pytest.approx(1.5 / 9)  # wait_ready + slow_link
    empty = network.host_fractions(rounds, 30.0, 40.0)
    assert (empty["training"], empty["rounds"], empty["mean_h"]) == (0.0, 0, 0.0)
    with pytest.raises(ValueError, match="no time account"):
        network.host_fractions([{"unix_time": 12.0, "inner_steps": 3, "idle_s": 1.0}], 10, 20)


def test_runs_measured_before_the_time_account_keep_their_numbers_and_are_marked() -> None:
    old = {"idle": 0.013, "compute": 0.66}  # idle then meant waiting for partners only
    assert network.host_shares(old) is None
    assert network.training_share(old) == 0.66
    assert network.waiting_share(old) == 0.013


def _host(i: int, straggler: bool, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "host": i,
        "straggler": straggler,
        **record,
        "sent_bytes": 2**20,
        "received_bytes": 2**20,
        "refused": 0,
        "failures": 0,
    }


def _run(name: str, algo: str, straggler: float | None, hosts: list[dict[str, Any]]) -> dict:
    sc = network.Scenario(name, algo, straggler)
    curve = [(10.0, 3.0), (60.0, 2.0), (120.0, 1.5)]
    return {
        "scenario": name,
        "label": sc.label,
        "algo": algo,
        "straggler": straggler,
        "adapt": True,
        "duration_s": 180.0,
        "hosts": hosts,
        "curve": curve,
    }


def test_the_report_shows_training_share_and_time_by_activity_per_host(tmp_path: Path) -> None:
    rounds = [
        _round(10.0 + k, 30, train=7.0, fill=1.0, wait_ready=0.5, slow_link=1.0, other=0.5)
        for k in range(5)
    ]
    fresh = network.host_fractions(rounds, 0.0, 100.0)  # 80% training, 15% waiting
    old = {"idle": 0.013, "compute": 0.66, "rounds": 60, "mean_h": 30.0}
    runs = [
        _run("gasloc-10", "gasloc", 0.1, [_host(0, False, fresh), _host(1, True, fresh)]),
        _run("diloco-10", "diloco", 0.1, [_host(0, False, old), _host(1, True, old)]),
    ]
    meta = {
        "commands": ["python bench/network.py"],
        "machine": "test",
        "date": "2026-12-03",
        "workers": 2,
        "rate_mbit": 40.0,
        "duration": 180.0,
        "model": "tiny",
        "codec": "fp16",
        "inner_steps": 30,
        "seq_len": 64,
        "batch_size": 8,
        "eval_every": 2,
        "target_loss": 2.0,
    }
    text = network.write_report(runs, meta, tmp_path, "net")
    assert "| training share, min–max | waiting for partners, max host |" in text
    assert "idle, max host" not in text and "compute share" not in text
    # The accounted run: 80% training, 15% waiting; a row per host by activity.
    assert "| GASLoC 1-peer, adaptive H, 10% straggler | 180 s |" in text
    assert "| 80%–80% | 15.0% |" in text
    assert "| gasloc-10 | 1* | 80.0% | 70.0% | 10.0% | 5.0% | 0.0% | 10.0% |" in text
    assert "waiting for partners (wait_ready + slow_link) on any host is 15.0%" in text
    assert "(target < 10%: not met); its lowest training share is 80%" in text
    # The old run keeps its measured numbers, marked as measured with the old idle.
    assert "| DiLoCo, 10% straggler † | 720 s |" not in text
    assert "| DiLoCo, 10% straggler † | 180 s |" in text and "| 66%–66% | 1.3% |" in text
    assert "| diloco-10 | 0 |" not in text  # no breakdown it never measured
    assert "† Measured before the daemons kept a time account" in text
    assert (tmp_path / "net_hosts.png").stat().st_size > 0


def test_scenarios_pair_each_straggler_run_with_its_diloco_and_no_straggler_runs() -> None:
    names = [s.name for s in network.scenarios([0.1])]
    assert names == ["gasloc-none", "diloco-none", "gasloc-10", "gasloc-fixedh-10", "diloco-10"]
    assert network.scenarios([0.2])[2].label == "GASLoC 1-peer, adaptive H, 20% straggler"


def test_a_run_takes_a_lab_number_no_other_namespace_holds() -> None:
    names = ["gl5hub", "gl5n0", "gl6hub", "other", "gl7n0"]
    assert network.free_lab(names, first=5) == 8  # a leaf alone holds its lab too
    assert network.free_lab([], first=200) == 200
    assert network.free_lab(["gl200hub"], first=200) == 1
