"""Live daemons with a join token against an outsider's DHT client, and a stable identity.

Without the run credential, the audit's records (round 0, a huge round, a dead address, a
plain value over the roster key) slowed two daemons 20-300x or split them for good. Here
the same outsider keeps storing them while two daemons train: rounds must go on at a rate
near the one measured just before, in the same test, and nobody lists the outsider.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon.procs import FAST_FLAGS, Daemon, start_first

pytestmark = [pytest.mark.net, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
ATTACKER = Path(__file__).with_name("roster_attacker.py")
ROUNDS = 12  # per measurement: a few seconds on a loaded 2-core machine


def _time_rounds(daemon: Daemon, count: int) -> tuple[float, list[str]]:
    """Seconds ``daemon`` takes for its next ``count`` rounds, and their progress lines."""
    daemon.wait_for(r"round\s+\d+\s", 120)
    began, first = time.monotonic(), len(daemon.lines)
    for _ in range(count):
        daemon.wait_for(r"round\s+\d+\s", 120)
    return time.monotonic() - began, daemon.lines[first:]


def test_daemons_keep_exchanging_while_an_outsider_stores_forged_records(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    flags = ["--token", "s3cret", "--min-peers", "2", "--run-id", "sec"]
    first, address = start_first(tmp_path, reaper, *flags)
    second = Daemon(["join", *FAST_FLAGS, "--bootstrap", address, *flags], reaper, "w1")
    second.wait_for(r"exchanged 1/1", 120)
    baseline_s, _ = _time_rounds(first, ROUNDS)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    attacker = subprocess.Popen(
        [sys.executable, str(ATTACKER), "sec", address],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
        cwd=ROOT,
    )
    reaper.append(attacker)
    assert attacker.stdout is not None
    line = attacker.stdout.readline()  # bounded by the attacker's own 60 s and the test timeout
    assert line, f"attacker exited early with {attacker.wait()}"
    assert json.loads(line)["accepted"] == 0  # the daemons' DHT nodes refused every store

    attacked_s, lines = _time_rounds(first, ROUNDS)
    assert attacker.poll() is None, "the attacker stopped storing"
    # Generous: the attacker shares the two cores; what the audit saw was 20x to 300x.
    assert attacked_s < 3.0 * baseline_s + 5.0, (baseline_s, attacked_s)
    exchanged = [x for x in lines if "exchanged 1/1" in x]
    assert len(exchanged) >= ROUNDS // 2, "\n".join(lines)
    progress = [x for x in lines if x.startswith("round ")]
    assert progress and all("peers 2 " in x for x in progress), "\n".join(lines)
    os.killpg(attacker.pid, signal.SIGKILL)
    for daemon in (first, second):
        daemon.signal(signal.SIGTERM)
    for daemon in (first, second):
        assert daemon.finish(60) == 0


def test_a_restarted_daemon_keeps_its_peer_id(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    ckpt = tmp_path / "ckpt"
    ids = []
    for name in ("a", "b"):
        daemon = Daemon(
            ["start", *FAST_FLAGS, "--checkpoint-dir", str(ckpt), "--max-rounds", "1"],
            reaper,
            name,
        )
        ids.append(daemon.wait_for(r"start: peer (\S+) run", 120).group(1))
        assert daemon.finish(120) == 0
    assert ids[0] == ids[1]
    assert (ckpt / "identity.key").stat().st_mode & 0o777 == 0o600
