"""A slow peer's sit-out schedule: published once, read alike, changed rounds ahead.

The point of a schedule over a ``free_from`` per cycle is that peers reading an older
record of the slow peer still compute the same rosters: every change must leave the
rounds until the old schedule's next pairing as they were (the new record then has k
rounds to cross the slow link, not one).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import pytest

from gaslocd.config import AlgoConfig
from gaslocd.protocol.linkcodec import codec_ladder
from gaslocd.protocol.plan import LinkEstimates, active_roster, plan_this_round
from gaslocd.protocol.policy import RoundPolicy
from gaslocd.protocol.records import PeerRecord
from gaslocd.protocol.sitout import SitOut
from tests.protocol.records import record

NUMEL = 10_000_000
LADDER = codec_ladder("fp16", ("fp32", "fp16", "bf16", "int8", "q4"))


def test_a_schedule_pairs_every_kth_round_from_free_from() -> None:
    sit = SitOut(free_from=10, every=3)
    assert [t for t in range(6, 20) if sit.takes_part(t)] == [10, 13, 16, 19]
    assert [sit.next_paired(t) for t in (6, 9, 10, 11, 12, 13)] == [10, 10, 13, 13, 13, 16]
    assert sit.hold_after(10) == 3 and sit.hold_after(7) == 3  # sits out 11, 12 / 8, 9
    plain = SitOut(free_from=10)  # every round from 10 on
    assert [t for t in range(8, 13) if plain.takes_part(t)] == [10, 11, 12]
    assert plain.hold_after(10) == 0 and plain.hold_after(8) == 2
    assert SitOut().takes_part(0) and not SitOut().periodic


def test_a_slow_link_sits_out_from_the_next_round_and_then_keeps_its_schedule() -> None:
    sit = SitOut().after(7, 3)
    assert sit == SitOut(10, 3, sit_from=8)
    assert sit.after(10, 3) is sit and sit.after(13, 3) is sit  # published once
    assert sit.after(13, None) is sit  # a round with nothing planned changes nothing
    assert SitOut().after(7, 0) == SitOut() and SitOut().after(7, None) == SitOut()


@pytest.mark.parametrize("old_k", [2, 3, 5])
@pytest.mark.parametrize("need", [0, 2, 3, 4, 8])
def test_every_change_leaves_the_rounds_until_the_next_pairing_as_they_were(
    old_k: int, need: int
) -> None:
    """Another k, or back to every round, decided in a paired round t: a peer that still
    reads the old schedule pairs exactly as one that read the new, up to and including
    the old schedule's next pairing, so the change has k rounds to reach everyone."""
    old = SitOut(20, old_k)
    for t in (20, 20 + old_k, 20 + 2 * old_k):
        new = old.after(t, need)
        horizon = old.next_paired(t)
        assert horizon - t == old_k
        # A late planner of round t or before, back to the old schedule's start: its
        # pairings (t included; before it, the schedule before that is not told).
        back = range(old.free_from, t + 1)
        assert [r for r in back if new.takes_part(r)] == [r for r in back if old.takes_part(r)]
        for r in range(t + 1, horizon + 1):
            assert new.takes_part(r) == old.takes_part(r), (t, r)
        later = range(horizon + 1, horizon + 3 * max(need, 1))
        if need >= 2:
            assert [r for r in later if new.takes_part(r)] == [
                r for r in later if (r - horizon) % need == 0
            ]
        else:
            assert all(new.takes_part(r) for r in later)


def test_a_first_sit_out_leaves_the_rounds_up_to_its_deciding_one_as_they_were() -> None:
    """The first sit-out has no schedule to announce it ahead: decided in round 7, it
    starts at 8. A peer still planning round 7 or earlier when the new record reaches it
    (a slower start: the first peer out of its lobby last) pairs the sitter as the old
    record said, as the sitter itself does; round 8 on, both leave it out until 10.
    Before, the late planner left it out of round 0 while it paired itself (netns)."""
    others = [record(p, 6) for p in ("a", "b", "c")]
    old = record("s", 7)
    sit = SitOut.of(old).after(7, 3)
    new = sit.on(replace(old, round=8))

    def ids(rec: PeerRecord, t: int) -> list[str]:
        return [r.peer_id for r in active_roster([*others, rec], t)]

    for t in range(0, 8):
        assert ids(new, t) == ids(old, t) == ["a", "b", "c", "s"]
    assert [t for t in range(8, 14) if "s" in ids(new, t)] == [10, 13]


def test_peers_with_the_old_and_the_new_record_compute_the_same_rosters() -> None:
    others = [record(p, 30) for p in ("a", "b", "c")]
    old = record("s", 30, free_from=30, sit_every=3)
    sit = SitOut.of(old).after(33, 5)
    new = record("s", 33, free_from=sit.free_from, sit_every=sit.every)
    for t in range(34, 37):  # up to the old schedule's next pairing (36)
        before = [r.peer_id for r in active_roster([*others, old], t)]
        after = [r.peer_id for r in active_roster([*others, new], t)]
        assert before == after
    assert "s" in [r.peer_id for r in active_roster([*others, new], 36)]
    assert "s" not in [r.peer_id for r in active_roster([*others, new], 39)]  # 36 + 5 = 41
    assert "s" in [r.peer_id for r in active_roster([*others, new], 41)]


def test_a_slow_peer_planning_round_after_round_publishes_its_schedule_once() -> None:
    """The slow peer's own plans, round by round, with its rate steady: one schedule,
    and it is in the pairings exactly on its paired rounds."""
    algo = AlgoConfig(topology="1peer", inner_steps=10, adapt_h=True, overlap=True)
    links = LinkEstimates()
    links.record_step_time(0.5)  # T = 5 s; q4 at 0.5 MB/s takes 11.3 s: k = 3
    for partner in ("a", "b"):  # what it measured of its own link: 0.5 MB/s
        links.record_transfer(partner, 2.0, 1_000_000)
    sit, published = SitOut(), []
    for t in range(5, 30):
        me = record("s", t, step=0.5, bandwidth=5e5, free_from=sit.free_from, sit_every=sit.every)
        records = [me, *(record(p, t, step=0.5, bandwidth=1e9) for p in ("a", "b", "c"))]
        setup = plan_this_round(
            algo, "run", "s", t, records, links, 2 * NUMEL, None, ladder=LADDER, numel=NUMEL
        )
        assert bool(setup.partners) == sit.takes_part(t), t
        after = sit.after(t, setup.sit_every)
        if after != sit:
            published.append((t, after))
        sit = after
    assert published == [(5, SitOut(8, 3, sit_from=6))]


def test_k_shrinks_only_when_the_smaller_one_holds_with_margin() -> None:
    """A link whose transfer sits at the border of two k's must not flip between them:
    each flip is a new schedule that every peer must read."""
    from gaslocd.protocol.linkcodec import transfer_s
    from gaslocd.protocol.plan import plan_links

    q4 = transfer_s("q4", NUMEL, 1e6)  # ~5.6 s
    me, partner = record("s", bandwidth=1e6), [record("a", bandwidth=1e9)]
    budget = q4 / 2.9  # needs 3 rounds
    assert plan_links(9, me, partner, None, LADDER, NUMEL, budget, True).sit_every == 3
    border = q4 / 1.9  # needs 2 rounds, but not 2 with the STAY_LONG margin
    assert plan_links(9, me, partner, None, LADDER, NUMEL, border, True, (), 3).sit_every == 3
    clear = q4 / 1.4  # 2 rounds with margin
    assert plan_links(9, me, partner, None, LADDER, NUMEL, clear, True, (), 3).sit_every == 2
    grows = q4 / 3.5  # 4 rounds: grows at once
    assert plan_links(9, me, partner, None, LADDER, NUMEL, grows, True, (), 3).sit_every == 4


def test_a_peer_on_a_schedule_is_paced_on_only_in_the_rounds_it_is_paired_in() -> None:
    """Nobody waits for a peer in a round it sits out; in its paired rounds it is waited
    for, or its round numbers drift from the run's and its pairings fail."""
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    slow = record("s", 6, free_from=10, sit_every=3)
    behind = {}
    for t in range(10, 15):
        records = [record("a", t), record("b", t), slow]
        policy.observe_roster(0.0, records)
        behind[t] = [r.peer_id for r in policy.behind(t, records)]
    assert behind == {10: ["s"], 11: [], 12: [], 13: ["s"], 14: []}


def test_a_record_carries_its_schedule_and_an_old_one_has_none() -> None:
    rec = replace(record("s", 12, free_from=14, sit_every=3), sit_from=11, started_at=time.time())
    assert PeerRecord.from_wire(rec.to_wire()) == rec
    old = rec.to_wire()
    del old["sit_every"], old["sit_from"]  # a peer from before the fields
    assert PeerRecord.from_wire(old).sit_every == 0 and PeerRecord.from_wire(old).sit_from == 0
    with pytest.raises(ValueError, match="sit_every must be an int"):
        PeerRecord.from_wire({**old, "sit_every": -1})
    forged = PeerRecord.from_wire({**old, "sit_every": 2**40})
    with pytest.raises(ValueError, match=r"sit_every \d+ is absurd"):
        forged.check_plausible(time.time())
    rec.check_plausible(time.time())


def test_any_sequence_of_changes_keeps_every_transition_k_rounds_ahead() -> None:
    """Random walks of k (including back to every round and onto a schedule again),
    each decided in a round the peer is paired in: the rounds between a decision and
    the old schedule's next pairing never change."""
    for needs in itertools.product((0, 2, 3, 5), repeat=4):
        sit, t = SitOut(), 4
        for need in needs:
            new = sit.after(t, need)
            if sit.periodic:
                for r in range(t + 1, sit.next_paired(t) + 1):
                    assert new.takes_part(r) == sit.takes_part(r)
            sit, t = new, new.next_paired(t)
            assert sit.takes_part(t)


def test_a_sitter_announces_only_the_rounds_around_its_pairings_and_refreshes_slower() -> None:
    """Every publish crosses the sitter's own saturated link: it announces the round
    before a paired one (peers pace on it there) and the paired one; in between its
    record only has to stay alive (a quarter of its lifetime). Anyone whose round starts
    are published meanwhile needs no heartbeat publish beside them either."""
    everyone = SitOut()
    assert all(everyone.announces(t) for t in range(20))
    assert everyone.refresh_s(7, 1.0, 8.0) == 1.0  # no round published lately
    assert everyone.refresh_s(7, 1.0, 8.0, announced_s_ago=0.5) == 2.0  # rounds carry it
    sitter = SitOut(free_from=10, every=4, sit_from=7)  # paired in 10, 14, 18, …
    announced = [t for t in range(7, 20) if sitter.announces(t)]
    assert announced == [9, 10, 13, 14, 17, 18]
    assert sitter.refresh_s(11, 1.0, 8.0) == 2.0  # sitting out: ttl / 4
    assert sitter.refresh_s(14, 1.0, 8.0) == 1.0  # paired: every heartbeat
    assert sitter.refresh_s(11, 3.0, 8.0) == 3.0  # never more often than a heartbeat
