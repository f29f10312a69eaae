"""Stopping a real daemon: a second signal forces a prompt, clean exit whatever is in
progress (the round, the exchange, the final checkpoint), and never leaves a damaged or
half-written checkpoint behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from gaslocd.cli import main
from tests.daemon.procs import FAST_FLAGS, Daemon, start_first

pytestmark = [pytest.mark.net, pytest.mark.slow]


@pytest.mark.parametrize("when", ["at once", "0.3 s later", "after the closing line"])
def test_a_second_signal_exits_promptly_and_keeps_a_whole_checkpoint(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]], when: str
) -> None:
    ckpt = tmp_path / "ck"
    # The `small` model makes the final checkpoint take a noticeable time (tens of MB with
    # AdamW state), so the second signal lands in the stop sequence, not after it.
    daemon, _ = start_first(
        tmp_path,
        reaper,
        "--model",
        "small",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "1",
    )
    daemon.wait_for(r"round\s+2\s", 180)
    daemon.signal(signal.SIGTERM)
    daemon.wait_for(r"^stopping:", 30)
    if when == "0.3 s later":
        # Not synchronisation: one more timing of the second signal (a moment into the
        # stop sequence); the assertions hold for any timing.
        time.sleep(0.3)
    elif when == "after the closing line":
        # The event loop is gone but the DHT process is still being stopped: the default
        # action would kill the daemon with -15 here.
        daemon.wait_for(r"^stopped after", 60)
    began = time.monotonic()
    daemon.signal(signal.SIGTERM)
    status = daemon.finish(30)
    assert status == 0, daemon.output()
    assert time.monotonic() - began < 30
    saved = torch.load(ckpt / "checkpoint.pt", weights_only=True)
    assert saved["round"] >= 1
    assert torch.isfinite(saved["theta"]).all()
    assert not [p.name for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    if when == "at once":  # a daemon's checkpoint records its model: it can be exported
        assert main(["export", str(ckpt), "--out", str(tmp_path / "model")]) == 0
        assert (tmp_path / "model" / "model.safetensors").stat().st_size > 0


def test_a_stop_cuts_an_exchange_that_would_outlast_its_budget_and_still_checkpoints(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    """A partner frozen mid-run (SIGSTOP: its sockets stay open, nothing answers) would
    hold our exchange until its 120 s deadline, past what a supervisor gives a stop before
    SIGKILL. With --stop-timeout 20 the stop cuts that exchange so that the checkpoint
    still fits: the daemon exits 0, well before the deadline, with its checkpoint."""
    ckpt = tmp_path / "ck"
    common = ["--exchange-deadline", "120", "--min-peers", "2"]
    mine = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1", "--stop-timeout", "20"]
    first, address = start_first(tmp_path, reaper, *common, *mine)
    other = Daemon(["join", *FAST_FLAGS, "--bootstrap", address, *common], reaper, "w1")
    # The start-up says at once that this budget cannot wait out such a deadline.
    assert first.find(r"--stop-timeout 20 s is less than the exchange deadline \(120 s\)")
    first.wait_for(r"exchanged 1/1", 180)
    os.kill(other.proc.pid, signal.SIGSTOP)
    try:
        first.signal(signal.SIGTERM)
        cut = float(first.wait_for(r"^stopping: .*for (\d+) s at most", 30).group(1))
        assert 0 < cut < 20
        assert first.finish(60) == 0, first.output()  # not the 120 s deadline
    finally:
        os.kill(other.proc.pid, signal.SIGCONT)
    saved = torch.load(ckpt / "checkpoint.pt", weights_only=True)
    assert saved["round"] >= 1 and torch.isfinite(saved["theta"]).all()
