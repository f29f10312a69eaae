"""Catching up with the network (gaslocd/protocol/policy.py), without processes."""

from __future__ import annotations

from gaslocd.protocol.policy import catch_up_round
from tests.protocol.records import record as _rec


def test_catch_up_follows_the_others_only_when_clearly_behind() -> None:
    me = _rec("me", 10)
    # Jitter of one round is normal: no jump.
    assert catch_up_round(10, [me, _rec("a", 11), _rec("b", 11)], "me", 2) == 10
    # Two rounds behind everyone: jump to where they are.
    assert catch_up_round(10, [me, _rec("a", 14), _rec("b", 14)], "me", 2) == 14
    # Alone, or others behind us: stay.
    assert catch_up_round(10, [me], "me", 2) == 10
    assert catch_up_round(10, [me, _rec("a", 3)], "me", 2) == 10


def test_one_peer_publishing_a_huge_round_drags_no_one_along() -> None:
    records = [_rec("me", 10), _rec("a", 10), _rec("b", 11), _rec("liar", 10**12)]
    assert catch_up_round(10, records, "me", 2) == 10
    # ... but when half the others are ahead, that is where the network is.
    records = [_rec("me", 10), _rec("a", 20), _rec("b", 10), _rec("liar", 10**12)]
    assert catch_up_round(10, records, "me", 2) == 20


def test_a_newcomer_not_yet_active_is_not_followed() -> None:
    # A record announcing itself for a later round (active_from > its round) is ignored.
    records = [_rec("me", 10), _rec("new", 30, active_from=40)]
    assert catch_up_round(10, records, "me", 2) == 10
