"""Shared fixtures. Child processes started by a test are reaped even when it fails."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to append started processes to; each is killed and waited for afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
