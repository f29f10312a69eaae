"""hivemind's child processes (the DHT, the averager) and its blocking calls, made safe.

Shared by :mod:`gaslocd.net.discovery` and :mod:`gaslocd.net.allreduce`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from hivemind import DHT

from gaslocd.net import dht_traffic


def watch_parent(parent_pid: int, period_s: float = 1.0) -> None:
    """In a forked child: exit once the process that forked it is gone.

    hivemind's DHT and averager children outlive a parent killed with SIGKILL (or by the
    OOM killer) and would serve a stale node for ever; their p2pd follows them out.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        os._exit(1)

    threading.Thread(target=watch, name="gaslocd-watch-parent", daemon=True).start()


@contextlib.contextmanager
def scratch_event_loop() -> Iterator[None]:
    """Give hivemind's blocking calls an event loop that is closed afterwards.

    Each hivemind ``MPFuture`` calls ``asyncio.get_event_loop()``, which outside a running
    loop creates and installs one that nobody closes (two sockets and a ResourceWarning).
    Inside a running loop this does nothing; outside, it unsets the thread's loop after.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            yield
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    else:
        yield


def stop_process(process: Any, *, quick: bool = False) -> None:
    """Ask a hivemind child process to stop (``quick``: kill at once), then reap it."""
    if process.is_alive() and not quick:
        process.shutdown()  # asks, then waits up to its shutdown_timeout
    if process.is_alive():
        process.kill()
    if process.pid is not None:  # join() refuses a process that never started
        process.join(5)


class DHTProcess(DHT):
    """hivemind's DHT process, which also exits when its parent dies."""

    def run(self) -> None:
        watch_parent(self._parent_pid)
        dht_traffic.install()  # gasloc_dht_rpc_bytes_total: what the DHT costs our link
        super().run()
