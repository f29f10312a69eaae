"""A link too slow for a round: a smaller codec, then a long exchange and sitting out.

Both ends of a link decide from the same published records, so they pick the same codec
and agree that an exchange is long; only the peer whose *own* link is too slow sits out,
and every peer leaves it out of the pairings until the round it announced.
"""

from __future__ import annotations

import math

import pytest

from gaslocd.config import AlgoConfig
from gaslocd.protocol.linkcodec import codec_ladder, transfer_s
from gaslocd.protocol.plan import (
    MAX_LONG_ROUNDS,
    STATE_FETCH,
    LinkEstimates,
    plan_links,
    plan_this_round,
)
from gaslocd.protocol.policy import RoundPolicy
from tests.protocol.records import record

NUMEL = 10_000_000  # fp16: 20 MB
LADDER = codec_ladder("fp16", ("fp32", "fp16", "bf16", "int8", "q4"))
IDS = ("a", "b", "c", "d")


def _plan(me: str, records: list, overlap: bool = True, round_: int = 5):  # type: ignore[no-untyped-def]
    algo = AlgoConfig(topology="1peer", inner_steps=10, adapt_h=True, overlap=overlap)
    links = LinkEstimates()
    links.record_step_time(0.5)  # T = 10 × 0.5 s = 5 s
    return plan_this_round(
        algo, "run", me, round_, records, links, 2 * NUMEL, None, ladder=LADDER, numel=NUMEL
    )


def test_a_fast_link_keeps_the_best_codec_and_a_slower_one_steps_down() -> None:
    fast = plan_links(
        5, record("a", bandwidth=1e9), [record("b", bandwidth=1e9)], None, LADDER, NUMEL, 5.0, True
    )
    assert fast.codecs == {"b": "fp16"} and not fast.long and fast.sit_every == 0
    # 20 MB of fp16 at 3 MB/s is 6.7 s > 5 s; int8 (10 MB) takes 3.4 s.
    slower = plan_links(
        5, record("a", bandwidth=1e9), [record("b", bandwidth=3e6)], None, LADDER, NUMEL, 5.0, True
    )
    assert slower.codecs == {"b": "int8"} and not slower.long


def test_a_link_no_codec_can_carry_in_a_round_is_long_and_only_its_slow_end_sits_out() -> None:
    # 0.5 MB/s: q4 (5.6 MB) takes 11.3 s against a 5 s round: 3 rounds.
    slow, fast = record("s", bandwidth=5e5), record("f", bandwidth=1e9)
    k = math.ceil(transfer_s("q4", NUMEL, 5e5) / 5.0)
    on_slow = plan_links(7, slow, [fast], None, LADDER, NUMEL, 5.0, True)
    on_fast = plan_links(7, fast, [slow], None, LADDER, NUMEL, 5.0, True)
    assert on_slow.codecs == {"f": "q4"} and on_fast.codecs == {"s": "q4"}
    assert on_slow.long == {"f": k} and on_fast.long == {"s": k} and k == 3
    assert on_slow.sit_every == k  # its own link is the slow one: paired every k rounds
    assert on_fast.sit_every == 0  # its partner's link was: it stays in the pairings
    # Without overlap nothing runs across rounds: the strongest codec, and no sit-out.
    sequential = plan_links(7, slow, [fast], None, LADDER, NUMEL, 5.0, False)
    assert sequential.codecs == {"f": "q4"} and not sequential.long and sequential.sit_every == 0


def test_an_unmeasured_link_keeps_the_best_codec() -> None:
    links = plan_links(
        0, record("a", bandwidth=0.0), [record("b", bandwidth=0.0)], None, LADDER, NUMEL, 5.0, True
    )
    assert links.codecs == {"b": "fp16"} and not links.long


def test_every_peer_leaves_a_sitting_out_peer_out_of_the_pairings_until_it_is_free() -> None:
    records = [record(p, 5, bandwidth=1e9) for p in IDS[1:]] + [
        record("a", 5, bandwidth=5e5, free_from=8)
    ]
    for me in IDS[1:]:
        setup = _plan(me, records)
        assert setup.plan is not None and "a" not in setup.plan.roster and "a" not in setup.partners
    # The same roster for all: the same pairing of b, c, d.
    assert len({tuple(sorted(_plan(p, records).plan.edges())) for p in IDS[1:]}) == 1  # type: ignore[union-attr]
    alone = _plan("a", records)
    assert alone.plan is None and not alone.partners and alone.mixing_row("a") == {"a": 1.0}
    back = _plan("b", records, round_=8)
    assert back.plan is not None and "a" in back.plan.roster


def test_codec_choice_is_off_without_a_ladder() -> None:
    records = [record(p, 5, bandwidth=5e5) for p in IDS]
    algo = AlgoConfig(topology="1peer", inner_steps=10, overlap=True)
    links = LinkEstimates()
    links.record_step_time(0.5)
    setup = plan_this_round(algo, "run", "a", 5, records, links, 2 * NUMEL, None)
    assert setup.codecs == {} and setup.long == {} and setup.sit_every is None


def test_a_peer_publishes_its_fastest_measured_link_not_a_slow_partners() -> None:
    links = LinkEstimates()
    links.record_transfer("slow", 10.0, 1_000_000)
    links.record_transfer("fast", 0.1, 1_000_000)
    assert links.own_bandwidth() == 1e7


def test_one_slow_exchange_does_not_make_a_peer_think_its_own_link_slow() -> None:
    links = LinkEstimates()
    links.record_transfer("slow-partner", 10.0, 1_000_000)
    assert links.own_bandwidth() == 1e5 and links.known_own_rate() == 0.0  # not enough
    slow, fast = record("s", bandwidth=5e5), record("f", bandwidth=1e5)
    assert (
        plan_links(7, fast, [slow], links.known_own_rate(), LADDER, NUMEL, 5.0, True).sit_every == 0
    )
    links.record_transfer("fast-partner", 0.01, 1_000_000)
    assert links.known_own_rate() == 1e8
    joined = LinkEstimates()
    joined.record_transfer(STATE_FETCH, 40.0, 8 * NUMEL)  # a newcomer's state fetch counts
    assert joined.known_own_rate() == pytest.approx(2e6)


def test_a_transfer_timed_after_its_bytes_were_buffered_is_not_a_link_rate() -> None:
    """A late acceptor's bytes partly arrived before it read them (unread_s): seen on real
    daemons, a 1 Mbit/s straggler 'received' 138 kB in 0.026 s and published 42 Mbit/s."""
    links = LinkEstimates()
    links.record_transfer("early-dialer", 0.026, 138_512, unread_s=1.186)
    links.record_transfer("early-dialer-2", 1.0, 125_000, unread_s=0.2)  # 20 % unread
    assert links.bandwidth == {} and links.transfer_s == {} and links.known_own_rate() == 0
    # Punctual: a moment to start reading is within the share, or the 10 ms floor.
    links.record_transfer("on-time", 1.0, 125_000, unread_s=0.04)
    links.record_transfer("fast", 0.03, 150_000, unread_s=0.008)
    assert links.bandwidth == {"on-time": 125_000.0, "fast": 5e6}


def test_nobody_paces_on_a_peer_that_sits_out() -> None:
    policy = RoundPolicy("a", record_ttl_s=15.0, h_upper=40)
    records = [record("a", 10), record("b", 10), record("s", 6, free_from=14)]
    policy.observe_roster(0.0, records)
    assert policy.behind(10, records) == []
    late = [record("a", 10), record("b", 10), record("s", 6, free_from=9)]
    assert [r.peer_id for r in policy.behind(10, late)] == ["s"]


def test_a_peer_that_sits_a_round_out_paces_on_nobody_in_it() -> None:
    """Its view of the others comes over its slow link and lags: pacing on it there put
    a 10× straggler rounds behind, and its partners then waited for it whenever it was
    paired. In the rounds it is paired in, it waits for those behind as anyone does."""
    sitter = RoundPolicy("s", record_ttl_s=15.0, h_upper=40)
    records = [record("a", 10), record("b", 10), record("s", 12, free_from=14)]
    sitter.observe_roster(0.0, records)
    assert sitter.behind(12, records) == []
    assert [r.peer_id for r in sitter.behind(14, records)] == ["a", "b"]


def test_a_partners_declared_rate_overrides_its_stale_record_and_k_is_capped() -> None:
    """A slow peer publishes over the link it saturates, so its record can still show
    the fast rate it once had: the rate its last header declared sizes the link."""
    records = [record(p, 5, bandwidth=1e9) for p in ("a", "b")]  # b's record: stale, fast
    algo = AlgoConfig(topology="1peer", inner_steps=10, adapt_h=True, overlap=True)
    links = LinkEstimates()
    links.record_step_time(0.5)
    args = (algo, "run", "a", 5, records, links, 2 * NUMEL, None)
    stale = plan_this_round(*args, ladder=LADDER, numel=NUMEL)
    assert stale.codecs["b"] == "fp16" and not stale.long
    hinted = plan_this_round(*args, ladder=LADDER, numel=NUMEL, rate_hints={"b": 5e5})
    k = math.ceil(transfer_s("q4", NUMEL, 5e5) / (hinted.target_round_s or 0))
    assert hinted.codecs["b"] == "q4" and hinted.long == {"b": k} and k > 1  # as b plans it
    assert hinted.sit_every == 0  # its link is the slow one, not ours: we stay in
    higher = plan_this_round(*args, ladder=LADDER, numel=NUMEL, rate_hints={"b": 2e9})
    assert higher.codecs["b"] == "fp16"  # the lower of the two sizes the link
    crawl = plan_this_round(*args, ladder=LADDER, numel=NUMEL, rate_hints={"b": 1.0})
    assert crawl.long == {"b": MAX_LONG_ROUNDS}  # a claimed crawl keeps ours 8 rounds at most


def test_a_long_link_stays_long_until_it_is_clearly_fast_enough() -> None:
    """Hysteresis: T moves with the machine's load, and a link at the border must not
    flip between long and regular from round to round."""
    q4 = transfer_s("q4", NUMEL, 1e6)  # q4's message at 1 MB/s: ~5.6 s
    me, slow = record("a", bandwidth=1e9), record("s", bandwidth=1e6)

    def plan(budget: float, was_long: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
        return plan_links(9, me, [slow], None, LADDER, NUMEL, budget, True, was_long)

    border = q4 / 0.7  # q4 crosses in 70% of the budget
    assert plan(border).codecs == {"s": "q4"} and not plan(border).long  # fresh: it fits
    assert plan(border, ("s",)).long == {"s": 2}  # was long: stays long within the band
    assert not plan(q4 / 0.55, ("s",)).long  # clearly faster (55%): regular again
    assert plan(q4 / 0.55, ("s",)).codecs == {"s": "q4"}
    # Our own link: a peer that sat out keeps sitting out within the band.
    mine = record("s", bandwidth=1e6)
    partner = [record("a", bandwidth=1e9)]
    assert plan_links(9, mine, partner, None, LADDER, NUMEL, border, True).sit_every == 0
    again = plan_links(9, mine, partner, None, LADDER, NUMEL, border, True, ("a",), 2)
    assert again.sit_every == 2
    # Also with a partner it never had a long exchange with: its own link is the slow
    # one, whoever the partner (before, a new partner's link "fit" and it left its
    # schedule, and its exchanges outlasted rounds: likely the 3T bench's flips).
    new = [record("b", bandwidth=1e9)]
    fresh = plan_links(9, mine, new, None, LADDER, NUMEL, border, True, ("a",), 2)
    assert fresh.sit_every == 2 and fresh.long == {"b": 2} and fresh.codecs == {"b": "q4"}
    clear = plan_links(9, mine, new, None, LADDER, NUMEL, q4 / 0.55, True, ("a",), 2)
    assert clear.sit_every == 0 and not clear.long  # clearly fast: back in every round


def test_a_link_that_would_take_most_of_a_round_is_long_not_regular() -> None:
    """A transfer planned at 90% of the round has no room for the partners' rounds ending
    apart or T moving with the load: on real daemons such q4 exchanges missed most of
    their rounds (the 3× bench). It goes long (two rounds), its slow end sits one out."""
    q4 = transfer_s("q4", NUMEL, 1e6)
    slow, fast = record("s", bandwidth=1e6), record("f", bandwidth=1e9)
    on_fast = plan_links(4, fast, [slow], None, LADDER, NUMEL, q4 / 0.9, True)
    on_slow = plan_links(4, slow, [fast], None, LADDER, NUMEL, q4 / 0.9, True)
    assert on_fast.long == {"s": 2} and on_slow.long == {"f": 2}
    assert on_slow.sit_every == 2 and on_fast.sit_every == 0
    assert not plan_links(4, fast, [slow], None, LADDER, NUMEL, q4 / 0.8, True).long


def test_the_plan_remembers_its_long_links_across_rounds() -> None:
    records = [record(p, 5, bandwidth=1e9) for p in ("a", "b")]
    records[1] = record("b", 5, bandwidth=5e5)  # b's link is slow: long for a
    algo = AlgoConfig(topology="1peer", inner_steps=10, adapt_h=True, overlap=True)
    links = LinkEstimates()
    links.record_step_time(0.5)
    setup = plan_this_round(
        algo, "run", "a", 5, records, links, 2 * NUMEL, None, ladder=LADDER, numel=NUMEL
    )
    assert setup.long and links.long_links == {"b"} and not links.own_every
    records[1] = record("b", 5, bandwidth=1e9)  # b got fast: a regular link again
    plan_this_round(
        algo, "run", "a", 6, records, links, 2 * NUMEL, None, ladder=LADDER, numel=NUMEL
    )
    assert links.long_links == frozenset()
