"""Real daemon processes for tests: start, read their lines, wait for one with a deadline."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

# Small and fast: a tiny model on short sequences, a few steps per round.
FAST_FLAGS = [
    "--seq-len", "32", "--batch-size", "4", "--eval-batches", "2", "--warmup-steps", "2",
    "--inner-lr", "3e-3", "--inner-steps", "4", "--port", "0", "--heartbeat", "1",
    "--record-ttl", "4",
]  # fmt: skip


def gaslocd_argv(args: list[str]) -> list[str]:
    """``python -m gaslocd`` with ``args``, quiet below warnings (progress lines stay)."""
    return [sys.executable, "-m", "gaslocd", "--log-level", "WARNING", *args]


def wait_checkpoint(path: Path, timeout_s: float) -> dict[str, object]:
    """The checkpoint at ``path`` once it exists and reads whole (polled, bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return torch.load(path, weights_only=True)  # type: ignore[no-any-return]
        except (OSError, RuntimeError, EOFError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # polling for a file, bounded by the deadline above


class Daemon:
    """One ``gaslocd`` process whose output lines are collected as they come."""

    def __init__(
        self,
        args: list[str],
        reaper: list[subprocess.Popen[bytes]],
        name: str = "d",
        *,
        command: list[str] | None = None,
    ) -> None:
        """``command`` replaces the whole command line (another entry point, or one run
        inside a network namespace); by default ``python -m gaslocd`` with ``args``."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.name = name
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(
            command or gaslocd_argv(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        reaper.append(self.proc)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._queue.put(raw.decode(errors="replace").rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first new line matching ``pattern``; fails with the output on timeout/exit."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.name}: no line like {pattern!r} in {timeout_s} s:\n" + self.output()
                )
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self._queue.put(None)
                raise AssertionError(
                    f"{self.name} exited ({self.proc.wait()}) before {pattern!r}:\n" + self.output()
                )
            self.lines.append(line)
            match = regex.search(line)
            if match:
                return match

    def find(self, pattern: str) -> re.Match[str]:
        """The first line already read that matches ``pattern``."""
        regex = re.compile(pattern)
        for line in self.lines:
            match = regex.search(line)
            if match:
                return match
        raise AssertionError(f"{self.name}: no line like {pattern!r} so far:\n" + self.output())

    def rounds(self) -> list[re.Match[str]]:
        return [m for m in (ROUND.search(line) for line in self.lines) if m]

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def finish(self, timeout_s: float) -> int:
        """Wait for exit, draining the output; returns the exit status."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{self.name} did not exit within {timeout_s} s:\n" + self.output()
                ) from None
            if line is None:
                self._queue.put(None)
                return self.proc.wait(timeout=30)
            self.lines.append(line)


ROUND = re.compile(
    r"round\s+(?P<round>\d+)\s+H\s+(?P<h>\d+)\s+loss (?P<loss>[\d.]+|nan)\s+val\s+(?P<val>[\d.]+|-)"
    r".*consensus\s+(?P<consensus>[\d.e+-]+|-)\s+idle.*exchanged (?P<ok>\d+)/(?P<partners>\d+)"
)


def summary_rounds(path: Path) -> list[dict[str, Any]]:
    """The per-round records of a daemon's ``--json`` summary (written at exit): what
    tests read instead of parsing progress lines, once a daemon has stopped."""
    rounds = json.loads(path.read_text())["rounds"]
    assert isinstance(rounds, list)
    return rounds


def start_first(
    tmp: Path, reaper: list[subprocess.Popen[bytes]], *extra: str, name: str = "w0"
) -> tuple[Daemon, str]:
    """A ``gaslocd start`` daemon and its bootstrap address."""
    address_file = tmp / f"{name}.addr"
    daemon = Daemon(
        ["start", *FAST_FLAGS, "--address-file", str(address_file), *extra], reaper, name
    )
    match = daemon.wait_for(r"bootstrap address: (\S+)", 120)
    return daemon, match.group(1)
