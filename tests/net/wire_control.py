"""Start and drive ``wire_peer.py`` processes from the tests; every wait has a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENV = {
    **os.environ,
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "1073741824",
    "OMP_NUM_THREADS": "1",
}


class PeerProcess:
    """One ``wire_peer.py`` child; its stdout lines are parsed on a reader thread."""

    def __init__(self, peer_id: str, log_dir: Path, *args: str, wait: bool = True) -> None:
        self.peer_id = peer_id
        self.stderr_path = log_dir / f"{peer_id}.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "wire_peer.py"), "--peer-id", peer_id, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=ENV,
            start_new_session=True,  # the reaper kills the whole group
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = 0
        self.address = ""
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 90) -> PeerProcess:
        ready = self.expect("ready", timeout_s)
        self.port = ready["port"]
        self.address = f"127.0.0.1:{self.port}"
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)  # EOF

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def expect(self, op: str, timeout_s: float) -> dict[str, Any]:
        """The next line, which must be ``op``; fails with the child's stderr otherwise."""
        try:
            msg = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(
                f"{self.peer_id}: no {op!r} within {timeout_s} s{self._tail()}"
            ) from None
        if msg is None:
            raise AssertionError(f"{self.peer_id} exited (rc={self.proc.poll()}){self._tail()}")
        assert msg["op"] == op, f"{self.peer_id}: expected {op!r}, got {msg}"
        return msg

    def start_round(
        self, round_: int, partners: dict[str, str], deadline_s: float, **kw: Any
    ) -> None:
        self.send(op="round", round=round_, partners=partners, deadline_s=deadline_s, **kw)
        self.expect("opened", 30)

    def stats(self) -> dict[str, Any]:
        self.send(op="stats")
        return self.expect("stats", 30)["stats"]

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def quit(self, timeout_s: float = 20) -> None:
        if self.proc.poll() is None:
            self.send(op="quit")
            self.expect("bye", timeout_s)
            self.proc.wait(timeout_s)
        self.close_pipes()

    def close_pipes(self) -> None:
        """After the child exited: let the reader see EOF, then close our ends."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self._reader.join(10)
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()
        self._stderr.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.close_pipes()

    def _tail(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        text = self.stderr_path.read_text(errors="replace")[-3000:]
        return f"\n--- stderr of {self.peer_id} ---\n{text}" if text else ""


def start_peers(log_dir: Path, specs: dict[str, list[str]]) -> dict[str, PeerProcess]:
    """Start one process per ``{peer_id: args}`` at once, then wait until all serve."""
    peers = {pid: PeerProcess(pid, log_dir, *args, wait=False) for pid, args in specs.items()}
    try:
        for peer in peers.values():
            peer.wait_ready()
    except BaseException:
        for peer in peers.values():
            peer.kill()
        raise
    return peers
