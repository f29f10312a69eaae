"""What a peer decides at the start of a round: roster, partners, H, deadline, T.

The roster for round t is every fresh record of the same model whose ``active_from`` ≤ t:
a newcomer announces itself a few rounds ahead, so by the time it counts every peer has
seen its record and all compute the same permutation (a peer seen by some and not others
would reshuffle everyone). The permutation is drawn from (run id, round) in the
simulator and the daemon alike, so the same roster gives the same W in both.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from gaslocd.algorithm.hpolicy import choose_inner_steps, target_round_time
from gaslocd.algorithm.topology import RoundPlan, plan_round, roster_digest
from gaslocd.config import AlgoConfig
from gaslocd.protocol.records import PeerRecord

# Before anything is measured, an exchange may take this long.
FIRST_DEADLINE_S = 60.0
MIN_DEADLINE_S = 10.0
EWMA = 0.3  # weight of the newest measurement


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

    def record_step_time(self, seconds: float) -> None:
        self.step_time_s = ewma(self.step_time_s, seconds)

    def record_transfer(self, peer: str, seconds: float, nbytes: int) -> None:
        if seconds <= 0:
            return
        self.transfer_s[peer] = ewma(self.transfer_s.get(peer), seconds)
        self.bandwidth[peer] = ewma(self.bandwidth.get(peer), nbytes / seconds)

    def best_rate(self) -> float:
        """The fastest link measured (bytes/s): a lower bound on this peer's own link,
        against which a slower exchange counts as waiting on the partner's link."""
        return max(self.bandwidth.values(), default=0.0)

    def own_bandwidth(self) -> float:
        """Median over links: what this peer publishes (0 before any exchange)."""
        return statistics.median(self.bandwidth.values()) if self.bandwidth else 0.0


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

    def mixing_row(self, me: str) -> dict[str, float]:
        """This peer's row of W (only itself when it sits out)."""
        return self.plan.mixing_weights(me) if self.plan is not None else {me: 1.0}


def active_roster(records: Sequence[PeerRecord], round_: int) -> list[PeerRecord]:
    """Records that take part in ``round_``."""
    return [r for r in records if r.active_from <= round_]


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
) -> RoundSetup:
    """Roster → partners → H → deadline for ``round_`` (docs/design.md §1 and §3)."""
    active = active_roster(records, round_)
    by_id = {r.peer_id: r for r in active}
    ids = sorted(by_id)
    plan = plan_round(algo.topology, ids, round_, run_id) if me in by_id else None
    partners = {p: by_id[p].address for p in plan.partners_of(me)} if plan else {}
    typical = typical_transfer_s(active, message_bytes)
    steps = [r.step_time_s for r in active if r.step_time_s > 0 and r.peer_id != me]
    if links.step_time_s is not None:
        steps.append(links.step_time_s)
    h_base = algo.inner_steps
    # Overlapped, a round's exchange runs during the next round's steps: the round is
    # its compute, and H no longer trades steps for transfer time.
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
