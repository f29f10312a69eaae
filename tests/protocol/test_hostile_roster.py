"""The protocol's defences against an insider's roster records and states (issue 14),
on a fake clock: catch-up bounded by time, pacing that stale records cannot hold, state
sources from the middle of the roster, and the checks on a fetched state."""

from __future__ import annotations

import math

from gaslocd.protocol.policy import (
    JUMP_SLACK_ROUNDS,
    MAX_MOMENTUM_RATIO,
    STATE_ROUND_LEAD,
    STATE_ROUND_SLACK,
    RoundPolicy,
    resync_sources,
    state_refusal,
    states_agree,
)
from gaslocd.protocol.records import PeerRecord
from tests.protocol.records import record as _rec


def _policy(**kw: float) -> RoundPolicy:
    return RoundPolicy("me", record_ttl_s=15.0, h_upper=40, **kw)


def _look(policy: RoundPolicy, now: float, t: int, records: list[PeerRecord]) -> int:
    """What the driver does at a round's start: observe the roster, then catch up."""
    policy.observe_roster(now, records)
    return policy.catch_up(t, records)


# -- catch-up can only go as fast as time allows ------------------------------------------


def test_a_majority_of_forged_huge_rounds_drags_no_running_peer() -> None:
    policy = _policy(min_round_s=1.0)
    honest = [_rec("me", 10), _rec("a", 10)]
    assert _look(policy, 100.0, 10, honest) == 10
    forged = [*honest, _rec("x", 2**61), _rec("y", 2**61), _rec("z", 2**61)]
    # One second later at most 1 + slack rounds can have passed: the forged records are
    # ignored for catch-up (the median of what is credible is the honest round).
    assert _look(policy, 101.0, 10, forged) == 10
    # Honest peers truly ahead within what time allows are still followed.
    ahead = [*forged, _rec("a", 15), _rec("b", 15), _rec("c", 15)]
    assert _look(policy, 110.0, 10, ahead) == 15


def test_after_a_long_absence_a_far_ahead_run_is_followed() -> None:
    policy = _policy(min_round_s=1.0)
    assert _look(policy, 0.0, 5, [_rec("me", 5), _rec("a", 5)]) == 5
    # Cut off for 1000 s (nobody else in the roster): the anchor does not move ...
    assert _look(policy, 500.0, 6, [_rec("me", 6)]) == 6
    # ... so 1000 s later a run 900 rounds on is plausible, and followed.
    assert _look(policy, 1000.0, 7, [_rec("me", 7), _rec("a", 905), _rec("b", 905)]) == 905


def test_the_bound_is_exactly_elapsed_over_the_minimum_round_time_plus_slack() -> None:
    policy = _policy(min_round_s=0.5)
    _look(policy, 0.0, 10, [_rec("me", 10), _rec("a", 10)])
    policy.observe_roster(5.0, [])
    assert policy.plausible_round() == 10 + JUMP_SLACK_ROUNDS + 10
    at_limit = 10 + JUMP_SLACK_ROUNDS + 10
    assert _look(policy, 5.0, 10, [_rec("me", 10), _rec("a", at_limit)]) == at_limit


def test_a_newcomer_has_no_anchor_and_uses_the_median() -> None:
    policy = _policy()
    assert policy.plausible_round() == math.inf
    records = [_rec("me", 0), _rec("a", 50), _rec("b", 50), _rec("liar", 2**61)]
    assert _look(policy, 0.0, 0, records) == 50


# -- pacing ignores peers that do not move ------------------------------------------------


def test_a_record_stuck_at_round_zero_stops_holding_others_back() -> None:
    policy = _policy(stale_after_s=120.0)
    stuck = _rec("stuck", 0)
    policy.observe_roster(0.0, [_rec("me", 5), _rec("q", 5), stuck])
    assert policy.behind(5, [stuck, _rec("q", 5)]) == [stuck]  # waited for at first
    policy.observe_roster(119.0, [_rec("me", 9), _rec("q", 9), stuck])
    assert policy.behind(9, [stuck, _rec("q", 9)]) == [stuck]
    policy.observe_roster(120.0, [_rec("me", 9), _rec("q", 9), stuck])
    # unchanged for stale_after_s while q's round moves: ignored
    assert policy.behind(9, [stuck, _rec("q", 9)]) == []


def test_when_every_other_record_is_stale_we_are_the_one_cut_off_and_keep_pace() -> None:
    # A partition shows a cut-off peer the others' last records: racing ahead of them
    # would leave its rounds apart from theirs after the heal.
    policy = _policy(stale_after_s=10.0)
    last = [_rec("a", 4), _rec("b", 4)]
    policy.observe_roster(0.0, [_rec("me", 4), *last])
    policy.observe_roster(60.0, [_rec("me", 7), *last])
    assert policy.behind(7, last) == last


def test_a_slow_peer_that_moves_is_still_waited_for() -> None:
    policy = _policy(stale_after_s=120.0)
    for k in range(10):
        slow = _rec("slow", k)
        policy.observe_roster(100.0 * k, [slow])  # one round every 100 s
        assert policy.behind(k + 3, [slow]) == [slow]


def test_a_stale_peer_that_moves_again_is_waited_for_again() -> None:
    policy = _policy(stale_after_s=10.0)
    policy.observe_roster(0.0, [_rec("p", 1), _rec("q", 4)])
    policy.observe_roster(20.0, [_rec("p", 1), _rec("q", 5)])
    assert policy.behind(5, [_rec("p", 1), _rec("q", 5)]) == []
    policy.observe_roster(21.0, [_rec("p", 2), _rec("q", 5)])
    assert policy.behind(5, [_rec("p", 2), _rec("q", 5)]) == [_rec("p", 2)]


# -- state sources and fetched states ------------------------------------------------------


def test_state_sources_start_at_the_median_not_the_highest_claim() -> None:
    records = [_rec("me", 9), _rec("a", 10), _rec("b", 11), _rec("c", 10), _rec("liar", 2**61)]
    order = [r.peer_id for r in resync_sources(records, "me")]
    assert order[:2] == ["a", "c"] and order[-1] == "liar"
    assert resync_sources([_rec("me", 1)], "me") == []


def test_a_state_out_of_range_is_refused() -> None:
    source = _rec("a", 100)
    assert state_refusal(source, 100, theta_norm=10.0, momentum_norm=1.0) is None
    assert state_refusal(source, 100 + STATE_ROUND_SLACK, 10.0, 1.0) is None
    # the live round runs ahead of a record refreshed once a heartbeat
    assert state_refusal(source, 100 + STATE_ROUND_LEAD, 10.0, 1.0) is None
    assert "round" in str(state_refusal(source, 101 + STATE_ROUND_LEAD, 10.0, 1.0))
    assert "round" in str(state_refusal(source, 2**60, 10.0, 1.0))
    assert "round" in str(state_refusal(source, 100 - STATE_ROUND_SLACK - 1, 10.0, 1.0))
    assert "momentum" in str(state_refusal(source, 100, 10.0, 10.0 * MAX_MOMENTUM_RATIO + 1))
    assert "non-finite" in str(state_refusal(source, 100, math.inf, 1.0))


def test_two_states_agree_when_an_exchange_between_them_would_pass() -> None:
    assert states_agree(theta_distance=0.5, other_norm=10.0, norm_bound=1.0)
    assert not states_agree(theta_distance=10.5, other_norm=10.0, norm_bound=1.0)
