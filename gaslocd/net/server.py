"""``ExchangeServer``: one peer's side of the wire (serves and dials), driven by the daemon.

Lifecycle and contract (all coroutines run on the daemon's event loop; uvloop is the
daemon's choice — install it in the process entry point, not on import)::

    auth = CallAuth(run_id, token, peer_id, private_key, discovery.public_key_of)
    server = ExchangeServer(WireConfig(...), Identity(run_id, peer_id, fp), auth=auth)
    port = await server.start("0.0.0.0", 0)          # bound port; files (TLS) read here
    server.board.at(r)  # every round: ours, then (with partners) open and exchange it
    await server.open_round(r, theta_tilde, {peer_id: "host:port", ...}, codec="bf16",
                            feedback=bank, roster_digest=digest)  # or codec={p: "q4", ...}
    outcomes = await server.exchange_round(r, deadline_s)  # {peer_id: result or failure}
    # .ok → .theta (validated θ̃_p, float32) ...; else .reason ("deadline", "refused:…")
    await server.stop(grace_s)

``open_round`` publishes the offer at once: a partner done first can stream (its call
waits, bounded, until we open). ``exchange_round`` dials the partners we dial
(:func:`~gaslocd.net.rendezvous.dials`), waits for the others' calls, and returns when
each has an outcome or the deadline passed (``board.cut`` ends it sooner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import torch
from grpc.aio import ServicerContext

import gaslocd
from gaslocd.config import WireConfig
from gaslocd.net.auth import CallAuth, Claim
from gaslocd.net.client import SERVICE, PeerClient, exchange_header
from gaslocd.net.codecs import ErrorFeedback, FeedbackBank
from gaslocd.net.flights import Extend, LongFlights, exchange_offer
from gaslocd.net.frames import frame_refusal
from gaslocd.net.gate import CallGate, Limits, Method
from gaslocd.net.probe import DialBack
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.rendezvous import (
    ExchangeFailure,
    ExchangeResult,
    Outcome,
    ReadyBook,
    RoundBoard,
    RoundOffer,
)
from gaslocd.net.security import server_credentials, server_options
from gaslocd.net.state import StateProvider, StateSource, StatusProvider, send_state, state_codec
from gaslocd.net.stream import (
    PEER_GONE,
    Receiver,
    expect_end,
    receive_data,
    round_messages,
    run_duplex,
)
from gaslocd.net.stream import send_message as send_stream
from gaslocd.net.tasks import at_most
from gaslocd.net.threads import wire_executor
from gaslocd.net.validation import (
    Identity,
    Refusal,
    WireStats,
    check_payload,
    check_sender,
    check_static,
    exchange_header_of,
    parse_request,
)

log = logging.getLogger(__name__)


class ExchangeServer:
    """Serves Exchange / GetState / Status / Ready / Probe and dials this peer's partners."""

    def __init__(
        self,
        config: WireConfig,
        me: Identity,
        stats: WireStats | None = None,
        *,
        auth: CallAuth,
        limits: Limits | None = None,
    ) -> None:
        if auth.my_peer_id != me.peer_id or auth.run_id != me.run_id:
            raise ValueError("the call credentials must be for this peer and run")
        self.config, self.me, self.auth = config, me, auth
        self.limits = limits if limits is not None else Limits()
        self.stats = stats if stats is not None else WireStats()
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._client: PeerClient | None = None
        self._board: RoundBoard | None = None
        self._state: StateSource | None = None
        self.status_provider: StatusProvider | None = None  # `gaslocd status`'s fields
        self._ready, self._dial_back = ReadyBook(), DialBack(config, me, auth, self._refuse)
        self._long: dict[int, LongFlights] = {}
        self.rate_hints: dict[str, float] = {}

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and serve; returns the bound port (``port=0`` picks a free one)."""
        # Two threads: one stream's decode and another's encode run at once, each with
        # torch single-threaded (see gaslocd.net.threads for the measurement).
        self._executor = wire_executor(2)
        self._board = RoundBoard(self.me.peer_id, self.config.round_lead)
        self._client = PeerClient(self.config, self.me, self._executor, self.stats, self.auth)
        # No maximum_concurrent_rpcs: gRPC's refusals never reach Python, so they could
        # not be counted. The gate's own limits (per peer, in all, GetState) do that job.
        server = grpc.aio.server(options=server_options(self.config))
        methods = {
            "Exchange": Method(self._exchange, True, True),
            "GetState": Method(self._get_state, False, True),
            "Status": Method(
                self._status, False, False, pb.StatusReply.SerializeToString, False, True
            ),
            "Ready": Method(
                self._ready_notice, False, False, pb.ReadyReply.SerializeToString, True, True
            ),
            "Probe": Method(self._dial_back.handle, False, False, pb.ProbeReply.SerializeToString),
        }
        gate = CallGate(SERVICE, methods, self.auth, self.stats.refused, self.limits)
        server.add_generic_rpc_handlers((gate,))
        creds = server_credentials(self.config)
        where = f"{host}:{port}"
        bound = server.add_secure_port(where, creds) if creds else server.add_insecure_port(where)
        if bound == 0:
            raise OSError(f"could not bind {where}")
        await server.start()
        self._server, self.port = server, bound
        log.info("serving %s on %s:%d (tls=%s)", self.me.peer_id, host, bound, self.config.tls)
        return bound

    @property
    def board(self) -> RoundBoard:
        """The rounds' rendezvous: ``at(t)`` our round, ``cut.set()`` ends exchanges now."""
        if self._board is None:
            raise RuntimeError("call start() first")
        return self._board

    async def stop(self, grace_s: float = 1.0) -> None:
        """Refuse new calls, give running ones ``grace_s``, close channels and threads."""
        if self._board is not None:
            self._board.stop()
        flights = [t for round_ in self._long.values() for t in round_.values()]
        for task in flights:
            task.cancel()
        await asyncio.gather(*flights, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        if self._client is not None:
            await self._client.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def client(self) -> PeerClient:
        """Outgoing calls that are not exchanges: ``fetch_state``, ``status``, ``probe``."""
        if self._client is None:
            raise RuntimeError("call start() first")
        return self._client

    def set_state_provider(self, provider: StateProvider) -> None:
        self._state = StateSource(provider)

    # -- rounds ------------------------------------------------------------------------

    def rewind(self) -> None:
        """Let the next ``open_round`` have a lower round (:meth:`RoundBoard.rewind`)."""
        if self._board is not None:
            self._board.rewind()

    async def open_round(
        self,
        round_: int,
        theta_tilde: torch.Tensor,
        partners: Mapping[str, str],
        *,
        codec: str | Mapping[str, str] = "fp32",
        feedback: ErrorFeedback | FeedbackBank | None = None,
        roster_digest: bytes = b"",
        receive_buffers: Sequence[torch.Tensor] = (),
        long_rounds: Mapping[str, int] | None = None,
        own_rate: float = 0.0,
        dial: Collection[str] | None = None,
    ) -> None:
        """Offer ``theta_tilde`` (flat float32, CPU) for round ``round_`` to ``partners``.

        ``codec``: one name, or one per partner (:func:`~gaslocd.net.stream.round_messages`).
        ``feedback`` (lossy codecs; a :class:`FeedbackBank` for several) advances once per
        round and codec. ``receive_buffers`` (float32, our numel) are reused for incoming
        θ̃; one that ends up in a failed exchange holds garbage. ``long_rounds`` (peer →
        rounds of a long exchange) and ``own_rate`` (our link, bytes/s) go in our headers;
        partners' rates land in :attr:`rate_hints`. ``dial``: the partners we call (None:
        the id rule; the plan's choice behind NAT). Opening a round closes the previous one.
        """
        if self._board is None or self._executor is None:
            raise RuntimeError("call start() first")
        loop = asyncio.get_running_loop()
        message, by_peer = round_messages(
            theta_tilde, codec, partners, self.config.chunk_bytes, self._executor, feedback
        )
        norm = await loop.run_in_executor(self._executor, lambda: float(theta_tilde.norm()))
        offer = RoundOffer(
            round_, message, dict(partners), roster_digest, norm, list(receive_buffers), by_peer
        )
        offer.opened_at = loop.time()
        offer.long_rounds = {p: k for p, k in (long_rounds or {}).items() if p in partners}
        offer.own_rate, offer.rate_hints = own_rate, self.rate_hints
        self._board.open(offer, dial)
        self.client.learn_addresses(partners)

    async def exchange_round(
        self,
        round_: int,
        deadline_s: float,
        long: Mapping[str, float] | None = None,
        extend: Extend | None = None,
        extend_max_s: float = 0.0,
    ) -> dict[str, Outcome]:
        """Exchange with every partner of the open round ``round_``; see the module doc.
        ``long``: partners whose exchange may outlive the round (peer → its deadline, s);
        their outcomes come from :meth:`take_long`, not from here. ``extend``,
        ``extend_max_s``: see :func:`~gaslocd.net.flights.exchange_offer`."""
        board, client = self._board, self._client
        if board is None or client is None or board.offer is None or board.offer.round != round_:
            raise ValueError(f"round {round_} is not open (open_round first)")
        how = (deadline_s, long or {}, self.stats, extend, extend_max_s)
        outcomes, flights = await exchange_offer(board, client, self.me.peer_id, board.offer, *how)
        if flights:
            self._long[round_] = flights
        return outcomes

    def take_long(self, round_: int) -> LongFlights:
        """The long exchanges of ``round_`` (a task per partner, ending with its outcome)."""
        return self._long.pop(round_, {})

    @property
    def ready(self) -> ReadyBook:
        """Who said it finished which round's local steps, and our own (``finished``)."""
        return self._ready

    def partners_ready(self, round_: int, partners: Sequence[str]) -> bool:
        """Whether all ``partners`` said they finished their local steps of ``round_``
        (safe from the training thread: it reads an immutable snapshot)."""
        return self._ready.all_ready(round_, partners)

    # -- handlers ----------------------------------------------------------------------

    async def _ready_notice(
        self, request: bytes, context: ServicerContext, claim: Claim
    ) -> pb.ReadyReply:
        try:
            notice = parse_request(pb.ReadyNotice, request)
            check_sender(notice.sender, claim.sender)
            check_static(self.me, notice.run_id, self.me.fingerprint)
            latest = self._board.latest_round if self._board is not None else None
            self._ready.add(notice.round, notice.sender, latest, self.config.round_lead)
        except Refusal as refusal:
            await self._refuse(context, refusal)
            raise AssertionError("unreachable: abort raises") from None
        return pb.ReadyReply(ready=self._ready.finished >= notice.round)

    async def _exchange(self, _requests: object, context: ServicerContext, claim: Claim) -> None:
        assert self._board is not None
        try:
            raw = await asyncio.wait_for(context.read(), self.config.header_wait_s)
            heard = asyncio.get_running_loop().time()  # the dialer's data follows its header
            header = exchange_header_of(raw)
            check_sender(header.sender, claim.sender)
            if header.round != claim.round:
                raise Refusal("malformed", "the header's round is not the call's")
            check_static(self.me, header.run_id, header.fingerprint)
            offer = await self._board.claim(header.round, header.sender, self.config.accept_wait_s)
        except (Refusal, TimeoutError) as failed:
            refusal = failed if isinstance(failed, Refusal) else Refusal("timeout", "no header")
            await self._refuse(context, refusal, in_band=True)
            return
        sender = header.sender
        work = asyncio.ensure_future(self._accept(offer, header, context, heard))
        offer.tasks.add(work)
        offer.peer_tasks[sender] = work
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:  # the caller went away, or the server stops
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            offer.resolve(sender, ExchangeFailure(sender, "cancelled", "call cancelled", "accept"))
            raise
        if work.cancelled():
            await self._refuse(
                context, Refusal("timeout", f"round {offer.round} closed here"), in_band=True
            )
            return
        exc = work.exception()
        if isinstance(exc, Refusal):
            offer.resolve(
                sender, ExchangeFailure(sender, f"rejected:{exc.reason}", exc.detail, "accept")
            )
            await self._refuse(context, exc, in_band=True)
        elif isinstance(exc, PEER_GONE):
            offer.resolve(sender, ExchangeFailure(sender, "peer-gone", str(exc), "accept"))
        elif exc is not None:
            offer.resolve(sender, ExchangeFailure(sender, "error", repr(exc), "accept"))
            raise exc
        else:
            offer.resolve(sender, work.result())

    async def _accept(
        self, offer: RoundOffer, header: pb.ExchangeHeader, context: ServicerContext, heard: float
    ) -> ExchangeResult:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        codec = check_payload(self.config, header, offer.message.numel, offer.roster_digest)
        offer.declared(header.sender, header.long_rounds, float(header.link_bytes_per_s))
        t_header = loop.time()
        out = offer.take_buffer()
        receiver = Receiver(
            codec,
            out,
            header.chunk_bytes,
            self._executor,
            self.config.pipeline_chunks,
            reference=offer.theta,
            max_distance=offer.max_distance(self.config.norm_bound),
        )
        done: list[float] = []

        async def receive() -> int:
            await receive_data(context.read, receiver)
            done.append(loop.time())
            await expect_end(context.read)
            return receiver.received

        message = offer.message_for(header.sender)
        reply = exchange_header(self.me, self.config, offer, header.sender)
        send = send_stream(context.write, reply, message, self.config.pipeline_chunks)
        try:
            sent, received = await run_duplex(send, receive())
        except BaseException:
            await receiver.close()
            offer.buffers.append(out)
            raise
        self.stats.bytes_sent += sent
        self.stats.bytes_received += received
        return ExchangeResult(
            peer=header.sender,
            theta=out,
            codec=codec.name,
            codec_sent=message.codec.name,
            role="accept",
            bytes_sent=sent,
            bytes_received=received,
            wait_s=max(0.0, t_header - offer.opened_at),
            transfer_s=done[0] - t_header,
            unread_s=t_header - heard,
        )

    async def _get_state(self, request: bytes, context: ServicerContext, claim: Claim) -> None:
        assert self._executor is not None
        try:
            req = parse_request(pb.StateRequest, request)
            check_sender(req.sender, claim.sender)
            check_static(self.me, req.run_id, req.fingerprint)
            codec = state_codec(req.codec)
            if self._state is None:
                raise Refusal("no-state", "this peer has no state to give yet")
        except Refusal as refusal:
            await self._refuse(context, refusal)
            return
        state = await self._state.get(self._board.latest_round if self._board else None)
        try:  # a caller that stops reading holds one of the few GetState slots: bounded
            sent = await send_state(
                context.write, state, self.me, self.config, self._executor, codec, req.streams
            )
        except TimeoutError:  # its status queues behind what it did not read: the slot is freed
            late = Refusal("timeout", "the state was not read in time")
            await at_most(self._refuse(context, late), 1.0)
            return
        self.stats.bytes_sent += sent

    async def _status(
        self, request: bytes, context: ServicerContext, _claim: Claim
    ) -> pb.StatusReply:
        try:
            req = parse_request(pb.StatusRequest, request)
            check_static(self.me, req.run_id, self.me.fingerprint)
        except Refusal as refusal:
            await self._refuse(context, refusal)
            raise AssertionError("unreachable: abort raises") from None
        fields = self.status_provider() if self.status_provider is not None else {}
        latest = self._board.latest_round if self._board is not None else None
        return pb.StatusReply(
            peer_id=self.me.peer_id, run_id=self.me.run_id, round=latest or 0,
            version=gaslocd.__version__, fields={str(k): str(v) for k, v in fields.items()},
        )  # fmt: skip

    async def _refuse(
        self, context: ServicerContext, refusal: Refusal, in_band: bool = False
    ) -> None:
        """Count, tell the caller (in band too on Exchange, see ``Refusal`` in the .proto), end."""
        self.stats.rejected[refusal.reason] += 1
        log.info("refused a call: %s", refusal)
        if in_band:
            # Nothing else of ours is writing on this call any more (run_duplex has
            # finished), so this write cannot interleave with a data chunk.
            with contextlib.suppress(Exception):
                code = refusal.code.value[0]
                await context.write(frame_refusal(code, refusal.reason, refusal.detail))
        await context.abort(refusal.code, refusal.status_details)
