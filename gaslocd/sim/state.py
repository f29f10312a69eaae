"""What a simulated round is made of: its peers, its state as it unfolds, its digest.

Split from :mod:`gaslocd.sim.schedule` (which times and decides the round) so that the
runner, the insider model and the tests share these types without the schedule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gaslocd.algorithm.topology import RoundPlan
from gaslocd.config import SimConfig
from gaslocd.protocol.plan import STATE_FETCH, LinkEstimates, RoundSetup
from gaslocd.protocol.policy import RoundPolicy
from gaslocd.protocol.records import PeerRecord
from gaslocd.sim.clock import EdgeTiming, NetworkModel

ExchangeOk = Callable[[int, str, str], bool]
"""(round, a, b) → False when the a–b exchange breaks (an edge fault), for both ends."""


def worker_roster(workers: int) -> list[str]:
    """The simulated peers' ids, sorted as the roster is."""
    return [f"w{k:03d}" for k in range(workers)]


def network_model(sim: SimConfig, encoded_message_bytes: int) -> NetworkModel:
    """The clock's network for ``sim``: its own message size if set, else the encoded model."""
    return NetworkModel(
        tuple(sim.bandwidth_bytes_per_s(k) for k in range(sim.workers)),
        sim.latency_ms / 1000,
        sim.message_bytes or encoded_message_bytes,
    )


def round_digest(
    inner_steps: Sequence[int], filled_steps: Sequence[int], mixing: Sequence[Sequence[float]]
) -> str:
    """What determines a round's math, hashed: H and filled steps per worker, and W.

    Two runs of the same seed whose rounds all have equal digests trained the same models,
    whatever their clocks said: :mod:`gaslocd.sim.replay` relies on it.
    """
    text = json.dumps([list(inner_steps), list(filled_steps), [list(r) for r in mixing]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class SimPeer:
    """One simulated daemon's protocol state (its model lives in the runner)."""

    peer_id: str
    step_time_s: float
    links: LinkEstimates
    policy: RoundPolicy


@dataclass
class LongEdge:
    """A long exchange (a link too slow for a round, under overlap): its round, its ends,
    the planned weight W_ab, when it ends, and whether the bytes went through. Each end
    mixes it at its first landing after ``end_s``."""

    round: int
    a: int
    b: int
    weight: float
    end_s: float
    moved: bool
    landed: set[int] = field(default_factory=set)  # ends that have mixed it


@dataclass
class RoundState:
    """One round as it unfolds; the schedule fills it in phase by phase."""

    round: int
    setups: list[RoundSetup]
    records: list[PeerRecord]  # the roster as published at the end of round t−1
    arrived_s: list[float]  # when each peer ended round t−1
    start_s: list[float]  # when it started round t (later if it paced)
    planned: list[int]
    filled: list[int]
    opened_s: list[float]  # when each peer opened its exchanges (its steps all done)
    edges: list[EdgeTiming] = field(default_factory=list)
    group: tuple[int, ...] | None = None  # all-reduce members; None: gossip
    exchange_end_s: list[float] = field(default_factory=list)
    refused: set[tuple[int, int]] = field(default_factory=set)  # (receiver, sender)
    counted: list[set[str]] = field(default_factory=list)
    rows: list[dict[str, float]] = field(default_factory=list)
    resyncs: list[tuple[int, int]] = field(default_factory=list)  # (peer, its source)
    failures: dict[str, int] = field(default_factory=dict)  # reason -> failed edges
    ids: tuple[str, ...] = ()  # every simulated peer, sorted (some may sit out)
    paced: list[int] = field(default_factory=list)  # steps trained while pacing (overlap)
    long_edges: list[LongEdge] = field(default_factory=list)  # exchanges landing later

    @property
    def roster(self) -> tuple[str, ...]:
        """Every simulated peer: W's rows and columns (a peer sitting out has row e_i)."""
        return self.ids

    @property
    def plan(self) -> RoundPlan:
        """The round's pairing, which every peer in it computed alike."""
        plan = next((s.plan for s in self.setups if s.plan is not None), None)
        assert plan is not None  # a round where everyone sits out is not simulated
        return plan

    def planned_edges(self) -> list[tuple[str, str]]:
        return self.plan.edges()

    def mixing_matrix(self) -> list[list[float]]:
        """W as applied, n×n over the sorted roster (rows: after failed exchanges)."""
        ids = self.roster
        return [[row.get(q, 0.0) for q in ids] for row in self.rows]

    def digest(self) -> str:
        extra = [
            f + p for f, p in zip(self.filled, self.paced or [0] * len(self.filled), strict=True)
        ]
        return round_digest(self.planned, extra, self.mixing_matrix())


def seed_as_newcomers(peers: Sequence[SimPeer], net: NetworkModel, state_bytes: int) -> None:
    """What a daemon knows before its first round when it joins a running run: its link's
    rate (it fetched the state, ``state_bytes``) and its step time (published by the
    others). Without it, every link's first exchange would go in the best codec whatever
    the link, which only the very first peers of a real run pay."""
    for k, peer in enumerate(peers):
        seconds = net.latency_s + state_bytes / net.bandwidth_bytes_per_s[k]
        peer.links.record_transfer(STATE_FETCH, seconds, state_bytes)
        peer.links.record_step_time(peer.step_time_s)
