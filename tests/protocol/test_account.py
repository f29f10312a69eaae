"""The time account: categories that always add up to the wall-clock."""

from __future__ import annotations

import pytest

from gaslocd.protocol.account import ACTIVITIES, TimeAccount, split_exchange


def test_close_books_the_unexplained_rest_as_other_and_sums_to_the_wall_clock() -> None:
    acct = TimeAccount()
    acct.add("train", 6.0)
    acct.add("fill", 1.0)
    acct.add_all({"wait_ready": 0.5, "transfer": 1.0})
    acct.close(10.0)
    assert acct.total() == pytest.approx(10.0)
    assert acct.seconds["other"] == pytest.approx(1.5)
    assert acct.training_share() == pytest.approx(0.7)
    assert acct.idle_s() == pytest.approx(3.0)


def test_overlapping_measurements_never_make_a_category_negative() -> None:
    acct = TimeAccount()
    acct.add("train", 5.0)
    acct.add("other", 0.2)
    acct.close(5.1)  # clock reads overlapped by 0.1 s
    assert all(v >= 0 for v in acct.seconds.values())
    assert acct.seconds["other"] == pytest.approx(0.1)


def test_unknown_activities_are_refused_so_the_label_set_stays_bounded() -> None:
    with pytest.raises(ValueError, match="unknown activity"):
        TimeAccount().add("coffee", 1.0)
    assert len(ACTIVITIES) == len(set(ACTIVITIES)) == len(TimeAccount().seconds)


def test_an_exchange_at_a_partners_slower_link_is_waiting_not_own_transfer() -> None:
    # 100 MB received in 10 s, where our own link has carried 50 MB/s: 2 s were ours.
    parts = split_exchange(wait_s=1.0, receive_s=10.0, nbytes=100_000_000, own_rate=50e6)
    assert parts == pytest.approx({"wait_ready": 1.0, "transfer": 2.0, "slow_link": 8.0})
    # At our own speed, all of it is own transfer; before any measurement too.
    assert split_exchange(0.0, 2.0, 100_000_000, 50e6)["slow_link"] == pytest.approx(0.0)
    assert split_exchange(0.0, 2.0, 100_000_000, 0.0) == {
        "wait_ready": 0.0,
        "transfer": 2.0,
        "slow_link": 0.0,
    }


def test_merging_rounds_keeps_the_sum() -> None:
    total = TimeAccount()
    for wall in (1.0, 2.5, 0.5):
        acct = TimeAccount()
        acct.add("train", wall / 2)
        acct.close(wall)
        total.merge(acct)
    assert total.total() == pytest.approx(4.0)
    assert total.training_share() == pytest.approx(0.5)
