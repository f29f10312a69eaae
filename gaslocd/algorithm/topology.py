"""Who exchanges with whom in round t: a pure function of (topology, roster, round, seed).

Every peer computes the same plan independently from the same sorted roster and the
shared seed, so no message is needed to agree on a round's pairing. The permutation is
drawn from a PRNG seeded by a hash of (seed, round) — never Python's ``hash()``, which is
salted per process, and never the global RNG.

All graphs here are undirected: an edge is one bidirectional exchange on the wire, so
what i receives from j, j also receives from i. With Metropolis weights this makes every
W symmetric and doubly stochastic (property P3: mixing preserves the network mean).

**Peers behind NAT** (``unreachable``: they can dial out but cannot be dialled) are never
paired with each other: an edge needs one end that accepts calls, and that end is dialled
by the other (:func:`dialer`). With every peer reachable the plans are exactly the ones
without the rule. When unreachable peers outnumber reachable ones, the extra ones sit out
the round (self weight 1): which ones changes every round with the shuffle.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from gaslocd.config import TOPOLOGIES


def round_seed(seed: int | str, round_index: int) -> int:
    """A 64-bit seed for ``round_index`` that every process derives identically."""
    digest = hashlib.sha256(f"gaslocd/{seed}/{round_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def roster_digest(roster: Iterable[str]) -> str:
    """Short digest of a roster: exchange requests carry it so a mismatch is visible."""
    return hashlib.sha256("\n".join(sorted(roster)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RoundPlan:
    """The round's graph: each peer's partners (symmetric) on a sorted roster."""

    round: int
    roster: tuple[str, ...]
    partners: Mapping[str, tuple[str, ...]]

    def partners_of(self, peer: str) -> tuple[str, ...]:
        """Peers ``peer`` exchanges with this round (empty: it sits out)."""
        try:
            return self.partners[peer]
        except KeyError:
            raise KeyError(f"{peer!r} is not in this round's roster") from None

    def degree(self, peer: str) -> int:
        return len(self.partners_of(peer))

    def mixing_weights(self, peer: str) -> dict[str, float]:
        """Row ``peer`` of W with Metropolis weights: W_ij = 1 / (1 + max(d_i, d_j)).

        For the regular graphs used here this is the textbook 1/(d+1) — (I+P)/2 for
        1peer, (I+P+Pᵀ)/3 for 2peer, J/n for complete — and it stays doubly stochastic
        when some peers sit out (odd n in 1peer, missing hypercube partners in exp).
        """
        d_i = self.degree(peer)
        row = {j: 1.0 / (1 + max(d_i, self.degree(j))) for j in self.partners_of(peer)}
        row[peer] = 1.0 - sum(row.values())
        return row

    def edges(self) -> list[tuple[str, str]]:
        """Each undirected edge once, as (a, b) with a < b."""
        return [(a, b) for a in self.roster for b in self.partners[a] if a < b]


def dialer(a: str, b: str, unreachable: Collection[str] = ()) -> str:
    """Which of ``a`` and ``b`` places the call of their exchange: the one behind NAT when
    exactly one is (the other cannot be dialled), else the smaller id. Both ends compute
    it from the same roster records, so they never both wait for the other's call."""
    if a == b:
        raise ValueError(f"a peer cannot be its own partner ({a!r})")
    if (a in unreachable) != (b in unreachable):
        return a if a in unreachable else b
    return min(a, b)


def _validated_roster(roster: Sequence[str]) -> tuple[str, ...]:
    ordered = tuple(sorted(roster))
    if len(set(ordered)) != len(ordered):
        raise ValueError("roster contains duplicate peer ids")
    if not ordered:
        raise ValueError("roster is empty")
    return ordered


def _one_peer(order: Sequence[str]) -> dict[str, list[str]]:
    partners: dict[str, list[str]] = {p: [] for p in order}
    for a, b in zip(order[0::2], order[1::2], strict=False):  # odd n: the last one sits out
        partners[a].append(b)
        partners[b].append(a)
    return partners


def _ring(order: Sequence[str]) -> dict[str, list[str]]:
    n = len(order)
    partners: dict[str, list[str]] = {p: [] for p in order}
    for k, p in enumerate(order):
        for q in (order[(k - 1) % n], order[(k + 1) % n]):
            if q != p and q not in partners[p]:  # n = 2: both neighbours are the same peer
                partners[p].append(q)
    return partners


def _one_peer_mixed(order: Sequence[str], unreachable: Collection[str]) -> dict[str, list[str]]:
    """1-peer pairing in which each unreachable peer gets a reachable one: in shuffled
    order, the i-th unreachable pairs with the i-th reachable; the remaining reachable
    ones pair among themselves; unreachable ones beyond the reachable count sit out."""
    shut = [p for p in order if p in unreachable]
    open_ = [p for p in order if p not in unreachable]
    partners = _one_peer(open_[len(shut) :])
    partners.update({p: [] for p in shut[len(open_) :]})
    for a, b in zip(shut, open_, strict=False):
        partners[a], partners[b] = [b], [a]
    return partners


def _ring_mixed(order: Sequence[str], unreachable: Collection[str]) -> dict[str, list[str]]:
    """A ring with no two unreachable peers adjacent: each of the first reachable peers
    (in shuffled order) is followed by one unreachable peer; the extra unreachable ones
    sit out."""
    shut = [p for p in order if p in unreachable]
    open_ = [p for p in order if p not in unreachable]
    cycle: list[str] = []
    for k, p in enumerate(open_):
        cycle.append(p)
        if k < len(shut):
            cycle.append(shut[k])
    partners = _ring(cycle) if len(cycle) > 1 else {p: [] for p in cycle}
    partners.update({p: [] for p in shut[len(open_) :]})
    return partners


def _hypercube(order: Sequence[str], round_index: int) -> dict[str, list[str]]:
    """One-peer exponential graph: in round t, k pairs with k XOR 2^(t mod ⌈log2 n⌉).

    Exact averaging in log2(n) rounds when n is a power of two; otherwise a peer whose
    XOR partner does not exist sits out that round.
    """
    n = len(order)
    partners: dict[str, list[str]] = {p: [] for p in order}
    if n < 2:
        return partners
    hop = 1 << (round_index % math.ceil(math.log2(n)))
    for k, p in enumerate(order):
        j = k ^ hop
        if j < n:
            partners[p].append(order[j])
    return partners


def plan_round(
    topology: str,
    roster: Sequence[str],
    round_index: int,
    seed: int | str,
    unreachable: Collection[str] = (),
) -> RoundPlan:
    """The graph for ``round_index``: identical on every peer that sees the same roster
    (and the same ``unreachable`` peers among it, from their records)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}; got {topology!r}")
    ordered = _validated_roster(roster)
    shut = frozenset(unreachable) & frozenset(ordered)
    if topology in ("1peer", "2peer"):
        order = list(ordered)
        random.Random(round_seed(seed, round_index)).shuffle(order)
        if shut:
            mixed = _one_peer_mixed if topology == "1peer" else _ring_mixed
            partners = mixed(order, shut)
        else:
            partners = _one_peer(order) if topology == "1peer" else _ring(order)
    elif topology == "ring":
        partners = _ring(ordered)
    elif topology == "exp":
        partners = _hypercube(ordered, round_index)
    else:  # complete
        partners = {p: [q for q in ordered if q != p] for p in ordered}
    if shut:  # the fixed graphs: an edge between two unreachable peers is dropped
        partners = {
            p: [q for q in qs if p not in shut or q not in shut] for p, qs in partners.items()
        }
    return RoundPlan(
        round=round_index,
        roster=ordered,
        partners={p: tuple(sorted(qs)) for p, qs in partners.items()},
    )


def mixing_matrix(plan: RoundPlan, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """W as a dense (n, n) matrix in roster order; for analysis and tests."""
    index = {p: k for k, p in enumerate(plan.roster)}
    w = torch.zeros(len(plan.roster), len(plan.roster), dtype=dtype)
    for p in plan.roster:
        for q, weight in plan.mixing_weights(p).items():
            w[index[p], index[q]] = weight
    return w
