"""``Peer.run``: the daemon on the main thread with ``gaslocd join``'s signal handling, the
user's loop on a thread of its own (``gaslocd join`` itself runs this way: every daemon
test drives it). A real process, a real DHT and gRPC on 127.0.0.1."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.daemon.procs import Daemon

SCRIPT = Path(__file__).with_name("run_script.py")


def _run(mode: str, checkpoints: Path, reaper: list[subprocess.Popen[bytes]]) -> Daemon:
    argv = [sys.executable, str(SCRIPT), mode, str(checkpoints)]
    return Daemon([], reaper, f"run-{mode}", command=argv)


def test_sigterm_finishes_the_round_checkpoints_and_exits_0(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    peer = _run("loop", tmp_path, reaper)
    peer.wait_for(r"round\s+3\s", 180)
    peer.signal(signal.SIGTERM)
    assert peer.finish(90) == 0, peer.output()
    assert "stopping: finishing this round's exchange" in peer.output()
    assert "peer.run returned 0" in peer.output()
    assert (tmp_path / "checkpoint.pt").is_file()


def test_a_failing_loop_stops_the_peer_with_its_checkpoint_and_status_1(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    peer = _run("raise", tmp_path, reaper)
    assert peer.finish(180) == 1, peer.output()
    out = peer.output()
    assert "the training loop failed" in out and "a bug in the user's loop" in out
    # 10 steps: two whole rounds, and the third ends at the failed step (the steps before
    # it count), is exchanged and checkpointed as at a SIGTERM.
    assert re.search(r"peer.run returned 1 at round [23]\b", out), out
    assert (tmp_path / "checkpoint.pt").is_file()  # the rounds trained are kept
