"""The simulated clock's arithmetic: links, the fill rule, exchange deadlines, accounting."""

from __future__ import annotations

import pytest

from gaslocd.protocol.policy import FillWait
from gaslocd.sim.clock import (
    DEADLINE,
    FAULT,
    OK,
    NetworkModel,
    SimClock,
    fill_steps,
    split_exchange_phase,
    time_edge,
)

MB = 1_000_000


def _net(n: int, slow: dict[int, float] | None = None, message: int = 100 * MB) -> NetworkModel:
    bw = [125 * MB * (slow or {}).get(k, 1.0) for k in range(n)]  # 1 Gbit/s links
    return NetworkModel(tuple(bw), latency_s=0.0, message_bytes=message)


def test_link_arithmetic() -> None:
    net = _net(4, slow={0: 0.1})
    assert net.edge_transfer_s(2, 3, 1, 1) == pytest.approx(0.8)  # 100 MB at 125 MB/s
    assert net.edge_transfer_s(0, 1, 1, 1) == pytest.approx(8.0)  # the slower side sets it
    assert net.edge_transfer_s(2, 3, 2, 2) == pytest.approx(1.6)  # two partners share a link
    assert net.own_transfer_s(1, 1) == pytest.approx(0.8)
    # ring all-reduce: 2(n−1)/n of the message at the slowest member's link
    assert net.allreduce_s([1, 2, 3]) == pytest.approx(2 * 2 / 3 * 100 / 125)
    assert net.allreduce_s() == pytest.approx(1.5 * 100 / 12.5)
    assert net.state_fetch_s(2, 3) == pytest.approx(1.6)


def test_fill_stops_when_every_partner_said_ready() -> None:
    fill = FillWait(room=100, until=1e9)
    # ready at 1.0, 0.1 s steps, the partner's notice arrives at 2.05: steps at 1.0..2.0
    assert fill_steps(fill, 1.0, 0.1, [2.05]) == 11
    assert fill_steps(fill, 1.0, 0.1, [0.5]) == 0  # the partner was ready first
    assert fill_steps(fill, 1.0, 0.1, [0.5, 1.25]) == 3  # waits for the last partner
    assert fill_steps(None, 1.0, 0.1, [5.0]) == 0  # no fill: nothing to wait for


def test_fill_is_bounded_by_its_room_and_its_deadline() -> None:
    assert fill_steps(FillWait(room=4, until=1e9), 0.0, 0.1, [10.0]) == 4
    assert fill_steps(FillWait(room=100, until=0.55), 0.0, 0.1, [10.0]) == 6


def test_an_exchange_starts_when_both_sides_opened() -> None:
    edge = time_edge(0, 1, (1.0, 3.0), (10.0, 10.0), 2.0)
    assert edge.outcome == OK and edge.moved
    assert (edge.start_s, edge.end_a_s, edge.end_b_s) == (3.0, 5.0, 5.0)


def test_an_exchange_past_the_earlier_sides_deadline_fails_for_both() -> None:
    # a opened at 1 with a 10 s deadline: gives up at 11; b opened at 3; 9 s transfer ends at 12
    edge = time_edge(0, 1, (1.0, 3.0), (10.0, 10.0), 9.0)
    assert edge.outcome == DEADLINE and not edge.moved
    assert (edge.end_a_s, edge.end_b_s) == (11.0, 11.0)
    late = time_edge(0, 1, (1.0, 20.0), (10.0, 10.0), 1.0)  # b opens after a gave up
    assert late.outcome == DEADLINE and (late.end_a_s, late.end_b_s) == (11.0, 20.0)
    broken = time_edge(0, 1, (1.0, 3.0), (10.0, 10.0), 2.0, broken=True)
    assert broken.outcome == FAULT and (broken.end_a_s, broken.end_b_s) == (3.0, 3.0)


def test_the_clock_keeps_the_daemons_time_account_per_worker() -> None:
    clock = SimClock(2)
    # worker 0: 3 s planned steps + 1 s filling, a 5 s exchange phase: 2 s waiting for
    # its partner, 1 s its own bytes, 2 s at the partner's slower link
    clock.finish_round(0, {"train": 3.0, "fill": 1.0, **split_exchange_phase(5.0, 2.0, 1.0)})
    # worker 1 sat out: 2 s of steps, then paused 3 s to make the round last T
    clock.finish_round(1, {"train": 2.0, "roster": 3.0})
    assert clock.now_s == [9.0, 5.0]
    assert clock.seconds("wait_ready") == [2.0, 0.0]
    assert clock.seconds("transfer") == [1.0, 0.0]
    assert clock.seconds("slow_link") == [2.0, 0.0]
    assert clock.seconds("roster") == [0.0, 3.0]
    assert clock.idle_s == [5.0, 3.0]  # every second not training, as the daemon counts
    assert clock.compute_fraction_per_worker() == pytest.approx([4 / 9, 2 / 5])
    assert clock.idle_fraction() == pytest.approx(8 / 14)
    assert clock.pace_fraction() == pytest.approx(3 / 14)
    assert clock.total().total() == pytest.approx(sum(clock.now_s))  # categories add up
    assert clock.wall_clock_s == 9.0
    with pytest.raises(ValueError, match="negative"):
        clock.finish_round(0, {"train": -1.0})
    with pytest.raises(ValueError, match="unknown activity"):
        clock.finish_round(0, {"idle": 1.0})


def test_an_exchange_phase_is_split_as_the_daemon_books_it() -> None:
    assert split_exchange_phase(5.0, 2.0, 1.0) == {
        "wait_ready": 2.0,
        "transfer": 1.0,
        "slow_link": 2.0,
    }
    # a failed exchange waited the whole phase; own traffic cannot exceed what is left
    assert split_exchange_phase(4.0, 6.0, 1.0) == {
        "wait_ready": 4.0,
        "transfer": 0.0,
        "slow_link": 0.0,
    }
