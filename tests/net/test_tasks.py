"""Background tasks end when cancelled, even where ``wait_for`` swallowed the cancel
(gaslocd.net.tasks): the peer that never exited after its last round."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from gaslocd.net.tasks import cancel_and_wait, cancelled

WAIT_S = 5.0  # bound on every wait here


class Calls:
    """A DHT-like call per loop turn, bounded by ``wait_for`` as the daemon's are; the
    test answers the call in flight."""

    def __init__(self) -> None:
        self.inflight: asyncio.Future[int] | None = None
        self.turns = 0
        self.started = asyncio.Event()

    async def loop(self, check: bool) -> None:
        """A heartbeat-like loop; ``check``: it also stops when :func:`cancelled`."""
        while not (check and cancelled()):
            self.turns += 1
            self.inflight = asyncio.get_running_loop().create_future()
            self.started.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inflight, WAIT_S)

    async def swallow(self, task: asyncio.Task[None]) -> None:
        """Cancel ``task`` in the loop iteration in which its call's answer arrives."""
        await asyncio.wait_for(self.started.wait(), WAIT_S)
        assert self.inflight is not None
        self.inflight.set_result(1)
        task.cancel()
        for _ in range(3):
            await asyncio.sleep(0)


def test_wait_for_swallows_a_cancel_that_meets_its_result_so_a_plain_gather_hangs() -> None:
    """The hazard itself, on this Python: without it the rest of this file proves nothing."""

    async def main() -> None:
        calls = Calls()
        task = asyncio.ensure_future(calls.loop(check=False))
        await calls.swallow(task)
        assert not task.done() and calls.turns == 2  # it went on to its next call
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.gather(task)), 0.5)
        task.cancel()  # a second cancel meets no answer: it ends
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), WAIT_S)

    asyncio.run(main())


def test_a_loop_that_checks_cancelled_ends_after_a_swallowed_cancel() -> None:
    async def main() -> None:
        calls = Calls()
        task = asyncio.ensure_future(calls.loop(check=True))
        await calls.swallow(task)
        await asyncio.wait_for(asyncio.gather(task), WAIT_S)
        assert calls.turns == 1

    asyncio.run(main())


def test_cancel_and_wait_cancels_again_until_the_task_ends() -> None:
    async def main() -> None:
        calls = Calls()
        task = asyncio.ensure_future(calls.loop(check=False))
        await asyncio.wait_for(calls.started.wait(), WAIT_S)
        assert calls.inflight is not None
        calls.inflight.set_result(1)  # answered in the iteration of the first cancel
        left = await cancel_and_wait({task}, timeout_s=WAIT_S)
        assert left == set() and task.cancelled() and calls.turns == 2

    asyncio.run(main())


def test_cancel_and_wait_is_bounded_by_a_task_that_never_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task that ignores every cancel is left behind, named, and the caller goes on;
    tasks that fail are retrieved (no 'exception was never retrieved' at exit)."""

    released = False

    async def stubborn() -> None:
        while not released:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(WAIT_S)

    async def failing() -> None:
        raise ValueError("boom")

    async def main() -> None:
        bad, fails = asyncio.ensure_future(stubborn()), asyncio.ensure_future(failing())
        ok = asyncio.ensure_future(asyncio.sleep(WAIT_S))
        await asyncio.sleep(0)
        with caplog.at_level(logging.WARNING, logger="gaslocd.net.tasks"):
            left = await cancel_and_wait([bad, fails, ok], timeout_s=0.3, what="helpers")
        assert left == {bad} and ok.cancelled() and isinstance(fails.exception(), ValueError)
        assert "1 helpers still running" in caplog.text
        nonlocal released
        released = True
        bad.cancel()
        await asyncio.wait_for(asyncio.gather(bad, return_exceptions=True), WAIT_S)

    asyncio.run(main())
