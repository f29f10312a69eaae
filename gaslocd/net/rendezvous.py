"""The per-round rendezvous: what this peer offers for round r, and who may take it.

The daemon *opens* round r once its θ̃ is ready: the offer holds θ̃ (encoded lazily),
the partners of round r and where each one listens. Of each pair exactly one side dials:
the peer whose id sorts first (:func:`dials`), or, when exactly one of them is behind
NAT, that one (the round's plan says so). A deterministic rule that both sides compute
from the round's roster records means one gRPC call per pair (no duplicate exchange, no
tie-break messages) and nothing to agree on beyond the pairing itself.

An incoming call *claims* its sender's slot in the offer. The claim waits (bounded) for
our round r to open when the caller is ahead of us — it finished its local steps first,
which is the normal case, not an error — and is refused when the round is stale (we have
moved on), too far ahead, closed (we gave up on it), not ours to accept (not a partner,
or a partner we dial ourselves), or already claimed. Refusals *before* the claim never
touch the slot, so a caller without the token or with a wrong round cannot make a real
partner's exchange fail; a failure *after* the claim (bad data) ends that partner's
exchange for the round.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from gaslocd.net.stream import OutgoingMessage
from gaslocd.net.validation import Refusal
from gaslocd.protocol.plan import MAX_LONG_ROUNDS
from gaslocd.protocol.sitout import SitOut

log = logging.getLogger(__name__)
MAX_RATE_HINTS = 1024  # partners whose declared link rate is remembered


def dials(me: str, peer: str) -> bool:
    """Whether ``me`` places the call to ``peer`` by the id rule (the smaller id dials);
    behind NAT the round's plan says otherwise (``RoundSetup.dial``)."""
    if me == peer:
        raise ValueError(f"a peer cannot be its own partner ({me!r})")
    return me < peer


@dataclass(frozen=True)
class ExchangeResult:
    """θ̃_j received from ``peer`` and validated. ``theta`` is ours to keep.

    ``transfer_s`` runs from the peer's header to the last checked chunk (the link's
    transfer time, for the H policy); ``wait_s`` is the time before that (the partner
    still training: idle time). ``unread_s``: how long the peer's data could already flow
    before ``transfer_s`` began: an acceptor that claims a call late (the dialer's data
    follows its header at once) reads the first bytes from buffers, so its
    ``transfer_s`` is too short to measure the link (1.2 s late, a q4 θ̃ over 1 Mbit/s
    "took" 0.026 s: 42 Mbit/s). ``peer_refusal`` is set when the peer refused what *we*
    sent although we received its θ̃ intact (then the exchange is one-sided this round).
    ``codec`` is the codec the peer sent in, ``codec_sent`` the one we sent in: with a
    codec per link the two directions of one exchange may differ.
    """

    peer: str
    theta: torch.Tensor
    codec: str
    role: str  # "dial" or "accept"
    bytes_sent: int
    bytes_received: int
    wait_s: float
    transfer_s: float
    peer_refusal: str | None = None
    codec_sent: str = ""
    ok: bool = True
    unread_s: float = 0.0


@dataclass(frozen=True)
class ExchangeFailure:
    """No usable θ̃_j from ``peer`` this round; ``reason`` is a stable metric label."""

    peer: str
    reason: str
    detail: str
    role: str
    elapsed_s: float = 0.0
    ok: bool = False


Outcome = ExchangeResult | ExchangeFailure


def finished_outcome(peer: str, fut: asyncio.Future[Outcome], deadline_s: float) -> Outcome:
    """What a finished dial or accept gave; never raises (the round goes on regardless)."""
    if fut.cancelled():
        return ExchangeFailure(peer, "deadline", f"no result in {deadline_s} s", "dial")
    exc = fut.exception()
    if exc is not None:  # a bug of ours, not the peer's doing: logged loudly
        log.error("exchange with %s failed unexpectedly", peer, exc_info=exc)
        return ExchangeFailure(peer, "error", repr(exc), "dial")
    return fut.result()


@dataclass
class RoundOffer:
    """What this peer offers in round ``round`` and to whom.

    ``message`` is what every partner gets, unless ``by_peer`` names another message for
    it (a codec per partner, see :func:`~gaslocd.net.stream.round_messages`); all hold
    the same θ̃.
    """

    round: int
    message: OutgoingMessage
    partners: dict[str, str]  # peer id -> "host:port"
    roster_digest: bytes
    reference_norm: float
    buffers: list[torch.Tensor]
    by_peer: dict[str, OutgoingMessage] = field(default_factory=dict)
    outcomes: dict[str, asyncio.Future[Outcome]] = field(default_factory=dict)
    claimed: set[str] = field(default_factory=set)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Future[ExchangeResult]] = field(default_factory=set)  # running accepts
    peer_tasks: dict[str, asyncio.Future[ExchangeResult]] = field(default_factory=dict)
    keep: set[str] = field(default_factory=set)  # long exchanges: closing leaves them running
    # Long exchanges in rounds, as we declare them in our header and as partners declared
    # theirs (capped at MAX_LONG_ROUNDS): either end may see the link as too slow first.
    long_rounds: dict[str, int] = field(default_factory=dict)
    declared_long: dict[str, int] = field(default_factory=dict)
    own_rate: float = 0.0  # our link's rate (bytes/s), declared in our header
    # Partners' declared link rates: the server's one dict, kept across rounds.
    rate_hints: dict[str, float] = field(default_factory=dict)
    opened_at: float = 0.0  # loop time
    dial: frozenset[str] = frozenset()  # the partners we call (the others call us)

    def __post_init__(self) -> None:
        for buf in self.buffers:
            if buf.dtype != torch.float32 or buf.shape != self.theta.shape:
                raise ValueError("receive buffers must be float32 and shaped like θ̃")

    @property
    def theta(self) -> torch.Tensor:
        return self.message.theta

    def message_for(self, peer: str) -> OutgoingMessage:
        """The message ``peer`` gets: its own codec's, or the round's main one."""
        return self.by_peer.get(peer, self.message)

    def take_buffer(self) -> torch.Tensor:
        """A float32 buffer of our own numel for an incoming θ̃ (never a declared size)."""
        if self.buffers:
            return self.buffers.pop()
        return torch.empty(self.message.numel, dtype=torch.float32)

    def declared(self, peer: str, long_rounds: int, rate: float) -> None:
        """Note what ``peer``'s header declared: a long exchange of so many rounds, and
        its link's rate (a partner of ours, authenticated: at worst it lies about its own
        link and gets coarser θ̃ from us)."""
        if long_rounds > 0:
            self.declared_long[peer] = min(long_rounds, MAX_LONG_ROUNDS)
        if rate > 0 and math.isfinite(rate):
            if peer not in self.rate_hints and len(self.rate_hints) >= MAX_RATE_HINTS:
                self.rate_hints.clear()  # peers come and go: forget them all, relearn
            self.rate_hints[peer] = rate

    def resolve(self, peer: str, outcome: Outcome) -> None:
        fut = self.outcomes.get(peer)
        if fut is not None and not fut.done():
            fut.set_result(outcome)

    def max_distance(self, norm_bound: float) -> float:
        return norm_bound * self.reference_norm if self.reference_norm > 0 else math.inf


class RoundBoard:
    """The open offer (one at a time: opening round r+1 closes round r) and its waiters."""

    def __init__(self, me: str, round_lead: int) -> None:
        self.me = me
        self.round_lead = round_lead
        self.offer: RoundOffer | None = None
        # Closed offers that keep long exchanges: their partner may still call (late).
        self.lingering: dict[int, RoundOffer] = {}
        self._changed = asyncio.Event()
        # Set when the daemon is stopping and its time is up: exchanges end as if at their
        # deadline, so the round closes and the checkpoint still fits the stop budget.
        self.cut = asyncio.Event()
        # Our round, offer or not (a round without partners, sitting out, opens none): a
        # caller's "too far ahead" counts from it, not from the last round we offered.
        self.current: int | None = None
        # The sit-out schedule we announced: a caller paired with us in a round it leaves
        # us out of read our record before the announcement, and is told so at once
        # instead of waiting for an offer that will not come (its round is excused). It
        # holds for the rounds after the one that decided it (see sit_out).
        self.sitting_out, self._sit_after = SitOut(), 0
        self.stopping = False  # set by the server's stop: waiting calls are told at once

    def stop(self) -> None:
        """The server stops: a call waiting for a round we will not open is refused now,
        in band, rather than cancelled when the server's grace ends (grpc then logs the
        cancelled handler as an unhandled error, a traceback on every clean stop). The
        open offer closes."""
        self.stopping = True
        if self.offer is not None:
            self.close(self.offer)
        self._changed.set()
        self._changed = asyncio.Event()

    def sit_out(self, schedule: SitOut, decided_in: int) -> None:
        """Our round ``decided_in`` announced ``schedule`` for the rounds after it."""
        self.sitting_out, self._sit_after = schedule, decided_in

    @property
    def latest_round(self) -> int | None:
        return None if self.offer is None else self.offer.round

    def at(self, round_: int) -> None:
        """We are in ``round_`` now (whether or not we open it)."""
        self.current = round_ if self.current is None else max(self.current, round_)

    def open(self, offer: RoundOffer, dial: Collection[str] | None = None) -> None:
        """Publish ``offer``; ``dial``: the partners we call (None: by the id rule; the
        plan's choice when a peer is behind NAT, ``RoundSetup.dial``)."""
        latest = self.latest_round
        if latest is not None and offer.round <= latest:
            raise ValueError(f"round {offer.round} is not after the open round {latest}")
        if self.offer is not None:
            self.close(self.offer)
        by_ids = frozenset(p for p in offer.partners if dials(self.me, p))  # refuses ourselves
        offer.dial = by_ids if dial is None else frozenset(dial) & set(offer.partners)
        for peer in offer.partners:
            offer.outcomes[peer] = asyncio.get_running_loop().create_future()
        self.offer = offer
        self._changed.set()
        self._changed = asyncio.Event()

    def release(self, offer: RoundOffer, peer: str) -> None:
        """A long exchange of ``offer`` is over: its partner may no longer call."""
        offer.keep.discard(peer)
        if not offer.keep and self.lingering.get(offer.round) is offer:
            del self.lingering[offer.round]

    def rewind(self) -> None:
        """Close the open round and forget it, so that the next may have a lower number:
        a peer that ran ahead of the run (alone, while cut off) steps back to the run's
        round. Calls for the rounds in between are refused as before (no offer)."""
        if self.offer is not None:
            self.close(self.offer)
        self.offer = None

    def close(self, offer: RoundOffer) -> None:
        """No new claims; running streams of the round see ``closed`` and stop, except
        the long exchanges the offer keeps (gaslocd.net.flights)."""
        offer.closed.set()
        if offer.keep:
            self.lingering[offer.round] = offer
        kept = {id(offer.peer_tasks[p]) for p in offer.keep if p in offer.peer_tasks}
        for task in offer.tasks:
            if id(task) not in kept:
                task.cancel()
        for peer, fut in offer.outcomes.items():
            if not fut.done() and peer not in offer.keep:
                fut.set_result(ExchangeFailure(peer, "deadline", "round closed", "accept"))

    async def claim(self, round_: int, sender: str, timeout_s: float) -> RoundOffer:
        """Bind an incoming call from ``sender`` to our offer for ``round_`` (or refuse)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.stopping:
                raise Refusal("round-closed", "this peer is stopping")
            offer = self.offer
            kept = self.lingering.get(round_)
            if kept is not None and sender in kept.keep:  # a long exchange's late call
                return self._claim_in(kept, sender, closed_ok=True)
            if offer is not None:
                ours = offer.round if self.current is None else max(offer.round, self.current)
                if round_ < offer.round:
                    raise Refusal("stale-round", f"round {round_} < our round {offer.round}")
                if round_ > ours + self.round_lead:
                    raise Refusal("future-round", f"round {round_} is too far ahead of {ours}")
                if round_ == offer.round:
                    return self._claim_in(offer, sender)
            if round_ > self._sit_after and not self.sitting_out.takes_part(round_):
                until = self.sitting_out.next_paired(round_)
                raise Refusal("sitting-out", f"we sit out of the pairings until round {until}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise Refusal(
                    "timeout", f"our round {round_} did not open within {timeout_s:.3g} s"
                )
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                continue  # re-check, then refuse with "timeout" above

    def _claim_in(self, offer: RoundOffer, sender: str, closed_ok: bool = False) -> RoundOffer:
        if offer.closed.is_set() and not closed_ok:
            raise Refusal("round-closed", f"round {offer.round} is over here")
        if sender not in offer.partners:
            raise Refusal(
                "not-a-partner", f"{sender[:64]!r} is not our partner in round {offer.round}"
            )
        if sender in offer.dial:
            raise Refusal("wrong-direction", f"{self.me!r} dials {sender!r}, not the other way")
        if sender in offer.claimed:
            raise Refusal("duplicate", f"{sender!r} already has a call for round {offer.round}")
        offer.claimed.add(sender)
        return offer


class ReadyBook:
    """Who said it finished its local steps of which round (the ``Ready`` notices).

    Bounded: ``per_round`` senders for ``rounds_kept`` rounds, however many notices
    arrive. Frozensets are replaced whole, so the training thread can read them while
    the loop adds to them.
    """

    def __init__(self, per_round: int = 64, rounds_kept: int = 8) -> None:
        self._per_round = per_round
        self._rounds_kept = rounds_kept
        self._ready: dict[int, frozenset[str]] = {}
        self.finished = -1  # the last round whose local steps we finished (Ready's reply)

    def note(self, round_: int, peer: str) -> None:
        """``peer`` replied to our Ready that it finished ``round_`` too: how a peer behind
        NAT hears it (nobody can call it). Kept as a notice would be, without bounds on
        the round: we asked about our own round."""
        got = self._ready.get(round_, frozenset())
        if len(got) < self._per_round:
            self._ready[round_] = got | {peer}
        while len(self._ready) > self._rounds_kept:
            del self._ready[min(self._ready)]

    def add(self, round_: int, sender: str, latest: int | None, round_lead: int) -> None:
        """Record a notice, or refuse one for a round far from ``latest`` (ours)."""
        if latest is not None and round_ < latest:
            raise Refusal("stale-round", f"round {round_} is before our {latest}")
        if latest is not None and round_ > latest + round_lead + 1:
            raise Refusal("future-round", f"round {round_} is too far ahead of {latest}")
        self.note(round_, sender)

    def all_ready(self, round_: int, partners: Sequence[str]) -> bool:
        got = self._ready.get(round_, frozenset())
        return all(p in got for p in partners)
