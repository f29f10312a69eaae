"""What a peer decides at the start of a round: roster, partners, H, deadline, T.

The roster for round t is every fresh record of the same model whose ``active_from`` ≤ t:
a newcomer announces itself a few rounds ahead, so by the time it counts every peer has
seen its record and all compute the same permutation (a peer seen by some and not others
would reshuffle everyone). The permutation is drawn from (run id, round) in the
simulator and the daemon alike, so the same roster gives the same W in both.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gaslocd.algorithm.hpolicy import choose_inner_steps, target_round_time
from gaslocd.algorithm.topology import RoundPlan, dialer, plan_round, roster_digest
from gaslocd.config import AlgoConfig
from gaslocd.protocol.linkcodec import choose_codec, transfer_s
from gaslocd.protocol.records import PeerRecord
from gaslocd.protocol.sitout import takes_part

STATE_FETCH = "state-fetch"  # the link estimate key of a newcomer's state fetch
# Before anything is measured, an exchange may take this long.
FIRST_DEADLINE_S = 60.0
MIN_DEADLINE_S = 10.0
EWMA = 0.3  # weight of the newest measurement
# The most rounds a long exchange may span: a slow link's k stays well under it, and a
# partner's header claiming more (a hostile insider's) is cut to it.
MAX_LONG_ROUNDS = 8
# A link carries θ̃ within a round when its transfer takes at most this share of the
# budget. The exchange starts when the later partner's round ends, and step time (so T)
# moves with the machine's load: on real daemons a q4 θ̃ planned at 0.9 T missed most of
# its rounds and its partners waited for it (bench/results/network_stragglers.md, 3×).
FIT = 0.8
# Hysteresis of "too slow for a round": a link (or our own) classified long stays long
# until its strongest codec's transfer is under this share of the budget. Without it a
# borderline link flips between long and regular with the load from round to round.
STAY_LONG = 0.6
# A transfer timed after its data could already flow for more than this share of its
# time, and this long (an acceptor that claimed the call late), measures buffers, not the
# link. A sample kept is at most 1/(1 - share) too fast, or 10 ms of the link's bytes
# early (1.2 kB at 1 Mbit/s): the floor keeps the samples of a punctual acceptor whose
# loop took a moment to start reading a transfer of a few tens of ms.
UNREAD_SHARE, UNREAD_FLOOR_S = 0.05, 0.01


def ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


@dataclass
class LinkEstimates:
    """What one peer measured: its step time, and per partner the exchange time.

    Smoothed (EWMA) rather than the last value: one slow exchange on a shared machine
    should move H a little, not make the next round's plan swing.
    """

    step_time_s: float | None = None
    transfer_s: dict[str, float] = field(default_factory=dict)
    bandwidth: dict[str, float] = field(default_factory=dict)  # bytes/s per partner
    # What our last plan with partners decided (plan_this_round keeps it): the partners
    # whose link it made long, and the rounds our own link needed per exchange (0: it
    # fitted one), their hysteresis.
    long_links: frozenset[str] = frozenset()
    own_every: int = 0

    def record_step_time(self, seconds: float) -> None:
        self.step_time_s = ewma(self.step_time_s, seconds)

    def record_transfer(
        self, peer: str, seconds: float, nbytes: int, unread_s: float = 0.0
    ) -> None:
        """One exchange's ``nbytes`` received in ``seconds``; ``unread_s``: how long the
        partner's data could arrive before the clock started (ExchangeResult.unread_s).
        Such a sample is dropped, not corrected: how much was buffered is unknown, and
        an inflated own rate takes a slow peer off its sit-out schedule, then every
        exchange it tries misses its round."""
        if seconds <= 0 or unread_s > max(UNREAD_SHARE * seconds, UNREAD_FLOOR_S):
            return
        self.transfer_s[peer] = ewma(self.transfer_s.get(peer), seconds)
        self.bandwidth[peer] = ewma(self.bandwidth.get(peer), nbytes / seconds)

    def best_rate(self) -> float:
        """The fastest link measured (bytes/s): a lower bound on this peer's own link,
        against which a slower exchange counts as waiting on the partner's link."""
        return max(self.bandwidth.values(), default=0.0)

    def own_bandwidth(self) -> float:
        """What this peer publishes as its link's rate (0 before any exchange): the
        fastest exchange measured, not the median, since a slow partner's link says
        nothing about ours; peers size each link's codec from it (:func:`plan_links`)."""
        return self.best_rate()

    def known_own_rate(self) -> float:
        """Our link's rate when we know enough to sit ourselves out on it (0: not yet).
        One exchange is not enough (a fast peer whose first partner was slow would sit
        itself out), unless it was a join's state fetch (``STATE_FETCH``: from a typical
        peer, so a slow result is our own link)."""
        if len(self.bandwidth) >= 2 or set(self.bandwidth) == {STATE_FETCH}:
            return self.best_rate()
        return 0.0


@dataclass(frozen=True)
class RoundSetup:
    round: int
    plan: RoundPlan | None  # None: this peer is not (yet) in the roster and sits out
    partners: dict[str, str]  # peer id -> address
    inner_steps: int
    deadline_s: float
    digest: bytes
    roster_size: int
    target_round_s: float | None = None  # T of docs/design.md §1; None before step times are known
    # Per partner: the codec our θ̃ goes in (empty: the configured one), and, under overlap,
    # the rounds a long exchange takes when even the strongest codec misses a round.
    codecs: dict[str, str] = field(default_factory=dict)
    long: dict[str, int] = field(default_factory=dict)
    # Rounds our own link needs per exchange (k >= 2: we sit out between pairings, see
    # gaslocd.protocol.sitout; 0: it fits a round); None: no link planned this round.
    sit_every: int | None = None
    # Which of this round's partners, and ourselves, are behind NAT (by their records):
    # who dials whom (algorithm.topology.dialer), and whose Ready must be asked for.
    unreachable: frozenset[str] = frozenset()
    dial: frozenset[str] = frozenset()  # the partners we call (the others call us)

    def mixing_row(self, me: str) -> dict[str, float]:
        """This peer's row of W (only itself when it sits out)."""
        return self.plan.mixing_weights(me) if self.plan is not None else {me: 1.0}

    def long_deadline_s(self, partner: str) -> float:
        """How long a long exchange may take: its rounds of T, with room for jitter."""
        return self.kept_s(self.long.get(partner, 1))

    def kept_s(self, rounds: int) -> float:
        """How long an exchange kept open for ``rounds`` rounds may take."""
        return self.deadline_s + 1.5 * rounds * (self.target_round_s or 0.0)


def active_roster(records: Sequence[PeerRecord], round_: int) -> list[PeerRecord]:
    """Records that take part in ``round_``: active, and not sitting out."""
    return [r for r in records if takes_part(r, round_)]


@dataclass(frozen=True)
class LinkPlan:
    codecs: dict[str, str]
    long: dict[str, int]
    sit_every: int | None  # rounds our own link needs per exchange (0: fits one)


def rounds_needed(transfer: float, budget_s: float) -> int:
    """The rounds a long exchange spans: at least 2, at most ``MAX_LONG_ROUNDS``."""
    return min(max(2, math.ceil(transfer / budget_s)), MAX_LONG_ROUNDS)


def plan_links(
    round_: int,
    me: PeerRecord | None,
    partners: Sequence[PeerRecord],
    own_rate: float | None,
    ladder: Sequence[str],
    numel: int,
    budget_s: float,
    overlap: bool,
    was_long: Collection[str] = (),
    was_every: int = 0,
) -> LinkPlan:
    """Per partner, the codec that carries θ̃ within ``FIT`` of ``budget_s`` (the next
    round's compute when overlapped), from the *published* rates of both ends: both sides
    read the same records, so both classify the link alike. Under overlap a link that not
    even the strongest codec crosses so becomes a long exchange of k rounds, mixed when it
    lands; and when it is *our own* link that is too slow (``own_rate``: what we know of
    it, :meth:`LinkEstimates.known_own_rate`; None: our record's), we are paired only
    every k rounds (``sit_every``, :mod:`gaslocd.protocol.sitout`), so that nobody waits
    for us meanwhile. ``was_long`` / ``was_every``: what our last plan decided; such a
    link (or our own) stays long until it crosses in ``STAY_LONG`` of the budget, and our
    k shrinks only when the smaller one holds with that margin too (each change of k is
    a new schedule that every peer must read).
    """
    codecs: dict[str, str] = {}
    long: dict[str, int] = {}
    own = me.bandwidth_bytes_per_s if me is not None else 0.0
    for q in partners:
        rates = [x for x in (own, q.bandwidth_bytes_per_s) if x > 0]
        rate = min(rates) if rates else None
        choice = choose_codec(ladder, numel, rate, FIT * budget_s)
        strict = choose_codec(ladder[-1:], numel, rate, STAY_LONG * budget_s)
        # Still long unless clearly faster now: a link that was, or any link of ours
        # while our own was too slow (else a partner new to us made our link "fit" at
        # once and we left our schedule while our own link was still in the band).
        if (q.peer_id in was_long or was_every) and choice.fits and not strict.fits:
            choice = strict
        codecs[q.peer_id] = choice.codec
        if overlap and not choice.fits and choice.transfer_s is not None:
            long[q.peer_id] = rounds_needed(choice.transfer_s, budget_s)
    mine = own if own_rate is None else own_rate
    limit = (STAY_LONG if was_every else FIT) * budget_s
    slow = mine > 0 and transfer_s(ladder[-1], numel, mine) > limit
    every = max(long.values()) if long and slow else 0
    if 0 < every < was_every:
        ours = transfer_s(ladder[-1], numel, mine) * FIT / STAY_LONG
        every = max(every, min(was_every, rounds_needed(ours, budget_s)))
    return LinkPlan(codecs, long, every if partners else None)


def _remembered(
    round_: int,
    me: PeerRecord | None,
    partners: list[PeerRecord],
    links: LinkEstimates,
    ladder: Sequence[str],
    numel: int,
    budget_s: float,
    overlap: bool,
) -> LinkPlan:
    """:func:`plan_links` with our last decisions as its hysteresis, which it updates."""
    plan = plan_links(
        round_, me, partners, links.known_own_rate(), ladder, numel, budget_s, overlap,
        links.long_links, links.own_every,
    )  # fmt: skip
    links.long_links = links.long_links - {q.peer_id for q in partners} | set(plan.long)
    links.own_every = plan.sit_every or 0
    return plan


def _hinted(record: PeerRecord, hints: Mapping[str, float] | None) -> PeerRecord:
    hint = (hints or {}).get(record.peer_id, 0.0)
    rate = record.bandwidth_bytes_per_s
    if hint > 0 and (rate <= 0 or hint < rate):
        return replace(record, bandwidth_bytes_per_s=hint)
    return record


def typical_transfer_s(records: Sequence[PeerRecord], message_bytes: int) -> float:
    """One message at the median published bandwidth: the network's typical exchange."""
    rates = [r.bandwidth_bytes_per_s for r in records if r.bandwidth_bytes_per_s > 0]
    return message_bytes / statistics.median(rates) if rates else 0.0


def _expected_transfer_s(
    partner: str,
    records: dict[str, PeerRecord],
    links: LinkEstimates,
    message_bytes: int,
    fallback: float,
) -> float:
    if partner in links.transfer_s:
        return links.transfer_s[partner]
    rates = [x for x in (links.own_bandwidth(), records[partner].bandwidth_bytes_per_s) if x > 0]
    return message_bytes / min(rates) if rates else fallback


def plan_this_round(
    algo: AlgoConfig,
    run_id: str,
    me: str,
    round_: int,
    records: Sequence[PeerRecord],
    links: LinkEstimates,
    message_bytes: int,
    fixed_deadline_s: float | None,
    *,
    ladder: Sequence[str] = (),
    numel: int = 0,
    rate_hints: Mapping[str, float] | None = None,
) -> RoundSetup:
    """Roster → partners → H → deadline → codec per link for ``round_`` (design §1, §3).
    ``ladder``: the codecs a link may step down to (empty: the configured one); ``numel``:
    the model's size; ``rate_hints``: partners' rates as their headers declared them, used
    when lower than their records (a slow peer's record, published over the link it
    saturates, can be stale)."""
    active = active_roster(records, round_)
    by_id = {r.peer_id: r for r in active}
    ids = sorted(by_id)
    shut = frozenset(r.peer_id for r in active if not r.reachable)  # behind NAT
    plan = plan_round(algo.topology, ids, round_, run_id, shut) if me in by_id else None
    partners = {p: by_id[p].address for p in plan.partners_of(me)} if plan else {}
    typical = typical_transfer_s(active, message_bytes)
    steps = [r.step_time_s for r in active if r.step_time_s > 0 and r.peer_id != me]
    steps += [] if links.step_time_s is None else [links.step_time_s]
    h_base = algo.inner_steps
    # Overlapped, the exchange runs during the next round's steps: H trades nothing for it.
    in_round = 0.0 if algo.overlap else typical
    if steps:
        target = target_round_time(h_base, steps, [in_round])
        deadline = fixed_deadline_s or max(MIN_DEADLINE_S, 2.0 * target + 2.0 * typical)
    else:
        target, deadline = None, fixed_deadline_s or FIRST_DEADLINE_S
    inner_steps = h_base
    if algo.adapt_h and target is not None and links.step_time_s is not None:
        transfers = [
            _expected_transfer_s(q, by_id, links, message_bytes, typical) for q in partners
        ]
        expected = 0.0 if algo.overlap else max(transfers, default=0.0)
        inner_steps = choose_inner_steps(
            target, expected, links.step_time_s, algo.h_min, algo.h_upper
        )
    links_plan = LinkPlan({}, {}, None)
    if len(ladder) > 1 and target is not None and partners:
        budget = target - (0.0 if algo.overlap else algo.h_min * (links.step_time_s or 0.0))
        mine = next((r for r in records if r.peer_id == me), None)
        ends = [_hinted(by_id[q], rate_hints) for q in partners]
        links_plan = _remembered(round_, mine, ends, links, ladder, numel, budget, algo.overlap)
    return RoundSetup(
        round=round_,
        plan=plan,
        partners=partners,
        inner_steps=inner_steps,
        deadline_s=deadline,
        digest=bytes.fromhex(roster_digest(ids)),
        roster_size=len(ids),
        target_round_s=target,
        codecs=links_plan.codecs,
        long=links_plan.long,
        sit_every=links_plan.sit_every,
        **_behind_nat(me, partners, shut),
    )


def _behind_nat(me: str, partners: Collection[str], shut: frozenset[str]) -> dict[str, Any]:
    """Which of us and the partners are behind NAT, and whom we call (RoundSetup)."""
    return {
        "unreachable": shut & {*partners, me},
        "dial": frozenset(p for p in partners if dialer(me, p, shut) == me),
    }
