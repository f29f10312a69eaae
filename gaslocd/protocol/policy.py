"""The rules between planning a round and finishing it, as decisions on inputs.

Each rule takes what the peer knows (records, its round, how many exchanges worked) and
the clock's ``now``, and returns what to do. The daemon's round driver and the
simulator call the same methods; only where ``now`` comes from differs.

- **Catch up.** Others at least ``CATCH_UP_ROUNDS`` ahead (by the median of active
  peers' rounds, so a single record at a huge round drags no one): jump to their round.
  Round numbers only name pairings, so skipping some loses no training. Rounds cannot
  go faster than time allows: a record further ahead than ``MIN_ROUND_S`` per second
  since we last saw the run (plus ``JUMP_SLACK_ROUNDS``) is ignored, so even a majority
  of forged records cannot drag a running peer to round 2^62.
- **Pace.** Never run more than ``MAX_LEAD_ROUNDS`` ahead of an active peer: wait for it
  (bounded by the exchange deadline), training meanwhile when overlapped. The gap
  between the two rules keeps normal jitter from ever skipping a round. A peer whose
  round has not moved for ``stale_after_s`` holds nobody back: a record that never
  advances (dead, wedged, or forged to slow the run down) costs each peer at most that
  long, not a deadline a round.
- **Fill the wait.** A peer that finished its planned H before its partners keeps
  training (up to H_max and the exchange deadline) until every partner said Ready.
  Overlapped, the wait is for the previous round's exchange, still on the wire.
- **Solo rounds take T.** A round without partners, while others exist, lasts the
  target round time: otherwise a sitting-out peer would race ahead in round numbers.
- **Resynchronise.** ``RESYNC_AFTER_FAILED_ROUNDS`` rounds in a row with partners and
  no exchange (a healed partition whose θ the norm bound now refuses): take a live
  peer's state, from a *typical* peer (round nearest the roster's median), not the most
  advanced one, which is whoever claims the highest round. A fetched state must have
  its round and momentum in range (:func:`state_refusal`) and, when another peer can
  be asked, agree with that peer's (:func:`states_agree`).
- **Which exchanges count.** Only those where both sides took the other's θ̃: using a
  θ̃ whose sender refused ours would make the round's W one-sided.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gaslocd.algorithm.outer import renormalized_weights
from gaslocd.protocol.plan import FIRST_DEADLINE_S, RoundSetup
from gaslocd.protocol.records import PeerRecord
from gaslocd.protocol.sitout import SitOut

MAX_LEAD_ROUNDS = 1
CATCH_UP_ROUNDS = 2
RESYNC_AFTER_FAILED_ROUNDS = 3
# A long exchange dropped for lack of time (its own deadline, a partner whose round had
# closed or not begun, a stop) says nothing about drift, and a resync would fetch two full
# states over the very link that was too slow: it does not count as a failed round. Every
# other drop does (a refusal: the norm bound, a mismatch, a partner gone).
LATE_DROPS = frozenset({"deadline", "cancelled", "refused:timeout", "refused:future-round"})
# A partner that announced it sits this round out (our roster read came before that):
# a round with such a partner only is not a failed one (RoundPolicy.should_resync).
SAT_OUT = "refused:sitting-out"


def mendable_drops(reasons: Sequence[str]) -> int:
    """How many of these dropped long exchanges (their failure reasons) count toward a
    resync: ``long_failed`` of :meth:`RoundPolicy.should_resync`."""
    return sum(reason not in LATE_DROPS for reason in reasons)


# No honest round is shorter than this (steps, an exchange, a roster read): the fastest
# the run's round number can legitimately grow, 20 rounds per second.
MIN_ROUND_S = 0.05
JUMP_SLACK_ROUNDS = 4  # jitter allowed on top of elapsed / MIN_ROUND_S
STALE_AFTER_S = 2 * FIRST_DEADLINE_S  # a round unchanged this long holds nobody back
# A fetched state's outer momentum larger than this × ‖θ‖ is not a real run's: m sums
# pseudo-gradients, a few percent of θ each, decayed by μ (‖m‖ ≲ ‖G‖ / (1 − μ)).
MAX_MOMENTUM_RATIO = 1.0
STATE_ROUND_SLACK = 4  # a fetched round this far behind its source's record is refused
# ... and this far ahead of it: a record is refreshed once a heartbeat, so with rounds of
# a fraction of a second the live round runs well ahead of it (7 ahead of a round-0
# record was seen in a test under packet loss); a forged huge round stays refused.
STATE_ROUND_LEAD = 256


@dataclass(frozen=True)
class FillWait:
    """Keep training after the planned H until partners are ready, within limits."""

    room: int  # steps at most (H_max minus the steps already taken)
    until: float  # clock time at which filling stops regardless (the exchange deadline)

    def done(self, now: float, partners_ready: bool) -> bool:
        """Checked before each extra step: stop once every partner is ready, or at the
        deadline (a dead partner is then the exchange's problem, as without filling)."""
        return partners_ready or now >= self.until


def catch_up_round(t: int, records: Sequence[PeerRecord], me: str, min_gap: int) -> int:
    """``t``, or the round the active others are in when at least ``min_gap`` ahead.

    "The others" is the round at least half of them reached (median_low), not the
    highest one: one peer publishing a huge round (a bug, or hostile) drags no one.
    """
    others = [r.round for r in records if r.peer_id != me and r.active_from <= r.round]
    ahead = statistics.median_low(others) if others else t
    return ahead if ahead >= t + min_gap else t


def counted_exchanges(received: Iterable[str], refused_ours: Iterable[str]) -> set[str]:
    """Partners whose θ̃ enters the mix: received, and who did not refuse ours."""
    return set(received) - set(refused_ours)


def mixing_row(setup: RoundSetup, me: str, counted: Iterable[str]) -> dict[str, float]:
    """This round's row of W over the exchanges that counted (renormalised: a dropped
    partner's weight returns to oneself, which keeps W doubly stochastic when the drop
    is mutual, as it is by :func:`counted_exchanges`)."""
    return renormalized_weights(setup.mixing_row(me), me, set(counted))


def resync_sources(records: Sequence[PeerRecord], me: str) -> list[PeerRecord]:
    """Whom to ask for state, in order: typical peers first, i.e. those whose round is
    nearest the median of the others' (then the more advanced, then by id).

    Not the most advanced: the highest round is what a hostile record claims, and an
    honest peer's state is as good a round behind as a round ahead. Never a peer behind
    NAT (``reachable`` False): nobody can dial it. A peer sitting out of the pairings
    (on a sit-out schedule, or ``free_from`` ahead of its round: its link cannot carry
    θ̃ within a round) comes last: two full states over that link took minutes
    (bench/stragglers_net.py, 10× T).
    """
    others = [r for r in records if r.peer_id != me and r.reachable]
    if not others:
        return []
    middle = statistics.median_low(r.round for r in others)
    return sorted(
        others,
        key=lambda r: (_slow_link(r, r.round), abs(r.round - middle), -r.round, r.peer_id),
    )


def _slow_link(record: PeerRecord, round_: int) -> bool:
    """Whether ``record`` says its link cannot carry θ̃ within a round (at ``round_``)."""
    schedule = SitOut.of(record)
    return schedule.periodic or schedule.free_from > round_


def state_refusal(
    source: PeerRecord, round_: int, theta_norm: float, momentum_norm: float
) -> str | None:
    """Why a fetched state must not be adopted (None: it may): its round far from what
    its source publishes, or an outer momentum no real run has."""
    if not source.round - STATE_ROUND_SLACK <= round_ <= source.round + STATE_ROUND_LEAD:
        return f"round {round_} is far from its source's record (round {source.round})"
    if not (math.isfinite(theta_norm) and math.isfinite(momentum_norm)):
        return "non-finite state"
    if momentum_norm > MAX_MOMENTUM_RATIO * theta_norm:
        return f"outer momentum norm {momentum_norm:.4g} exceeds ‖θ‖ = {theta_norm:.4g}"
    return None


def states_agree(theta_distance: float, other_norm: float, norm_bound: float) -> bool:
    """Two peers' θ agree when an exchange between them would pass the norm bound:
    honest replicas always do (they are refused past it and resynchronise)."""
    return theta_distance <= norm_bound * other_norm


class RoundPolicy:
    """One peer's memory between rounds, and the rules that use it."""

    def __init__(
        self,
        me: str,
        record_ttl_s: float,
        h_upper: int,
        stale_after_s: float = STALE_AFTER_S,
        min_round_s: float = MIN_ROUND_S,
    ) -> None:
        self.me = me
        self.record_ttl_s = record_ttl_s
        self.h_upper = h_upper
        self.stale_after_s = stale_after_s
        self.min_round_s = min_round_s
        self.now = -math.inf  # the clock at the last roster observed
        self.others_seen_at = -math.inf  # when the roster last held another peer
        self.failed_rounds = 0  # consecutive rounds with partners and no exchange
        self.moved: dict[str, tuple[int, float]] = {}  # peer -> (its round, seen since)
        self.anchor: tuple[int, float] | None = None  # (run's round, when) at the last look

    def observe_roster(self, now: float, records: Sequence[PeerRecord]) -> None:
        """Remember when we saw others, and since when each peer has been at its round."""
        self.now = now
        if any(r.peer_id != self.me for r in records):
            self.others_seen_at = now
        for r in records:
            seen = self.moved.get(r.peer_id)
            if seen is None or seen[0] != r.round:
                self.moved[r.peer_id] = (r.round, now)

    def plausible_round(self) -> float:
        """The highest round the run can have reached by now (inf before the first look)."""
        if self.anchor is None:
            return math.inf
        round_, at = self.anchor
        return round_ + JUMP_SLACK_ROUNDS + max(0.0, self.now - at) / self.min_round_s

    def catch_up(self, t: int, records: Sequence[PeerRecord]) -> int:
        """:func:`catch_up_round` over the records whose round time allows (call
        :meth:`observe_roster` first: it sets ``now``)."""
        limit = self.plausible_round()
        credible = [r for r in records if r.round <= limit]
        ahead = catch_up_round(t, credible, self.me, CATCH_UP_ROUNDS)
        if any(r.peer_id != self.me for r in credible):
            self.anchor = (max(t, ahead), self.now)
        return ahead

    def stale(self, record: PeerRecord) -> bool:
        """Whether ``record``'s round has not moved for ``stale_after_s``."""
        seen = self.moved.get(record.peer_id)
        return (
            seen is not None
            and seen[0] == record.round
            and self.now - seen[1] >= self.stale_after_s
        )

    def pace_until(self, now: float, fixed_deadline_s: float | None) -> float:
        """How long pacing may wait at most: one exchange deadline (then the slow peer
        is either back or its record expires)."""
        return now + (fixed_deadline_s or FIRST_DEADLINE_S)

    def behind(self, t: int, records: Sequence[PeerRecord]) -> list[PeerRecord]:
        """Active peers more than ``MAX_LEAD_ROUNDS`` behind round ``t``: wait for them.

        A stale peer (round unmoved for ``stale_after_s``) is not waited for while some
        other peer's round moves: then the run goes on and that record is dead, wedged or
        forged. When *every* other record is stale, we are the one cut off (a partition
        keeps showing us their last records): pacing against them keeps our round from
        racing ahead, so that after the heal our rounds still meet theirs.
        """
        # A peer sitting round t out (a slow link, its schedule) is paired with nobody:
        # nobody waits for it, and its record, sent over that link, may well lag. In the
        # rounds it is paired in it is waited for like anyone: without that, nothing holds
        # its round numbers to the run's, and its pairings fall in rounds its partners
        # have long left (a netns test saw it 200 rounds behind, resyncing in a loop).
        # Nor does a peer that sits round t out wait for anyone: nobody is paired with it,
        # and the records it would wait on came over its own saturated link, late (a 10×
        # straggler paced on them, fell rounds behind, and its partners then paced on it
        # in every round it was paired in: 27-30 % of their time).
        if any(r.peer_id == self.me and not SitOut.of(r).takes_part(t) for r in records):
            return []
        others = [
            r
            for r in records
            if r.peer_id != self.me and r.active_from <= r.round and SitOut.of(r).takes_part(t)
        ]
        moving = any(not self.stale(r) for r in others)
        return [
            r for r in others if r.round < t - MAX_LEAD_ROUNDS and not (moving and self.stale(r))
        ]

    def fill_wait(self, setup: RoundSetup, steps_done: int, now: float) -> FillWait | None:
        """The fill for this round, or None when there is nothing to wait for."""
        room = self.h_upper - steps_done
        if not setup.partners or room <= 0:
            return None
        return FillWait(room=room, until=now + setup.deadline_s)

    def paced_steps(self, wait_s: float, step_s: float) -> int:
        """Overlap: a peer held back by pacing trains meanwhile, as many steps as the
        wait holds (at most H_max): the round numbers stay aligned, and nobody idles for
        a slow peer. Without overlap the wait stays a wait (the next round's start point
        is the outer step's, not yet known)."""
        if wait_s <= 0 or step_s <= 0:
            return 0
        return min(self.h_upper, int(wait_s // step_s))

    def fill_overlap(self, in_flight: bool, steps_done: int, until: float) -> FillWait | None:
        """Overlap: the fill while the previous round's exchange is still on the wire,
        so that its outer step can land (None when it is already done). Bounded by H_max
        and that exchange's own deadline, after which it has failed anyway."""
        room = self.h_upper - steps_done
        if not in_flight or room <= 0:
            return None
        return FillWait(room=room, until=until)

    def solo_wait_s(self, setup: RoundSetup, elapsed_s: float, now: float) -> float:
        """Seconds a partnerless round should still last, so that it takes T."""
        if setup.partners or setup.target_round_s is None:
            return 0.0
        if now - self.others_seen_at >= self.record_ttl_s:
            return 0.0  # truly alone: nobody to keep pace with
        return max(0.0, min(setup.target_round_s - elapsed_s, setup.target_round_s))

    def should_resync(
        self,
        setup: RoundSetup,
        exchanged: int,
        long_failed: int = 0,
        excused: Collection[str] = (),
    ) -> bool:
        """Count rounds with partners and no exchange; True when it is time to resync.

        Long exchanges count when they end, rounds later: the caller adds those that
        landed to ``exchanged`` and those dropped to ``long_failed``. A round whose
        partners are all long has nothing to fail yet; counting it failed would resync a
        peer whose only fault is a slow link, by a state fetch over that link. Dropped
        ones count (refused for drifting beyond the norm bound, only a resync helps),
        except those that only ran out of time (:data:`LATE_DROPS`: the caller leaves
        them out of ``long_failed``). ``excused``: partners that told us they sit the round
        out (:data:`SAT_OUT`): our view was a heartbeat old, nothing a state would mend."""
        partners = [p for p in setup.partners if p not in excused]
        if all(p in setup.long for p in partners) and not exchanged and not long_failed:
            return False
        if (not setup.partners and not long_failed) or exchanged:
            self.failed_rounds = 0
            return False
        self.failed_rounds += 1
        if self.failed_rounds < RESYNC_AFTER_FAILED_ROUNDS:
            return False
        self.failed_rounds = 0
        return True
