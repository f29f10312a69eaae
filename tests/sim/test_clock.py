"""The simulated clock: gossip waits for partners only, all-reduce waits for everyone."""

from __future__ import annotations

import pytest

from gaslocd.algorithm.hpolicy import choose_inner_steps, target_round_time
from gaslocd.sim.clock import NetworkModel, SimClock

MB = 1_000_000


def _net(n: int, slow: dict[int, float] | None = None, message: int = 100 * MB) -> NetworkModel:
    bw = [125 * MB * (slow or {}).get(k, 1.0) for k in range(n)]  # 1 Gbit/s links
    return NetworkModel(tuple(bw), latency_s=0.0, message_bytes=message)


def test_equal_workers_never_idle_in_either_mode() -> None:
    net = _net(4)
    gossip, allreduce = SimClock(4), SimClock(4)
    for _ in range(3):
        gossip.gossip_round([10] * 4, [0.1] * 4, [(0, 1), (2, 3)], net)
        allreduce.allreduce_round([10] * 4, [0.1] * 4, net)
    assert gossip.idle_fraction() == 0.0
    assert allreduce.idle_fraction() == pytest.approx(0.0, abs=1e-12)
    # 1 s compute + 100 MB at 125 MB/s = 1.8 s per gossip round.
    assert gossip.wall_clock_s == pytest.approx(3 * 1.8)
    # ring all-reduce moves 2(n−1)/n of the message: 150 MB → 1.2 s.
    assert allreduce.wall_clock_s == pytest.approx(3 * (1.0 + 1.2))


def test_a_slow_link_stalls_everyone_in_allreduce_but_only_its_partner_in_gossip() -> None:
    net = _net(4, slow={0: 0.1})
    gossip, allreduce = SimClock(4), SimClock(4)
    gossip.gossip_round([10] * 4, [0.1] * 4, [(0, 1), (2, 3)], net)
    allreduce.allreduce_round([10] * 4, [0.1] * 4, net)
    assert gossip.idle_s[2] == gossip.idle_s[3] == 0.0
    assert gossip.idle_s[1] == pytest.approx(8 - 0.8)  # waits on worker 0's 10× slower link
    assert gossip.idle_s[0] == 0.0  # its own slow link is its own traffic, not waiting
    assert min(allreduce.idle_s[1:]) == pytest.approx(12 - 1.2)
    assert allreduce.wall_clock_s > gossip.now_s[2]


def test_late_partner_makes_the_other_wait_and_the_wait_propagates_one_hop() -> None:
    net = _net(4, message=0)
    clock = SimClock(4)
    clock.gossip_round([10, 10, 10, 40], [0.1] * 4, [(0, 1), (2, 3)], net)
    assert clock.idle_s == pytest.approx([0, 0, 3.0, 0])
    clock.gossip_round([10] * 4, [0.1] * 4, [(0, 2), (1, 3)], net)
    # 1 starts at 1.0, ready at 2.0, but 3 (ready at 5.0) holds it: 3 s more idle.
    assert clock.idle_s[1] == pytest.approx(3.0)


def test_adaptive_h_removes_the_straggler_wait() -> None:
    net = _net(2, slow={0: 0.1})
    steps = [0.1, 0.1]
    fixed, adapted = SimClock(2), SimClock(2)
    fixed.gossip_round([30, 30], steps, [(0, 1)], net)
    transfer = net.edge_transfer_s(0, 1, 1, 1)
    target = target_round_time(30, steps, [net.own_transfer_s(1, 1)] * 3 + [transfer])
    h = choose_inner_steps(target, transfer, 0.1, 1, 120)
    adapted.gossip_round([h, h], steps, [(0, 1)], net)
    assert h < 30
    assert adapted.wall_clock_s < fixed.wall_clock_s
