"""Signal handlers around :meth:`gaslocd.daemon.lifecycle.Daemon.run`.

While the event loop runs, its own handlers stop the daemon (a second signal forces it).
Before and after, these keep a signal from killing the process with the default action
while it still stops its child processes, and put back whatever handlers the embedding
program had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
Handler = Callable[[int, FrameType | None], Any] | int | None


class Hurry(Exception):
    """A signal after the event loop's handlers are gone: finish stopping, quickly."""


def hurry(_signum: int, _frame: FrameType | None) -> None:
    raise Hurry


def current_handlers() -> dict[signal.Signals, Handler]:
    return {sig: signal.getsignal(sig) for sig in SIGNALS}


def set_handlers(handler: Handler) -> None:
    for sig in SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread: the embedder's choice
            signal.signal(sig, handler)


def restore_handlers(previous: dict[signal.Signals, Handler]) -> None:
    """Put back the handlers the embedding program had before :meth:`Daemon.run`."""
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):  # not the main thread, or None
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# What a stop needs after the round and its checkpoint: withdrawing the DHT record (5 s
# at most), stopping the server (2 s), and a margin for a loaded machine.
AFTER_CHECKPOINT_S = 10.0
MIN_CHECKPOINT_S = 5.0


class StopBudget:
    """How a stop spends the time between SIGTERM and the supervisor's SIGKILL (Docker's
    ``stop_grace_period`` / ``docker stop -t``; ``--stop-timeout`` says how long it is).

    The round in progress finishes, but its exchange is cut short when waiting longer
    would leave too little for the checkpoint: a partner that hangs until a long deadline
    must not cost us the checkpoint. Free of the clock: callers pass ``now``.
    """

    def __init__(self, timeout_s: float, model_bytes: int) -> None:
        self.timeout_s = timeout_s
        # Until one is measured: θ, θ at the round start and the momentum at 50 MB/s.
        self.checkpoint_s = 1.0 + 3 * model_bytes / 50e6
        self.signalled_at: float | None = None

    def measured(self, checkpoint_s: float) -> None:
        self.checkpoint_s = checkpoint_s

    def reserve_s(self) -> float:
        """What the stop keeps for after the round: the checkpoint (1.5× its last time)
        and the rest of the shutdown."""
        return 1.5 * self.checkpoint_s + AFTER_CHECKPOINT_S

    def signalled(self, now: float) -> float:
        """The stop begins at ``now``: seconds until the round's exchange is cut."""
        self.signalled_at = now
        return max(0.0, self.timeout_s - self.reserve_s())

    def checkpoint_timeout_s(self, now: float) -> float:
        """How long the final checkpoint may take from ``now`` (never under 5 s: a
        checkpoint cut short is worth less than a few seconds past the budget)."""
        began = now if self.signalled_at is None else self.signalled_at
        return max(MIN_CHECKPOINT_S, began + self.timeout_s - now - AFTER_CHECKPOINT_S)

    def too_short(self, deadline_s: float | None) -> str | None:
        """A warning when a round's exchange may outlast the budget (None: it fits)."""
        need = None if deadline_s is None else deadline_s + self.reserve_s()
        if need is None or need <= self.timeout_s:
            return None
        return (
            f"--stop-timeout {self.timeout_s:g} s is less than the exchange deadline "
            f"({deadline_s:g} s) plus the checkpoint and shutdown (~{self.reserve_s():.0f} s): "
            f"a stop will cut its round's exchange short; give the daemon {need:.0f} s "
            "(docker: --stop-timeout / stop_grace_period) to let it finish"
        )


def stop_children(discovery: Any, allreduce: Any | None, late_signal: bool) -> None:
    """Stop the averager and DHT processes; a signal meanwhile makes it a kill.

    The event loop's handlers are gone by now, so without this a signal in the few
    seconds a graceful child stop can take would kill the daemon with the default
    action instead of exiting 0."""
    children = [c for c in (allreduce, discovery) if c is not None]
    try:
        # Inside the try: a signal that lands while the handlers are being set runs
        # `hurry` at once (a clean-clone test run saw it escape as a traceback, exit 1).
        set_handlers(hurry)
        if late_signal:
            raise Hurry
        for child in children:
            child.shutdown()
    except Hurry:
        set_handlers(signal.SIG_IGN)
        log.warning("signal while stopping the DHT: killing it")
        for child in children:
            child.shutdown(quick=True)


async def unless_forced(force: asyncio.Event, coro: Any, timeout_s: float) -> bool:
    """Run ``coro`` for at most ``timeout_s``; give up at once when ``force`` is set (a
    second signal).

    Shielded from the main task's cancellation (a second signal cancels it): the
    force event is what ends the wait, so the rest of the shutdown still runs."""
    job = asyncio.ensure_future(coro)
    forced = asyncio.ensure_future(force.wait())
    try:
        done, _ = await asyncio.shield(
            asyncio.wait({job, forced}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        )
    except asyncio.CancelledError:
        done = set()
    finally:
        forced.cancel()
    if job not in done:
        job.cancel()
        return False
    if job.exception() is not None:
        log.error("shutdown step failed: %s", job.exception())
        return False
    return True
