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
import network
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
    # What the daemons send besides θ̃ is added to a straggler's link, not to the others.
    more = sn.host_rates(sn.Straggle("gasloc", (10.0,)), 2, 40.0, numel, "fp16", round_s, 0.1)
    assert more == [40.0, pytest.approx(fp16_bits / (10 * round_s) / 1e6 + 0.1)]


def test_control_traffic_is_the_link_bytes_less_the_wire_bytes_over_the_window() -> None:
    hosts = [
        {"sent_bytes": 2_000_000, "wire_sent": 1_000_000},
        {"sent_bytes": 3_000_000, "wire_sent": 1_500_000},
        {"sent_bytes": 10, "wire_sent": 99},
    ]
    # 1 MB, 1.5 MB and nothing (never below zero) besides θ̃ in 100 s: the median host's.
    assert sn.control_mbit(hosts, 100.0) == pytest.approx(1_000_000 * 8 / 100 / 1e6)


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
gasloc_dht_rpc_bytes_total{direction="sent",rpc="store",side="called"} 4096.0
gasloc_dht_rpc_bytes_total{direction="received",rpc="find",side="served"} 1024.0
gasloc_dht_rpc_bytes_total{direction="sent",rpc="find",side="served"} 3072.0
"""


def test_metrics_are_parsed_and_counters_differenced_over_the_window() -> None:
    parsed = sn.parse_metrics(METRICS_AFTER)
    assert parsed["gasloc_sitting_out"] == {"": 1.0}
    assert parsed["gasloc_build_info"] == {"x/0.1.0": 1.0}  # values by label name
    family = "gasloc_exchanges_by_codec_total"
    assert sn.counter_delta(METRICS_BEFORE, METRICS_AFTER, family) == {"q4": 7}
    assert sn.counter_delta(None, METRICS_AFTER, "gasloc_long_exchanges_total") == {"landed": 2}
    assert sn.counter_delta(None, None, family) == {}
    rpc = sn.counter_delta(None, METRICS_AFTER, "gasloc_dht_rpc_bytes_total")
    assert rpc == {
        "received/find/served": 1024,
        "sent/find/served": 3072,
        "sent/store/called": 4096,
    }
    # KiB by what they carried, both directions summed
    kib = sn.dht_rpc_kib({"dht_rpc": rpc})
    assert kib == {"reads we answered": 4.0, "our publishes": 4.0}
    assert sn.dht_rpc_kib({}) == {}


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


def _meta() -> dict[str, Any]:
    return {
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


def test_the_report_checks_each_target_from_the_curves(tmp_path: Path) -> None:
    base = [(10.0, 3.0), (40.0, 2.5), (60.0, 2.2), (80.0, 2.0), (100.0, 1.9), (150.0, 1.8)]
    fast = [(10.0, 3.0), (30.0, 2.6), (50.0, 2.3), (70.0, 2.25), (110.0, 1.9), (150.0, 1.85)]
    diloco = [(20.0, 3.1), (60.0, 2.9), (100.0, 2.7), (140.0, 2.6), (150.0, 2.6)]
    runs = [
        _run("gasloc-none", "gasloc", (), base, [0.95] * 4),
        _run("gasloc-10x", "gasloc", (10.0,), fast, [0.93, 0.92, 0.88, 0.99]),
        _run("diloco-10x", "diloco", (10.0,), diloco, [0.5, 0.5, 0.5, 0.2]),
    ]
    meta = _meta()
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
    # The full network-mean curve is there: no fallback, named nowhere.
    assert row["diloco_ref"] == {
        "loss": pytest.approx(7.9 / 3),
        "t": 140.0,
        "fallback": False,
        "evaluated": 0,  # these hosts carry no evals; the curve is given directly
        "hosts": 4,
    }
    assert "best single" not in text
    assert "| 2.6333 | 2.6333 | 140 s | — |" in text  # DiLoCo's own row: its final, its time
    assert "to the common target 1.38× (≤ 1.15: not met)." in text
    assert "non-straggler host 88.0% (≥ 90%: not met)." in text
    assert "| fp16 120 q4 40 | 2/0 | 6 |" in text  # codecs, long exchanges, sit-out rounds
    assert "uncommitted changes in 1 files (x.py)" in text
    assert "- tracebacks in host logs: 0" in text
    assert "announced a sit-out (their own link judged too slow): none" in text
    for stem in ("loss", "hosts", "bytes"):
        assert (tmp_path / f"{sn.STEM}_{stem}.png").stat().st_size > 0


def _no_curve(run: dict[str, Any], evals: list[list[tuple[float, float]]]) -> dict[str, Any]:
    """``run`` as a DiLoCo run whose hosts evaluated as in ``evals``: a host without any
    leaves the network-mean curve empty."""
    for h, e in zip(run["hosts"], evals, strict=True):
        h["evals"] = e
    run["curve"] = network.mean_loss_curve(evals)
    return run


# DiLoCo with its straggler (host 3) never evaluated in the window, as in the stored
# diloco-10x: its hosts hold the same model after each all-reduce, so their values agree.
NO_CURVE_10X = [[(30.0, 2.8), (95.0, 2.5)], [(31.0, 2.8), (91.0, 2.5)], [(60.0, 2.6)], []]
# Two stragglers, one never evaluated and one with a wild value (stored diloco-3x-10x).
NO_CURVE_PAIR = [[(38.0, 2.55), (100.0, 2.45)], [(39.0, 2.54)], [], [(95.0, 5.2)]]


def test_without_a_diloco_curve_the_reference_is_its_best_single_host_loss() -> None:
    d = _no_curve(_run("diloco-10x", "diloco", (10.0,), [], [0.5] * 4), NO_CURVE_10X)
    assert d["curve"] == []
    # The lowest any host reached, timed at the first evaluation at or below it.
    assert sn.diloco_reference(d) == {
        "loss": 2.5,
        "t": 91.0,
        "fallback": True,
        "evaluated": 3,
        "hosts": 4,
    }
    pair = _no_curve(_run("diloco-3x-10x", "diloco", (3.0, 10.0), [], [0.5] * 4), NO_CURVE_PAIR)
    ref = sn.diloco_reference(pair)
    assert (ref["loss"], ref["t"], ref["evaluated"]) == (2.45, 100.0, 3)  # 5.2 passed over
    assert sn.reference_name(ref) == "DiLoCo's best single-host loss (3 of 4 hosts evaluated)"
    nothing = _no_curve(_run("diloco-10x", "diloco", (10.0,), [], [0.5] * 4), [[], [], [], []])
    ref = sn.diloco_reference(nothing)
    assert math.isnan(ref["loss"]) and ref["t"] is None and ref["fallback"]
    assert sn.diloco_reference(None)["t"] is None


def test_the_report_times_gasloc_to_the_fallback_and_says_so(tmp_path: Path) -> None:
    base = [(10.0, 3.0), (40.0, 2.5), (60.0, 2.2), (80.0, 2.0), (100.0, 1.9), (150.0, 1.8)]
    fast = [(10.0, 3.0), (30.0, 2.6), (50.0, 2.45), (70.0, 2.25), (110.0, 1.9), (150.0, 1.85)]
    slow = [(10.0, 3.0), (40.0, 2.7), (70.0, 2.5), (150.0, 2.4)]
    runs = [
        _run("gasloc-none", "gasloc", (), base, [0.95] * 4),
        _run("gasloc-10x", "gasloc", (10.0,), fast, [0.93, 0.92, 0.91, 0.99]),
        _no_curve(_run("diloco-10x", "diloco", (10.0,), [], [0.5] * 4), NO_CURVE_10X),
        _run("gasloc-3x-10x", "gasloc", (3.0, 10.0), slow, [0.95, 0.95, 0.5, 0.5]),
        _no_curve(_run("diloco-3x-10x", "diloco", (3.0, 10.0), [], [0.5] * 4), NO_CURVE_PAIR),
    ]
    numbers = sn.analyse(runs, _meta())
    one, two = numbers["rows"]
    # 10x: DiLoCo's best single host 2.5 at 91 s; GASLoC's network mean at or below 2.5 at
    # 50 s: 50 / 91 = 0.55 ≤ 0.6.
    assert (one["diloco_final"], one["t_gasloc"], one["t_diloco"]) == (2.5, 50.0, 91.0)
    assert one["vs_diloco"] == (pytest.approx(50 / 91), "0.55×", True)
    assert one["diloco_ref"]["fallback"]
    # 3x+10x: 2.45 at 100 s (host 3's 5.2 passed over); GASLoC at 150 s: 1.50×.
    assert (two["diloco_final"], two["t_gasloc"], two["t_diloco"]) == (2.45, 150.0, 100.0)
    assert two["vs_diloco"][:2] == (pytest.approx(1.5), "1.50×")
    verdict = sn.verdicts(numbers["rows"])
    name = "DiLoCo's best single-host loss (3 of 4 hosts evaluated)"
    assert f"- 10x: GASLoC ÷ DiLoCo to {name} 0.55× (≤ 0.6: met)." in verdict
    assert f"- 3x-10x: GASLoC ÷ DiLoCo to {name} 1.50× (≤ 0.6: not met)." in verdict
    text = sn.write_report(runs, _meta(), tmp_path)
    assert "never reached DiLoCo" not in text
    assert "\n".join(verdict) in text
    # The targets' text names the fallback and the runs it stands in for.
    assert "diloco-10x (3 of 4 hosts evaluated), diloco-3x-10x (3 of 4 hosts" in text
    assert "**DiLoCo's best single-host loss**" in text
    # The table: the reference and the fallback in the row; DiLoCo's time to it its own.
    cell = "2.5000 (best single host; 3 of 4 hosts evaluated)"
    assert f"| 2.0000 | {cell} | 50 s | 0.55× |" in text  # GASLoC 10x
    assert f"| — | {cell} | 91 s | — |" in text  # DiLoCo 10x: no final loss of its own
    assert (tmp_path / f"{sn.STEM}_loss.png").stat().st_size > 0


def test_gasloc_short_of_the_fallback_is_not_met_and_no_reference_is_undecided() -> None:
    base = [(10.0, 3.0), (40.0, 2.5), (60.0, 2.2), (80.0, 2.0), (100.0, 1.9), (150.0, 1.8)]
    short = [(10.0, 3.0), (70.0, 2.7), (150.0, 2.6)]
    runs = [
        _run("gasloc-none", "gasloc", (), base, [0.95] * 4),
        _run("gasloc-10x", "gasloc", (10.0,), short, [0.95] * 4),
        _no_curve(_run("diloco-10x", "diloco", (10.0,), [], [0.5] * 4), NO_CURVE_10X),
        _run("gasloc-3x", "gasloc", (3.0,), short, [0.95] * 4),
        _no_curve(_run("diloco-3x", "diloco", (3.0,), [], [0.5] * 4), [[], [], [], []]),
    ]
    verdict = sn.verdicts(sn.analyse(runs, _meta())["rows"])
    assert (
        "- 10x: GASLoC ÷ DiLoCo to DiLoCo's best single-host loss (3 of 4 hosts evaluated) "
        "— (≤ 0.6: not met: GASLoC never reached DiLoCo's best single-host loss "
        "(3 of 4 hosts evaluated))." in verdict
    )
    assert verdict[3].startswith("- 3x: GASLoC ÷ DiLoCo to DiLoCo's best single-host loss")
    assert verdict[3].endswith(
        "(≤ 0.6: not decided: no DiLoCo reference (no DiLoCo run or none of its hosts evaluated))."
    )


def test_a_failed_run_names_the_daemon_that_gave_up_and_why() -> None:
    logs = {
        "host0": "bootstrap address: x\nround     1  H 30",
        "host3": "took state\ngaslocd: cannot start: could not fetch the run's state\n",
    }
    assert sn.exit_lines(logs) == "host3: gaslocd: cannot start: could not fetch the run's state"
    assert sn.exit_lines({"host0": ""}) == ""
