"""Where a real daemon's time goes: the categories add up to its wall-clock, and a late
partner shows up as waiting, in the JSON summary, the metrics and ``gaslocd status``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.daemon.procs import FAST_FLAGS, Daemon, start_first

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no {name}{labels} in the scrape"
    return float(match.group(1))


def test_a_late_partner_shows_up_as_waiting_and_the_account_sums_to_the_wall_clock(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    # The quick peer takes 4 steps a round without adapting; its partner 24: the quick
    # one must wait most of each round, and its account has to say so.
    common = ["--min-peers", "2", "--max-rounds", "14", "--no-adapt-h"]
    metrics = ["--metrics-port", "0"]
    quick, address = start_first(
        tmp_path, reaper, *common, "--metrics-port", "0", "--json", str(tmp_path / "q.json")
    )
    slow = Daemon(
        ["join", *FAST_FLAGS, "--bootstrap", address, *common, "--inner-steps", "24", *metrics],
        reaper,
        "slow",
    )
    port = quick.find(r"metrics :(\d+)").group(1)
    grpc_port = quick.find(r"gRPC 127\.0\.0\.1:(\d+)").group(1)
    quick.wait_for(r"round\s+3\s", 180)
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    text = scrape.decode()
    by_activity = {
        a: _metric(text, "gasloc_time_seconds_total", f'{{activity="{a}"}}')
        for a in ("train", "fill", "wait_ready", "transfer", "slow_link", "roster", "other")
    }
    assert by_activity["wait_ready"] > by_activity["train"]
    idle = _metric(text, "gasloc_idle_seconds_total")
    training = by_activity["train"] + by_activity["fill"]
    assert idle > training  # idle now means "not training", late partners included
    status = subprocess.run(
        [sys.executable, "-m", "gaslocd", "status", f"127.0.0.1:{grpc_port}", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert 0 < float(json.loads(status.stdout)["training_share"]) < 0.5
    # The slow peer's rounds end with its steps (its partner is ready by then): each
    # next roster was read while those steps ran, and no round start waited for it.
    slow.wait_for(r"round\s+6\s", 180)
    slow_port = slow.find(r"metrics :(\d+)").group(1)
    text = urllib.request.urlopen(f"http://127.0.0.1:{slow_port}/metrics", timeout=10).read()
    reads = {
        s: _metric(text.decode(), "gasloc_roster_reads_total", f'{{source="{s}"}}')
        for s in ("prefetched", "quick", "at_round_start", "stale", "failed")
    }
    assert reads["prefetched"] >= 3 and reads["failed"] == 0, reads
    # Two nodes, each the other's neighbour: our node's copy has every record, and most
    # reads ask nobody else (gaslocd.net.roster_read).
    dht = _metric(text.decode(), "gasloc_dht_reads_total", '{kind="quick"}')
    assert dht >= 3, dht
    # What those reads and the publishes carried, as of a heartbeat: stores to the other
    # node each round, and its stores to us.
    for side in ("called", "served"):
        labels = f'{{direction="sent",rpc="store",side="{side}"}}'
        assert _metric(text.decode(), "gasloc_dht_rpc_bytes_total", labels) > 0, side
    assert quick.finish(180) == 0 and slow.finish(120) == 0, quick.output()
    summary = json.loads((tmp_path / "q.json").read_text())
    rounds = summary["rounds"]
    assert len(rounds) == 14
    for r in rounds:
        assert sum(r["time"].values()) == pytest.approx(r["round_s"], rel=1e-6)
        # `roster` by part (read, pace, resync, pause): what a bench reads to say why
        assert set(r["roster_parts"]) >= {"read", "pace"}, r
        assert sum(r["roster_parts"].values()) == pytest.approx(r["time"]["roster"], abs=2e-3)
        assert r["training_share"] == pytest.approx(
            (r["time"]["train"] + r["time"]["fill"]) / r["round_s"]
        )
    # The rounds tile the run: their sum is the wall-clock within 2 %.
    assert sum(r["round_s"] for r in rounds) == pytest.approx(summary["wall_clock_s"], rel=0.02)
    assert sum(summary["time"].values()) == pytest.approx(summary["wall_clock_s"], rel=0.02)
    waited = sum(r["time"]["wait_ready"] for r in rounds[1:])
    trained = sum(r["time"]["train"] for r in rounds[1:])
    assert waited > 2 * trained, rounds
    assert summary["training_share"] < 0.5
    assert summary["idle_fraction"] == pytest.approx(1 - summary["training_share"], abs=1e-6)
    assert any("training" in line for line in quick.lines)


def test_a_lone_daemon_spends_its_time_training(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    out = tmp_path / "a.json"
    alone, _ = start_first(
        tmp_path, reaper, "--max-rounds", "5", "--eval-every", "0", "--json", str(out)
    )
    assert alone.finish(120) == 0
    summary = json.loads(out.read_text())
    assert summary["training_share"] > 0.5, summary["time"]
    assert summary["time"]["wait_ready"] == pytest.approx(0.0, abs=0.05)
