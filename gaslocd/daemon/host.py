"""A daemon on the main thread, its inner steps taken by a loop on a thread of its own.

This is how ``gaslocd start`` and ``join`` run (:func:`serve_own`: gaslocd's own inner
loop) and how a library user's script can run (``gaslocd.Peer.run``: the user's loop):
the same window handshake (:class:`~gaslocd.train.external.UserLoop`) that a user's
``peer.step(loss)`` goes through, so every daemon exercises it and the two cannot drift.
The daemon keeps the main thread because it owns the signals: SIGTERM or Ctrl-C finishes
the round, writes the checkpoint and leaves; a second one forces. The loop's thread only
ever stops at a step boundary (the handshake's windows), so nothing it half-did is saved.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial

from gaslocd.daemon.lifecycle import Daemon
from gaslocd.train.external import PeerStopped, UserLoop, own_loop, take_over

log = logging.getLogger(__name__)

EXIT_LOOP_FAILED = 1  # the loop raised (the daemon still finished the round and saved)
LOOP_JOIN_S = 60.0  # after the daemon stopped: how long its loop's step in progress may take
OPEN_POLL_S = 60.0  # the loop waits for the first window in slices this long


def serve_with_loop(
    daemon: Daemon, start: Callable[[], tuple[UserLoop, Callable[[], object]]]
) -> tuple[int, BaseException | None]:
    """Prepare ``daemon``, then serve it here with its signal handling while the loop that
    ``start()`` returns (called once the worker exists) runs on the ``gaslocd-loop``
    thread; returns the exit status and what the loop raised, if it did.

    When the loop returns, or raises, the daemon stops as at a first SIGTERM (the round's
    exchange, the checkpoint); a loop that raised makes the status 1."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("a hosted daemon needs the main thread (it owns the signals)")
    daemon.prepare()
    loop, train = start()
    daemon.handles_signals = True
    failed: list[BaseException] = []
    thread = threading.Thread(
        target=_run_loop, args=(daemon, loop, train, failed), name="gaslocd-loop", daemon=True
    )
    thread.start()
    try:
        status = daemon.serve()
    finally:
        loop.stop("the run is over")
    thread.join(LOOP_JOIN_S)
    error = failed[0] if failed else None
    return (EXIT_LOOP_FAILED if error is not None else status), error


def _run_loop(
    daemon: Daemon, loop: UserLoop, train: Callable[[], object], failed: list[BaseException]
) -> None:
    try:
        while not loop.wait_open(OPEN_POLL_S):
            pass
        train()
    except PeerStopped:
        pass  # the daemon stopped first; its exit status says why
    except BaseException as exc:
        failed.append(exc)
        log.exception("the training loop failed: stopping the peer")
    finally:
        loop.stop("the training loop ended")  # from this thread: at a step boundary
        daemon.request_stop()


def serve_own(daemon: Daemon) -> int:
    """``gaslocd start`` / ``join``: the daemon's own inner loop as the hosted loop."""

    def start() -> tuple[UserLoop, Callable[[], object]]:
        loop, inner = take_over(daemon.state, alive=lambda: True)
        return loop, partial(own_loop, loop, inner)

    return serve_with_loop(daemon, start)[0]
