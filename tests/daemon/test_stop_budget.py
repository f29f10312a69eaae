"""The stop budget (daemon/signals.py), driven by a fake clock: how long a stopping
daemon may wait for its round's exchange, and how long its final checkpoint may take;
and that a stopping daemon starts no state fetch that could outlast it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gaslocd.daemon import signals
from gaslocd.daemon.membership import Membership, StateBusy
from gaslocd.daemon.signals import AFTER_CHECKPOINT_S, MIN_CHECKPOINT_S, StopBudget
from tests.protocol.records import record


def test_the_exchange_is_cut_to_leave_the_checkpoint_its_measured_time() -> None:
    budget = StopBudget(60.0, 0)
    budget.measured(4.0)
    cut = budget.signalled(now=100.0)
    assert cut == pytest.approx(60.0 - 1.5 * 4.0 - AFTER_CHECKPOINT_S)
    # After the cut, the checkpoint gets what is left of the budget (less the shutdown).
    assert budget.checkpoint_timeout_s(now=100.0 + cut) == pytest.approx(1.5 * 4.0)
    # A round that ended at once leaves it more; a late one never less than the floor.
    assert budget.checkpoint_timeout_s(now=101.0) == pytest.approx(60.0 - 1.0 - 10.0)
    assert budget.checkpoint_timeout_s(now=200.0) == MIN_CHECKPOINT_S


def test_a_large_model_is_given_time_for_its_first_checkpoint_before_any_is_measured() -> None:
    small, large = StopBudget(60.0, 10**6), StopBudget(60.0, 4 * 10**9)  # 1 MB, 4 GB
    assert small.signalled(0.0) > 45.0
    assert large.signalled(0.0) == 0.0  # 3 × 4 GB at 50 MB/s: no time to wait at all
    assert StopBudget(60.0, 0).checkpoint_timeout_s(now=5.0) == 50.0  # no signal: a max-rounds end


def test_a_deadline_the_budget_cannot_wait_out_is_named_at_start_up() -> None:
    budget = StopBudget(60.0, 0)
    budget.measured(2.0)
    assert budget.too_short(None) is None  # the derived deadline: cut when needed
    assert budget.too_short(30.0) is None
    why = budget.too_short(120.0)
    assert why is not None and "120 s" in why and "--stop-timeout 60 s" in why
    assert "give the daemon 133 s" in why


def _membership(stopping: bool) -> tuple[Membership, list[object]]:
    """A Membership over a stand-in runtime (only what resync touches), whose state
    fetches are refused as busy and recorded."""
    rt = SimpleNamespace(
        stopping=stopping,
        me="a",
        clock=lambda: 0.0,
        cfg=SimpleNamespace(heartbeat_s=3.0),
        spawn=asyncio.ensure_future,
        telemetry=SimpleNamespace(metrics=SimpleNamespace()),
    )
    membership = Membership(rt)  # type: ignore[arg-type]
    fetches: list[object] = []

    async def busy(others: object) -> int:
        fetches.append(others)
        raise StateBusy("every peer asked was at its GetState limit")

    membership._fetch_state_once = busy  # type: ignore[method-assign]
    return membership, fetches


def test_a_stopping_daemon_neither_starts_nor_retries_a_state_fetch() -> None:
    # Seen in the netns bench: a DiLoCo daemon asked to stop resynchronised in its last
    # round and kept re-fetching (each try up to minutes) until it was killed, its
    # summary never written. Leaving, it keeps its θ for the checkpoint.
    membership, fetches = _membership(stopping=True)
    asyncio.run(membership.resync([record("a"), record("b"), record("c")]))
    assert fetches == []
    with pytest.raises(StateBusy):  # a fetch under way when the stop came: no retry
        asyncio.run(membership.fetch_state([record("b")]))
    assert len(fetches) == 1


class _Child:
    def __init__(self) -> None:
        self.stops: list[bool] = []

    def shutdown(self, quick: bool = False) -> None:
        self.stops.append(quick)


def test_a_signal_while_the_stop_handlers_are_set_kills_the_children_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second signal of a stop can land between installing the handler for SIGTERM
    and the one for SIGINT: the handler runs at once, and its Hurry must end in a quick
    stop of the children, not escape (a clean-clone run exited 1 with that traceback)."""
    import os
    import signal as sig

    real = sig.signal
    previous = signals.current_handlers()
    sent = []

    def signal_then_deliver(signum: int, handler: signals.Handler) -> signals.Handler:
        old = real(signum, handler)
        if handler is signals.hurry and not sent:
            sent.append(signum)
            os.kill(os.getpid(), sig.SIGTERM)  # delivered before the next statement
        return old

    monkeypatch.setattr(signals.signal, "signal", signal_then_deliver)
    child = _Child()
    try:
        signals.stop_children(child, None, late_signal=False)
    finally:
        monkeypatch.undo()
        signals.restore_handlers(previous)
    assert sent and child.stops == [True]  # killed, not stopped gracefully, no raise
