"""The simulator's round is the daemon's: the protocol's rules on the simulated clock.

These drive :class:`Schedule` without models (it never needs one), so each rule is
checked in milliseconds: pairings from (run id, round), plans that agree, H from measured
estimates, filling the wait, exchange deadlines, solo rounds lasting T, resync.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from gaslocd.algorithm.topology import plan_round
from gaslocd.config import AlgoConfig, SimConfig, Straggler
from gaslocd.protocol.plan import FIRST_DEADLINE_S, plan_this_round
from gaslocd.protocol.policy import RESYNC_AFTER_FAILED_ROUNDS
from gaslocd.sim import schedule as schedule_module
from gaslocd.sim.schedule import ExchangeOk, RoundState, Schedule, worker_roster

MB = 1_000_000


def _schedule(
    workers: int,
    topology: str = "2peer",
    *,
    adapt_h: bool = True,
    step_times: Sequence[float] | None = None,
    stragglers: tuple[Straggler, ...] = (),
    h_max: int | None = None,
    run_id: str = "run-a",
    unreachable: int = 0,
) -> Schedule:
    # 20 MB at 100 Mbit/s: 1.6 s per exchange on a normal link; 10 × 0.5 s of compute.
    sim = SimConfig(
        workers=workers,
        rounds=1,
        bandwidth_mbps=100,
        latency_ms=5,
        step_time_s=0.5,
        stragglers=stragglers,
        message_bytes=20 * MB,
        unreachable=unreachable,
    )
    algo = AlgoConfig(topology=topology, inner_steps=10, adapt_h=adapt_h, h_max=h_max)
    times = step_times if step_times is not None else [0.5] * workers
    return Schedule(algo, sim, run_id, 20 * MB, times, "fingerprint")


def _round(schedule: Schedule, t: int, exchange_ok: ExchangeOk | None = None) -> RoundState:
    state = schedule.begin(t)
    schedule.exchange(state, exchange_ok or (lambda _r, _a, _b: True))
    schedule.settle(state)
    return state


def _doubly_stochastic(state: RoundState) -> torch.Tensor:
    w = torch.tensor(state.mixing_matrix(), dtype=torch.float64)
    ones = torch.ones(len(w), dtype=torch.float64)
    assert torch.allclose(w.sum(dim=1), ones) and torch.allclose(w.sum(dim=0), ones)
    assert torch.allclose(w, w.T)
    return w


@pytest.mark.parametrize("topology", ["1peer", "2peer", "exp"])
def test_the_pairing_is_plan_round_on_the_run_id_and_round(topology: str) -> None:
    schedule = _schedule(6, topology)
    roster = worker_roster(6)
    for t in range(5):
        state = _round(schedule, t)
        assert state.planned_edges() == plan_round(topology, roster, t, "run-a").edges()
        assert all(s.plan == state.setups[0].plan for s in state.setups)
    other = _round(_schedule(6, topology, run_id="run-b"), 0)
    if topology != "exp":  # exp is deterministic; random graphs depend on the run id
        assert other.planned_edges() == plan_round(topology, roster, 0, "run-b").edges()


@pytest.mark.parametrize("topology", ["1peer", "2peer"])
def test_workers_behind_nat_are_paired_as_daemons_pair_them(topology: str) -> None:
    """``--unreachable 4`` of 6: the simulator's plans are the daemon's plan_round with
    those workers unreachable (never two of them together), and W stays doubly stochastic."""
    schedule = _schedule(6, topology, unreachable=4)
    roster = worker_roster(6)
    shut = set(roster[:4])
    for t in range(6):
        state = _round(schedule, t)
        assert state.planned_edges() == plan_round(topology, roster, t, "run-a", shut).edges()
        assert not [e for e in state.planned_edges() if set(e) <= shut]
        _doubly_stochastic(state)


def test_peers_that_plan_different_pairings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def skewed(algo, run_id, me, *args, **kw):  # type: ignore[no-untyped-def]
        return plan_this_round(algo, run_id + ("-x" if me == "w001" else ""), me, *args, **kw)

    monkeypatch.setattr(schedule_module, "plan_this_round", skewed)
    with pytest.raises(RuntimeError, match="different pairings"):
        _schedule(6, "1peer").begin(0)


def test_h_starts_at_h_base_then_comes_from_measured_estimates() -> None:
    schedule = _schedule(4, "1peer", stragglers=(Straggler(0, 0.2),))
    first = _round(schedule, 0)
    assert first.planned == [10] * 4
    assert {s.deadline_s for s in first.setups} == {FIRST_DEADLINE_S}
    assert all(r.step_time_s == 0.5 and r.bandwidth_bytes_per_s > 0 for r in schedule.records)
    assert all(r.round == 1 for r in schedule.records)
    second = _round(schedule, 1)
    setup = second.setups[0]
    assert setup.target_round_s is not None and setup.target_round_s > 5.0
    assert setup.deadline_s == pytest.approx(
        max(10.0, 2 * setup.target_round_s + 2 * (setup.target_round_s - 5.0))
    )
    straggler_pair = {0, *(schedule.index[p] for p in setup.partners)}
    assert all(second.planned[k] < 10 for k in straggler_pair)  # 8 s transfer > T − H·s


def test_a_fast_peer_waiting_for_a_slow_one_fills_the_wait_with_steps() -> None:
    idle = {}
    for adapt_h in (True, False):
        schedule = _schedule(2, "1peer", adapt_h=adapt_h, step_times=[0.1, 0.5], h_max=100)
        state = _round(schedule, 0)
        # ready at 1.0 and 5.0; the slow one's notice reaches the fast one at 5.005
        assert state.filled == ([41, 0] if adapt_h else [0, 0])
        clock = schedule.clock
        assert clock.seconds("train")[0] == pytest.approx(0.1 * 10)
        assert clock.seconds("fill")[0] == pytest.approx(0.1 * state.filled[0])
        idle[adapt_h] = clock.seconds("wait_ready")[0]
    assert idle[False] == pytest.approx(4.0)  # waited for its partner doing nothing
    assert idle[True] == pytest.approx(0.0)  # it trained instead (and the other one waits 0.1 s)


def test_an_exchange_past_its_deadline_fails_and_w_stays_doubly_stochastic() -> None:
    # worker 0's link: 20 MB at 0.1 Mbit/s per partner takes hours, far past 60 s
    schedule = _schedule(4, "2peer", stragglers=(Straggler(0, 0.001),))
    state = _round(schedule, 0)
    assert state.failures == {"deadline": 2}
    assert state.rows[0] == {"w000": 1.0}
    _doubly_stochastic(state)
    for q in state.setups[0].partners:  # its partners keep the lost weight themselves
        k = schedule.index[q]
        assert state.rows[k][q] == pytest.approx(2 / 3)
        # the failed exchange was waited for until its deadline
        assert schedule.clock.seconds("wait_ready")[k] == pytest.approx(FIRST_DEADLINE_S, rel=0.1)
    # A failed transfer took at least its deadline: the link is at best that fast (as the
    # daemon records it), so the next round's codec is not chosen from nothing.
    links = schedule.peers[0].links
    assert links.transfer_s == pytest.approx(
        {q: FIRST_DEADLINE_S for q in state.setups[0].partners}
    )
    assert max(links.bandwidth.values()) == pytest.approx(20 * MB / FIRST_DEADLINE_S)


def test_a_partnerless_round_lasts_the_target_round_time() -> None:
    schedule = _schedule(3, "1peer", adapt_h=False)
    _round(schedule, 0)  # no T before anything is measured: no pause
    assert schedule.clock.seconds("roster") == [0.0] * 3
    for t in range(1, 4):
        before, waited = list(schedule.clock.now_s), schedule.clock.seconds("wait_ready")
        state = _round(schedule, t)
        (solo,) = [k for k, s in enumerate(state.setups) if not s.partners]
        target = state.setups[solo].target_round_s
        assert target is not None
        assert schedule.clock.now_s[solo] - before[solo] == pytest.approx(target)
        # the pause is the protocol's (roster), not waiting for a partner
        assert schedule.clock.seconds("wait_ready")[solo] == waited[solo]
    assert sum(schedule.clock.seconds("roster")) > 0


def test_a_peer_whose_exchanges_all_fail_resyncs_after_three_rounds() -> None:
    schedule = _schedule(4, "2peer")
    for t in range(RESYNC_AFTER_FAILED_ROUNDS):
        state = _round(schedule, t, lambda _r, a, b: "w000" not in (a, b))
        assert state.failures == {"fault": 2}
        expected = [(0, 1)] if t == RESYNC_AFTER_FAILED_ROUNDS - 1 else []
        assert state.resyncs == expected  # from the most advanced other peer (ties: roster order)
    assert _round(schedule, RESYNC_AFTER_FAILED_ROUNDS).resyncs == []


def test_diloco_is_a_barrier_all_reduce_with_w_equal_to_j_over_n() -> None:
    sim = SimConfig(workers=4, rounds=1, step_time_s=0.5, message_bytes=20 * MB)
    algo = AlgoConfig(algo="diloco", topology="complete", inner_steps=10, adapt_h=True)
    schedule = Schedule(algo, sim, "r", 20 * MB, [0.5, 0.5, 0.5, 1.0], "fp")
    state = _round(schedule, 0)
    assert state.group == (0, 1, 2, 3) and state.filled == [0] * 4  # DiLoCo never fills
    assert _doubly_stochastic(state).tolist() == [[0.25] * 4] * 4
    assert len(set(schedule.clock.now_s)) == 1  # everyone ends together
    assert schedule.clock.seconds("wait_ready")[0] == pytest.approx(5.0)  # for the slow worker


def test_a_peer_two_rounds_ahead_paces_for_the_one_behind() -> None:
    even = _schedule(4, "1peer", adapt_h=False, step_times=[0.1] * 4)
    for t in range(6):
        _round(even, t)
    assert even.clock.seconds("roster") == [0.0] * 4
    slow = _schedule(4, "1peer", adapt_h=False, step_times=[0.1, 0.1, 0.1, 5.0])
    arrived = []  # per round: when each peer ended the round before
    for t in range(6):
        state = _round(slow, t)
        arrived.append(state.arrived_s)
        if t >= 2:  # nobody starts round t before everyone ended round t−2
            assert min(state.start_s) >= max(arrived[t - 1]) - 1e-9
    assert sum(slow.clock.seconds("roster")) > 0 and slow.pace_timeouts == 0
    hopeless = _schedule(4, "1peer", adapt_h=False, step_times=[0.1, 0.1, 0.1, 20.0])
    for t in range(6):
        _round(hopeless, t)
    assert hopeless.pace_timeouts > 0  # a 200 s round: pacing gives up after 60 s
