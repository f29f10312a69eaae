"""The round's rules driven by a fake clock: the daemon and the simulator call these same
methods, so what is proven here holds for both drivers (docs/design.md §2)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gaslocd.algorithm.topology import plan_round
from gaslocd.config import AlgoConfig
from gaslocd.protocol.plan import (
    FIRST_DEADLINE_S,
    MIN_DEADLINE_S,
    LinkEstimates,
    RoundSetup,
    plan_this_round,
)
from gaslocd.protocol.policy import (
    MAX_LEAD_ROUNDS,
    RESYNC_AFTER_FAILED_ROUNDS,
    RoundPolicy,
    counted_exchanges,
    mendable_drops,
    mixing_row,
    resync_sources,
)
from gaslocd.protocol.records import PeerRecord
from tests.protocol.records import record as _rec


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


ALGO = AlgoConfig(algo="gasloc", topology="1peer", inner_steps=10, adapt_h=True)
IDS = ("a", "b", "c", "d")


def _setup(me: str = "a", records: list[PeerRecord] | None = None, **kw: object) -> RoundSetup:
    links = LinkEstimates()
    links.record_step_time(0.1)
    return plan_this_round(
        ALGO,
        "run",
        me,
        0,
        records if records is not None else [_rec(p) for p in IDS],
        links,
        100_000,
        None,
        **kw,  # type: ignore[arg-type]
    )


def test_every_peer_plans_the_same_pairing_from_run_id_and_round() -> None:
    records = [_rec(p) for p in IDS]
    expected = plan_round("1peer", list(IDS), 0, "run")
    for me in IDS:
        setup = _setup(me, records)
        assert setup.plan == expected
        assert set(setup.partners) == set(expected.partners_of(me))


def test_before_any_measurement_the_deadline_is_the_first_one_and_h_is_h_base() -> None:
    links = LinkEstimates()
    records = [_rec(p, step=0.0, bandwidth=0.0) for p in IDS]
    setup = plan_this_round(ALGO, "run", "a", 0, records, links, 100_000, None)
    assert setup.inner_steps == ALGO.inner_steps
    assert setup.deadline_s == FIRST_DEADLINE_S
    assert setup.target_round_s is None


def test_a_slow_link_to_this_rounds_partner_shortens_h() -> None:
    records = [_rec(p) for p in IDS]
    fast = _setup("a", records)
    partner = next(iter(fast.partners))
    links = LinkEstimates()
    links.record_step_time(0.1)
    links.record_transfer(partner, 0.8, 100_000)  # 8 steps' worth of waiting
    slow = plan_this_round(ALGO, "run", "a", 0, records, links, 100_000, None)
    assert slow.inner_steps < fast.inner_steps
    assert slow.deadline_s >= MIN_DEADLINE_S


def test_filling_the_wait_stops_when_partners_are_ready_or_at_the_deadline() -> None:
    clock = FakeClock()
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    setup = _setup()
    fill = policy.fill_wait(setup, steps_done=10, now=clock.now)
    assert fill is not None and fill.room == 30
    assert not fill.done(clock.advance(0.1), partners_ready=False)
    assert fill.done(clock.now, partners_ready=True)
    assert fill.done(clock.advance(setup.deadline_s), partners_ready=False)


def test_no_fill_without_partners_or_without_room() -> None:
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=10)
    assert policy.fill_wait(_setup(), steps_done=10, now=0.0) is None  # H_max reached
    alone = _setup("a", [_rec("a")])
    assert not alone.partners
    assert RoundPolicy("a", 15.0, 40).fill_wait(alone, steps_done=1, now=0.0) is None


def test_a_solo_round_lasts_t_only_while_others_were_seen_recently() -> None:
    clock = FakeClock()
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    alone = _setup("a", [_rec("a")])
    target = alone.target_round_s
    assert target is not None and not alone.partners
    assert policy.solo_wait_s(alone, elapsed_s=0.2, now=clock.now) == 0.0  # nobody seen
    policy.observe_roster(clock.now, [_rec("a"), _rec("b")])
    assert policy.solo_wait_s(alone, 0.2, clock.advance(1.0)) == pytest.approx(target - 0.2)
    assert policy.solo_wait_s(alone, target + 1, clock.now) == 0.0  # already took T
    assert policy.solo_wait_s(alone, 0.2, clock.advance(15.0)) == 0.0  # others gone
    assert policy.solo_wait_s(_setup(), 0.2, clock.now) == 0.0  # has partners


def test_pacing_waits_only_for_active_peers_more_than_the_lead_behind() -> None:
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    t = 10
    records = [_rec("a", t), _rec("b", t - MAX_LEAD_ROUNDS), _rec("c", t + 3)]
    assert policy.behind(t, records) == []
    late = _rec("d", t - MAX_LEAD_ROUNDS - 1)
    assert policy.behind(t, [*records, late]) == [late]
    newcomer = _rec("e", 2, active_from=12)  # announced, not yet active
    assert policy.behind(t, [*records, newcomer]) == []
    clock = FakeClock()
    assert policy.pace_until(clock.now, None) == clock.now + FIRST_DEADLINE_S
    assert policy.pace_until(clock.now, 7.0) == clock.now + 7.0


def test_resync_after_consecutive_failed_rounds_with_partners() -> None:
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    setup, alone = _setup(), _setup("a", [_rec("a")])
    decisions = [
        policy.should_resync(setup, exchanged=0) for _ in range(RESYNC_AFTER_FAILED_ROUNDS)
    ]
    assert decisions == [False] * (RESYNC_AFTER_FAILED_ROUNDS - 1) + [True]
    # A round that exchanged, or one without partners, resets the count.
    policy.should_resync(setup, 0)
    policy.should_resync(setup, 1)
    policy.should_resync(alone, 0)
    assert not any(policy.should_resync(setup, 0) for _ in range(RESYNC_AFTER_FAILED_ROUNDS - 1))


def test_rounds_whose_partners_are_all_long_never_count_as_failed() -> None:
    """A slow link's long exchanges land rounds later: those rounds are not failures (a
    resync would fetch the state over that same slow link)."""
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    setup = _setup()
    partner = next(iter(setup.partners))
    long_only = replace(setup, long={partner: 3})
    assert not any(
        policy.should_resync(long_only, 0) for _ in range(3 * RESYNC_AFTER_FAILED_ROUNDS)
    )
    # Nor do they hide real failures: regular rounds still count, across long ones.
    policy.should_resync(setup, 0)
    policy.should_resync(long_only, 0)
    policy.should_resync(setup, 0)
    assert policy.should_resync(setup, 0)
    # A long exchange that ended dropped (refused: drifted too far) is a failed round,
    # in a round of long partners or in one without any (sitting out).
    alone = _setup("a", [_rec("a")])
    assert [
        policy.should_resync(long_only, 0, long_failed=1),
        policy.should_resync(alone, 0, long_failed=1),
        policy.should_resync(long_only, 0, long_failed=1),
    ] == [False] * (RESYNC_AFTER_FAILED_ROUNDS - 1) + [True]


def test_long_exchanges_that_only_ran_out_of_time_never_resync_a_slow_link() -> None:
    """A slow link under load drops long exchanges at their deadline: a resync would
    fetch two full states over that link (minutes at 1 Mbit/s, training stopped), and
    mend nothing. Refusals still count, so a drifted peer comes back."""
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    alone = _setup("a", [_rec("a")])  # sitting out: its only exchanges are long
    late = ["deadline", "refused:timeout", "refused:future-round", "cancelled"]
    assert mendable_drops(late) == 0
    assert not any(
        policy.should_resync(alone, 0, long_failed=mendable_drops(["deadline"]))
        for _ in range(3 * RESYNC_AFTER_FAILED_ROUNDS)
    )
    refused = mendable_drops(["refused:norm-bound", "deadline"])
    assert refused == 1 and mendable_drops(["refused"]) == 1  # the partner refused ours
    decisions = [
        policy.should_resync(alone, 0, long_failed=refused)
        for _ in range(RESYNC_AFTER_FAILED_ROUNDS)
    ]
    assert decisions == [False] * (RESYNC_AFTER_FAILED_ROUNDS - 1) + [True]


def test_a_partner_that_says_it_sits_the_round_out_is_no_failure() -> None:
    """Our roster predated a slow peer's sit-out: it refused us as sitting out. Only a
    fresher record mends that, not a state fetch; other partners still count."""
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    setup = _setup()
    partner = next(iter(setup.partners))
    assert not any(
        policy.should_resync(setup, 0, excused={partner})
        for _ in range(3 * RESYNC_AFTER_FAILED_ROUNDS)
    )
    assert [policy.should_resync(setup, 0) for _ in range(RESYNC_AFTER_FAILED_ROUNDS)][-1]


def test_resync_asks_typical_peers_first_not_the_most_advanced() -> None:
    # Others b (9), c (7): the median (low) is 7, so c first (docs/design.md §3).
    records = [_rec("a", 5), _rec("b", 9), _rec("c", 7)]
    assert [r.peer_id for r in resync_sources(records, "a")] == ["c", "b"]


def test_resync_asks_a_peer_sitting_out_on_a_slow_link_last() -> None:
    # c is the typical one but sits out until round 12 (its link is too slow for a
    # round): two full states over it would take minutes, so b is asked first.
    records = [_rec("a", 5), _rec("b", 9), replace(_rec("c", 8), free_from=12), _rec("d", 7)]
    assert [r.peer_id for r in resync_sources(records, "a")] == ["b", "d", "c"]
    # Once it rejoins the pairings (free_from reached), it is typical again.
    records[2] = replace(records[2], free_from=8)
    assert [r.peer_id for r in resync_sources(records, "a")] == ["c", "b", "d"]


def test_a_one_sided_exchange_does_not_count_and_w_stays_doubly_stochastic() -> None:
    two = AlgoConfig(algo="gasloc", topology="2peer", inner_steps=10)
    links = LinkEstimates()
    records = [_rec(p) for p in IDS]
    setups = {p: plan_this_round(two, "run", p, 3, records, links, 1, None) for p in IDS}
    plan = setups["a"].plan
    assert plan is not None
    dropped = plan.edges()[0]  # this edge fails one-sidedly: neither side may use it
    rows = {}
    for p in IDS:
        partners = set(setups[p].partners)
        refused = {q for q in partners if {p, q} == set(dropped)}
        counted = counted_exchanges(partners, refused)
        assert counted == partners - refused
        rows[p] = mixing_row(setups[p], p, counted)
    for p in IDS:
        assert math.isclose(sum(rows[p].values()), 1.0)
        column = sum(rows[q].get(p, 0.0) for q in IDS)
        assert math.isclose(column, 1.0), f"column {p} sums to {column}"
        for q in IDS:
            assert rows[p].get(q, 0.0) == rows[q].get(p, 0.0)  # symmetric


def test_peers_behind_nat_are_planned_apart_and_never_asked_for_state() -> None:
    """Records saying ``reachable: false`` reach the plan: no two of them are partners, the
    round's setup names which ends are behind NAT (who dials, whose Ready to ask for),
    and a state is only fetched from reachable peers."""
    shut = set(IDS[:2])  # a and b behind NAT, c and d reachable
    records = [replace(_rec(p), reachable=p not in shut) for p in IDS]
    for t in range(10):
        for me in IDS:
            setup = plan_this_round(ALGO, "run", me, t, records, LinkEstimates(), 100_000, None)
            if me in shut:
                assert not shut & set(setup.partners), (t, me, setup.partners)
                assert setup.dial == set(setup.partners)  # it calls every partner
            assert not shut & setup.dial  # nobody calls a peer behind NAT
            assert setup.unreachable == shut & {me, *setup.partners}
    sources = resync_sources(records, IDS[-1])
    assert sources and not shut & {r.peer_id for r in sources}
    assert resync_sources([records[0], records[-1]], IDS[-1]) == []  # only NATed others


def test_a_record_says_whether_its_peer_can_be_dialled() -> None:
    rec = replace(_rec("a"), reachable=False)
    assert PeerRecord.from_wire(rec.to_wire()) == rec
    old = _rec("a").to_wire()
    del old["reachable"]  # a peer from before the field: reachable
    assert PeerRecord.from_wire(old).reachable is True
    with pytest.raises(ValueError, match="reachable must be a bool"):
        PeerRecord.from_wire({**old, "reachable": 0})
