"""What a daemon decides at the start of a round: roster, partners, H, deadline.

Pure given its inputs (records from the DHT, measurements kept by the daemon), so the
round driver stays a readable sequence of awaits. The roster for round t is every fresh
record of the same model whose ``active_from`` ≤ t: a newcomer announces itself a few
rounds ahead, so by the time it counts every peer has seen its record and all compute
the same permutation (a peer seen by some and not others would reshuffle everyone).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from gaslocd.algorithm.hpolicy import choose_inner_steps, target_round_time
from gaslocd.algorithm.topology import RoundPlan, plan_round, roster_digest
from gaslocd.config import AlgoConfig
from gaslocd.net.discovery import PeerRecord

# Before anything is measured, an exchange may take this long.
FIRST_DEADLINE_S = 60.0
MIN_DEADLINE_S = 10.0
EWMA = 0.3  # weight of the newest measurement


def ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


@dataclass
class LinkEstimates:
    """What this daemon measured: its step time, and per partner the exchange time."""

    step_time_s: float | None = None
    transfer_s: dict[str, float] = field(default_factory=dict)
    bandwidth: dict[str, float] = field(default_factory=dict)  # bytes/s per partner

    def record_step_time(self, seconds: float) -> None:
        self.step_time_s = ewma(self.step_time_s, seconds)

    def record_transfer(self, peer: str, seconds: float, nbytes: int) -> None:
        if seconds <= 0:
            return
        self.transfer_s[peer] = ewma(self.transfer_s.get(peer), seconds)
        self.bandwidth[peer] = ewma(self.bandwidth.get(peer), nbytes / seconds)

    def own_bandwidth(self) -> float:
        """Median over links: what this peer publishes (0 before any exchange)."""
        return statistics.median(self.bandwidth.values()) if self.bandwidth else 0.0


@dataclass(frozen=True)
class RoundSetup:
    round: int
    plan: RoundPlan | None  # None: this peer is not (yet) in the roster and sits out
    partners: dict[str, str]  # peer id -> gRPC address
    inner_steps: int
    deadline_s: float
    digest: bytes
    roster_size: int
    target_round_s: float | None = None  # T of DESIGN §1; None before step times are known


def active_roster(records: Sequence[PeerRecord], round_: int, me: str) -> list[PeerRecord]:
    """Records that take part in ``round_`` (``me`` included only once it is active too)."""
    return [r for r in records if r.active_from <= round_]


def catch_up_round(t: int, records: Sequence[PeerRecord], me: str, min_gap: int) -> int:
    """The round to continue from: ``t``, or the round the others are in when they are
    at least ``min_gap`` rounds ahead (round numbers only name pairings: skipping some
    loses no training, while asking for rounds the partners have left pairs no one).

    "The others" is the round at least half of the active others have reached, not the
    highest one: a single peer publishing a huge round (a bug, or hostile) drags no one.
    """
    others = [r.round for r in records if r.peer_id != me and r.active_from <= r.round]
    ahead = statistics.median_low(others) if others else t
    return ahead if ahead >= t + min_gap else t


def _typical_transfer_s(records: Sequence[PeerRecord], message_bytes: int) -> float:
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
) -> RoundSetup:
    """Roster → partners → H → deadline for ``round_`` (DESIGN §1 and §3)."""
    active = active_roster(records, round_, me)
    by_id = {r.peer_id: r for r in active}
    ids = sorted(by_id)
    plan = plan_round(algo.topology, ids, round_, run_id) if me in by_id else None
    partners = {p: by_id[p].address for p in plan.partners_of(me)} if plan else {}
    typical = _typical_transfer_s(active, message_bytes)
    steps = [r.step_time_s for r in active if r.step_time_s > 0]
    if links.step_time_s is not None:
        steps.append(links.step_time_s)
    h_base = algo.inner_steps
    if steps:
        target = target_round_time(h_base, steps, [typical])
        deadline = fixed_deadline_s or max(MIN_DEADLINE_S, 2.0 * target + 2.0 * typical)
    else:
        target, deadline = None, fixed_deadline_s or FIRST_DEADLINE_S
    inner_steps = h_base
    if algo.adapt_h and target is not None and links.step_time_s is not None:
        expected = max(
            (_expected_transfer_s(p, by_id, links, message_bytes, typical) for p in partners),
            default=0.0,
        )
        inner_steps = choose_inner_steps(
            target, expected, links.step_time_s, algo.h_min, algo.h_upper
        )
    return RoundSetup(
        round=round_,
        plan=plan,
        partners=partners,
        inner_steps=inner_steps,
        deadline_s=deadline,
        digest=bytes.fromhex(roster_digest(ids)),
        roster_size=len(ids),
        target_round_s=target,
    )
