"""A slow peer's sit-out schedule: which rounds it is paired in, known rounds ahead.

A peer whose own link needs k ≥ 2 rounds to carry θ̃ is paired every k-th round and sits
out of the pairings in between, while its long exchange crosses (design §1, "Sit out").
It publishes the schedule, not each sit-out: ``free_from`` F and ``sit_every`` k in its
record say that it takes part in round t iff t ≥ F and k divides t − F (k < 2: every
round from F). Every peer computes the same roster from it for every future round, so
the roster changes only when the schedule does.

Before, the slow peer published a new ``free_from`` every k rounds, each one needed by
every peer before the very next round, and sent over the link it saturates: with rounds
of ~1.5 s it often arrived late, rosters disagreed for a round, and exchanges between
the *fast* peers failed (bench/results/network_stragglers.md, 3×). Now a change takes
effect at the old schedule's next paired round, so it has k rounds to arrive; only the
first sit-out (there is no schedule to announce it ahead) still has one.

A record also names the round after the one that decided it (``sit_from``): a peer still
planning that round or an earlier one when the record reaches it pairs the sitter as the
previous record said, as the sitter itself does. Without it the lag ran the other way
too: the first peer of a netns run, slower out of its lobby, planned round 0 from the
newcomer's round-1 announcement and refused its round-0 exchange (4 runs in 5); and a
change decided in a paired round left the sitter out of that very round for a late
planner. The previous schedule needs no field of its own: a first sit-out's first
pairing is k rounds after its deciding round d (``free_from − d = every``), a change's is
the old schedule's next pairing, old k rounds after d (and old k ≠ the new one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gaslocd.protocol.records import PeerRecord


@dataclass(frozen=True)
class SitOut:
    """``free_from``: the first round paired; ``every``: paired every that many rounds
    from it (0 or 1: every round); ``sit_from``: the round after the one that decided
    it (0: none named), before which the previous schedule holds (see the module doc)."""

    free_from: int = 0
    every: int = 0
    sit_from: int = 0

    @classmethod
    def of(cls, record: PeerRecord) -> SitOut:
        return cls(record.free_from, record.sit_every, record.sit_from)

    def on(self, record: PeerRecord) -> PeerRecord:
        """``record`` carrying this schedule."""
        return replace(
            record, free_from=self.free_from, sit_every=self.every, sit_from=self.sit_from
        )

    @property
    def periodic(self) -> bool:
        """On a schedule: its link is too slow for a round."""
        return self.every >= 2

    def takes_part(self, round_: int) -> bool:
        if round_ < self.sit_from:
            return self._before(round_)
        if round_ < self.free_from:
            return False
        return not self.periodic or (round_ - self.free_from) % self.every == 0

    def _before(self, round_: int) -> bool:
        """Round ``round_`` (up to the deciding one) as the previous schedule had it."""
        decided = self.sit_from - 1
        cycle = self.free_from - decided  # a first sit-out: our k; a change: the old k
        return cycle == self.every or cycle <= 0 or (decided - round_) % cycle == 0

    def next_paired(self, round_: int) -> int:
        """The first round after ``round_`` that this peer is paired in."""
        if round_ + 1 <= self.free_from:
            return self.free_from
        if not self.periodic:
            return round_ + 1
        return round_ + self.every - (round_ - self.free_from) % self.every

    def announces(self, round_: int) -> bool:
        """Whether the start of our ``round_`` is published (every round, off a schedule).

        Peers read a round number to pace on us and catch up, but nobody paces on a
        peer in a round it sits out: on a schedule only the round before a paired one
        and the paired one are announced. Every publish goes to every DHT node over our
        own link, the one too slow for a round (a 10× straggler's records, each round
        and heartbeat, were a tenth of its link)."""
        return not self.periodic or self.takes_part(round_) or self.takes_part(round_ + 1)

    def refresh_s(
        self, round_: int, heartbeat_s: float, ttl_s: float, announced_s_ago: float = math.inf
    ) -> float:
        """How old our record may grow before a heartbeat publishes it again: a quarter
        of its lifetime while a round start was published within that (``announced_s_ago``:
        round starts carry what peers need, and a heartbeat beside them only doubled the
        stores) or while we sit ``round_`` out (the record only has to stay alive, and
        reach the others for the paired round: announced above); else a heartbeat."""
        quarter = ttl_s / 4
        if announced_s_ago < quarter or (self.periodic and not self.takes_part(round_)):
            return max(heartbeat_s, quarter)
        return heartbeat_s

    def hold_after(self, round_: int) -> int:
        """How many rounds an exchange of ``round_`` with this peer may stay open: until
        its next paired round when it sits out the one after ``round_`` (else 0)."""
        if self.takes_part(round_ + 1):
            return 0
        return self.next_paired(round_) - round_

    def after(self, round_: int, need: int | None) -> SitOut:
        """The schedule once a round we are paired in planned ``need`` rounds per exchange
        for our link (0: it fits a round; None: nothing planned, no change).

        Off a schedule, a slow link sits out from the next round at once (nothing could
        announce it earlier). On one, any change (another k, or back to every round)
        starts at the old schedule's next paired round: the rounds until then stay as
        every peer already knows them, so the new record has that long to reach them."""
        if need is None or need == self.every or (need < 2 and not self.periodic):
            return self
        every = need if need >= 2 else 0
        start = self.next_paired(round_) if self.periodic else round_ + need
        return SitOut(start, every, round_ + 1)


def takes_part(record: PeerRecord, round_: int) -> bool:
    """Whether ``record``'s peer is in the pairings of ``round_`` (newcomer or sit-out)."""
    return record.active_from <= round_ and SitOut.of(record).takes_part(round_)
