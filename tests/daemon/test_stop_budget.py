"""The stop budget (daemon/signals.py), driven by a fake clock: how long a stopping
daemon may wait for its round's exchange, and how long its final checkpoint may take."""

from __future__ import annotations

import pytest

from gaslocd.daemon.signals import AFTER_CHECKPOINT_S, MIN_CHECKPOINT_S, StopBudget


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
