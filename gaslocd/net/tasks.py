"""Cancelling background tasks so that they do end, within a bound.

Why not ``task.cancel()`` and then ``gather``: on Python 3.11, ``asyncio.wait_for``
swallows a cancellation that arrives in the same loop iteration as the result it waits
for: it returns the result instead (3.12 reimplemented it on ``asyncio.timeout``). The
DHT calls were bounded by ``wait_for`` (now ``asyncio.timeout``; some gRPC waits still
are), so a looping task (the heartbeat, the roster prefetch) whose cancel met a
finishing call carried on as if never cancelled, and
a ``gather`` on it waited forever: a peer that had finished its last round never exited
(CI; reproduced on a loaded machine in 1 of 83 and 1 of 150 runs of the first run of
tests/api/test_own_loop.py: the roster prefetch's loop, marked cancelling, asleep).
So the cancel is repeated until the tasks end, the wait is bounded (the caller goes on
without what did not end, named in a warning), and the loops check :func:`cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_S = 0.05  # how often a cancel is repeated while a task has not ended


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any]], timeout_s: float = 5.0, what: str = "tasks"
) -> set[asyncio.Future[Any]]:
    """Cancel ``tasks`` and wait, at most ``timeout_s``, until every one has ended,
    cancelling again those that swallowed the cancel. Returns those still running (a
    warning names how many). Exceptions of the tasks are retrieved and dropped, as
    ``gather(..., return_exceptions=True)`` would."""
    tasks = list(tasks)  # a set that done-callbacks shrink (Runtime.tasks) is copied first
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending and (left := deadline - loop.time()) > 0:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: no "exception never retrieved" at exit
    if pending:
        log.warning("%d %s still running %.0f s after a cancel", len(pending), what, timeout_s)
    return pending


def cancelled(task: asyncio.Task[Any] | None = None) -> bool:
    """Whether ``task`` (default: the current one) was asked to stop, even when the
    request was swallowed (see the module's docstring): a loop checks it each turn."""
    task = task if task is not None else asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def at_most(coro: Coroutine[Any, Any, Any], timeout_s: float) -> None:
    """Run ``coro`` for at most ``timeout_s``, then cancel it; raises what it raised when
    it ended in time (a gRPC abort's exception, say, which ends the handler)."""
    task = asyncio.ensure_future(coro)
    if (await asyncio.wait({task}, timeout=timeout_s))[0]:
        task.result()
    task.cancel()
