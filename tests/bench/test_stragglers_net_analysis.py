"""The slow-straggler benchmark's arithmetic (bench/stragglers_net.py): what its report says."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from gaslocd.protocol.account import ACTIVITIES
from gaslocd.protocol.linkcodec import message_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import stragglers_net as sn


def test_scenarios_start_with_the_calibration_run_and_pair_gasloc_with_diloco() -> None:
    names = [s.name for s in sn.scenarios([1, 3], [3, 10])]
    assert names == [
        "gasloc-none",
        "gasloc-1x",
        "diloco-1x",
        "gasloc-3x",
        "diloco-3x",
        "gasloc-3x-10x",
        "diloco-3x-10x",
    ]
    pair = sn.Straggle("gasloc", (3.0, 10.0))
    assert pair.label == "GASLoC overlap, stragglers at 3× and 10× T"
    assert pair.slow_hosts(4) == [3, 2]  # never the bootstrap peer (host 0)
    assert sn.Straggle("diloco", (0.5,)).tag == "0.5x"
    with pytest.raises(ValueError, match="more than"):
        sn.Straggle("gasloc", (1.0, 2.0, 3.0, 4.0)).slow_hosts(4)


def _host(train: float, fill: float, steps: list[int], straggler: bool = False) -> dict:
    time_s = {**dict.fromkeys(ACTIVITIES, 0.0), "train": train, "fill": fill, "other": 1.0}
    return {"time_s": time_s, "h": steps, "straggler": straggler}


def test_step_time_is_the_median_over_hosts_of_training_seconds_per_step() -> None:
    hosts = [_host(3.0, 0.0, [30]), _host(5.0, 1.0, [30, 30]), _host(9.0, 0.0, [30])]
    assert sn.step_time(hosts) == pytest.approx(0.1)  # 0.1, 0.1, 0.3
    assert sn.step_time([_host(1.0, 0.0, []), _host(2.0, 0.0, [10])]) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        sn.step_time([_host(1.0, 0.0, [])])


def test_a_straggler_at_k_rounds_gets_the_rate_whose_message_takes_k_rounds() -> None:
    numel, round_s = 246_240, 1.5
    rates = sn.host_rates(sn.Straggle("gasloc", (3.0, 10.0)), 4, 40.0, numel, "fp16", round_s)
    assert rates[:2] == [40.0, 40.0]
    fp16_bits = message_bytes("fp16", numel) * 8
    assert fp16_bits / (rates[3] * 1e6) == pytest.approx(3 * round_s)
    assert fp16_bits / (rates[2] * 1e6) == pytest.approx(10 * round_s)
    assert sn.link_rate_seconds(numel, "fp16", rates[3]) == pytest.approx(4.5)
    assert sn.host_rates(sn.Straggle("gasloc"), 3, 40.0, numel, "fp16", round_s) == [40.0] * 3


def test_the_common_target_is_the_reference_value_at_a_share_of_its_run() -> None:
    curve = [(10.0, 3.0), (40.0, 2.4), (50.0, 2.2), (60.0, 2.0), (90.0, 1.5)]
    assert sn.common_target(curve, 90.0, 2 / 3) == pytest.approx((2.4 + 2.2 + 2.0) / 3)
    assert math.isnan(sn.common_target(curve, 90.0, 0.01))


METRICS_BEFORE = """# HELP gasloc_exchanges_by_codec_total Exchanges of our θ̃ by codec
# TYPE gasloc_exchanges_by_codec_total counter
gasloc_exchanges_by_codec_total{codec="fp16"} 3.0
gasloc_sitting_out 0.0
"""
METRICS_AFTER = """gasloc_exchanges_by_codec_total{codec="fp16"} 3.0
gasloc_exchanges_by_codec_total{codec="q4"} 7.0
gasloc_long_exchanges_total{outcome="landed"} 2.0
gasloc_long_exchanges_total{outcome="failed"} 0.0
gasloc_sitting_out 1.0
gasloc_build_info{version="0.1.0",peer="x"} 1.0
"""


def test_metrics_are_parsed_and_counters_differenced_over_the_window() -> None:
    parsed = sn.parse_metrics(METRICS_AFTER)
    assert parsed["gasloc_sitting_out"] == {"": 1.0}
    assert parsed["gasloc_build_info"] == {"0.1.0": 1.0}
    family = "gasloc_exchanges_by_codec_total"
    assert sn.counter_delta(METRICS_BEFORE, METRICS_AFTER, family) == {"q4": 7}
    assert sn.counter_delta(None, METRICS_AFTER, "gasloc_long_exchanges_total") == {"landed": 2}
    assert sn.counter_delta(None, None, family) == {}


def test_sit_outs_and_tracebacks_are_read_from_a_daemon_log() -> None:
    log = "\n".join(
        [
            "round    12  H   30  loss 2.1",
            "round 13: our link needs 3 rounds per exchange; paired every 3 rounds from round 15",
            "something before",
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in f',
            "    boom()",
            "RuntimeError: boom",
            "round    14  H   30",
        ]
    )
    assert sn.sit_outs(log) == [(13, 3, 15)]
    trouble = sn.log_trouble(log, context=1)
    assert len(trouble) == 1
    assert trouble[0].startswith("something before\nTraceback")
    assert trouble[0].endswith("RuntimeError: boom")
    assert sn.log_trouble("all well") == []


def test_window_rounds_and_sat_out_rounds() -> None:
    rounds = [
        {"unix_time": 5.0, "roster": ["me"]},
        {"unix_time": 12.0, "roster": ["me"]},
        {"unix_time": 14.0, "roster": ["a", "me"]},
        {"unix_time": 30.0, "roster": ["me"]},
    ]
    inside = sn.window_rounds(rounds, 10.0, 20.0)
    assert len(inside) == 2 and sn.sat_out(inside) == 1


def test_ratios_bound_when_only_the_reference_never_got_there() -> None:
    assert sn.ratio(30.0, 60.0, 150.0) == (0.5, "0.50×")
    assert sn.ratio(30.0, None, 150.0) == (0.2, "< 0.20×")
    assert sn.ratio(None, 60.0, 150.0) == (None, "—")


def _run(name: str, algo: str, multiples: tuple[float, ...], curve: list, shares: list) -> dict:
    sc = sn.Straggle(algo, multiples)
    slow = set(sc.slow_hosts(len(shares)))
    hosts: list[dict[str, Any]] = []
    for i, share in enumerate(shares):
        time_s = {**dict.fromkeys(ACTIVITIES, 0.0), "train": share, "slow_link": 1 - share}
        hosts.append(
            {
                "host": i,
                "straggler": i in slow,
                "multiple": 10.0 if i in slow else None,
                "rate_mbit": 0.1 if i in slow else 40.0,
                "time_s": time_s,
                "accounted_s": 1.0,
                "training": share,
                "rounds": 40,
                "mean_h": 30.0,
                "h": [30] * 40,
                "sent_bytes": 2**20,
                "received_bytes": 2**20,
                "refused": 0,
                "failures": 0,
                "codecs": {"fp16": 30, "q4": 10} if algo == "gasloc" else {},
                "long": {"landed": 2} if i in slow and algo == "gasloc" else {},
                "sit_outs": [(5, 3, 8)] if i in slow and algo == "gasloc" else [],
                "sat_out_rounds": 6 if i in slow and algo == "gasloc" else 0,
                "exchanged": 30,
                "partners": 32,
                "tracebacks": [],
            }
        )
    assert name == sc.name
    return {
        "scenario": sc.name,
        "label": sc.label,
        "algo": algo,
        "tag": sc.tag,
        "multiples": list(multiples),
        "duration_s": 150.0,
        "killed": [],
        "hosts": hosts,
        "curve": curve,
    }


def test_the_report_checks_each_target_from_the_curves(tmp_path: Path) -> None:
    base = [(10.0, 3.0), (40.0, 2.5), (60.0, 2.2), (80.0, 2.0), (100.0, 1.9), (150.0, 1.8)]
    fast = [(10.0, 3.0), (30.0, 2.6), (50.0, 2.3), (70.0, 2.25), (110.0, 1.9), (150.0, 1.85)]
    diloco = [(20.0, 3.1), (60.0, 2.9), (100.0, 2.7), (140.0, 2.6), (150.0, 2.6)]
    runs = [
        _run("gasloc-none", "gasloc", (), base, [0.95] * 4),
        _run("gasloc-10x", "gasloc", (10.0,), fast, [0.93, 0.92, 0.88, 0.99]),
        _run("diloco-10x", "diloco", (10.0,), diloco, [0.5, 0.5, 0.5, 0.2]),
    ]
    meta = {
        "commands": ["python bench/stragglers_net.py"],
        "machine": "test",
        "date": "2026-12-03",
        "code": {"commit": "abc1234", "changed": ["gaslocd/x.py"], "digest": "00"},
        "workers": 4,
        "rate_mbit": 40.0,
        "fast_fp16_s": 0.1,
        "model": "tiny",
        "numel": 246_240,
        "fp16_bytes": 492_480,
        "codec": "fp16",
        "inner_steps": 30,
        "seq_len": 64,
        "batch_size": 8,
        "eval_every": 4,
        "eval_batches": 8,
        "duration": 150.0,
        "common_at": 2 / 3,
        "calibration": {"step_s": 0.05, "round_s": 1.5, "source": "given"},
        "straggler_rates": [(10.0, 0.26)],
    }
    numbers = sn.analyse(runs, meta)
    # Common target: base's last three points by 100 s: (2.2 + 2.0 + 1.9) / 3 = 2.0333,
    # reached by it at 80 s and by the straggler run at 110 s.
    assert numbers["common"] == pytest.approx(6.1 / 3)
    assert numbers["t_base"] == 80.0
    (row,) = numbers["rows"]
    # DiLoCo's final: (2.7 + 2.6 + 2.6) / 3 = 2.6333, first reached at 140 s by DiLoCo and
    # at 30 s by GASLoC.
    assert row["diloco_final"] == pytest.approx(7.9 / 3)
    assert (row["t_gasloc"], row["t_diloco"]) == (30.0, 140.0)
    assert row["vs_diloco"][:2] == (pytest.approx(30 / 140), "0.21×")
    assert row["vs_none"][:2] == (pytest.approx(110 / 80), "1.38×")
    assert row["fast_min"] == pytest.approx(0.88)
    text = sn.write_report(runs, meta, tmp_path)
    assert "- 10x: GASLoC ÷ DiLoCo to DiLoCo's final loss 0.21× (≤ 0.6: met)." in text
    assert "to the common target 1.38× (≤ 1.15: not met)." in text
    assert "non-straggler host 88.0% (≥ 90%: not met)." in text
    assert "| fp16 120 q4 40 | 2/0 | 6 |" in text  # codecs, long exchanges, sit-out rounds
    assert "uncommitted changes in 1 files (x.py)" in text
    assert "- tracebacks in host logs: 0" in text
    assert "announced a sit-out (their own link judged too slow): none" in text
    for stem in ("loss", "hosts", "bytes"):
        assert (tmp_path / f"{sn.STEM}_{stem}.png").stat().st_size > 0


def test_a_failed_run_names_the_daemon_that_gave_up_and_why() -> None:
    logs = {
        "host0": "bootstrap address: x\nround     1  H 30",
        "host3": "took state\ngaslocd: cannot start: could not fetch the run's state\n",
    }
    assert sn.exit_lines(logs) == "host3: gaslocd: cannot start: could not fetch the run's state"
    assert sn.exit_lines({"host0": ""}) == ""
