"""The calling side: dialing a partner's Exchange, fetching state, asking for status.

One ``grpc.aio`` channel per address, cached (a channel is one HTTP/2 connection; a new
one per round would pay TCP and TLS set-up every round) and closed by :meth:`close`.
Every call carries a deadline. The Exchange and GetState streams use identity
serializers: the messages are ``Chunk`` bytes built and parsed by :mod:`frames`.

Every call carries credentials in its metadata (:mod:`gaslocd.net.auth`); the join token
itself is never sent. Before the dialer writes anything of θ̃ it checks the acceptor's
proof (its initial metadata, signed by the partner's peer key over our fresh nonce), so
a process at a partner's address that does not hold the partner's key learns nothing and
cannot feed us parameters. What the dialer then checks in the reply is what the acceptor
checks in ours (run, round, sender, fingerprint, codec, sizes, finite values, norm bound).
A partner that aborts, resets or finishes the call at any point only fails that exchange.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor

import grpc
import torch

from gaslocd.config import WireConfig
from gaslocd.net.auth import AuthFailure, CallAuth, Claim
from gaslocd.net.frames import MalformedMessage, frame_header, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.rendezvous import ExchangeFailure, ExchangeResult, Outcome, RoundOffer
from gaslocd.net.security import channel_credentials, channel_options
from gaslocd.net.state import MAX_ROUND, PeerState, receive_state, state_nbytes
from gaslocd.net.stream import (
    PEER_GONE,
    Receiver,
    expect_end,
    receive_data,
    refused_by,
    run_duplex,
    send_message,
)
from gaslocd.net.validation import (
    Identity,
    PeerRefused,
    Refusal,
    WireStats,
    check_payload,
    check_static,
    reason_from_details,
)

_PROOF_WAIT_S = 2.0  # for the status of a call that ended without the acceptor's proof
_ADDRESSES_KEPT = 1024

SERVICE = pb.DESCRIPTOR.services_by_name["Peer"].full_name
EXCHANGE = f"/{SERVICE}/Exchange"
GET_STATE = f"/{SERVICE}/GetState"
STATUS = f"/{SERVICE}/Status"
READY = f"/{SERVICE}/Ready"
PROBE = f"/{SERVICE}/Probe"


def failure_from_rpc(
    peer: str, err: grpc.aio.AioRpcError, role: str, elapsed_s: float
) -> ExchangeFailure:
    """Name a failed call: the peer's own refusal reason if it gave one, else the status."""
    reason = reason_from_details(err.details())
    code = err.code()
    if reason != "other":
        label = f"refused:{reason}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        label = "deadline"
    elif code == grpc.StatusCode.INTERNAL and err.details() == "Internal error from Core":
        # grpc.aio's label when the stream broke under a pending write (grpc/grpc#36066):
        # in practice the peer died or reset the connection mid-stream.
        label = "stream-broken"
    else:
        label = code.name.lower() if code is not None else "rpc-error"
    return ExchangeFailure(peer, label, err.details() or "", role, elapsed_s)


def exchange_header(me: Identity, config: WireConfig, offer: RoundOffer, peer: str) -> bytes:
    """Our header to ``peer``: it describes the message that partner gets (its codec)."""
    msg = offer.message_for(peer)
    return frame_header(
        pb.ExchangeHeader(
            run_id=me.run_id,
            round=offer.round,
            sender=me.peer_id,
            roster_digest=offer.roster_digest,
            fingerprint=me.fingerprint,
            codec=msg.codec.name,
            numel=msg.numel,
            encoded_nbytes=msg.nbytes,
            chunk_bytes=msg.chunk_bytes,
            long_rounds=offer.long_rounds.get(peer, 0),
            link_bytes_per_s=int(offer.own_rate),
        )
    )


class PeerClient:
    """Outgoing calls of one peer. Create it inside the event loop; ``await close()``."""

    def __init__(
        self,
        config: WireConfig,
        me: Identity,
        executor: Executor,
        stats: WireStats,
        auth: CallAuth,
    ) -> None:
        self.config = config
        self.me = me
        self.stats = stats
        self.auth = auth
        self._peer_at: dict[str, str] = {}  # address -> peer id, from the rounds' partners
        self._executor = executor
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._credentials = channel_credentials(config)

    def channel(self, address: str) -> grpc.aio.Channel:
        chan = self._channels.get(address)
        if chan is None:
            opts = channel_options(self.config)
            if self._credentials is None:
                chan = grpc.aio.insecure_channel(address, options=opts)
            else:
                chan = grpc.aio.secure_channel(address, self._credentials, options=opts)
            self._channels[address] = chan
        return chan

    def learn_addresses(self, partners: Mapping[str, str]) -> None:
        """Remember who listens where (``Ready`` notices are sent by address)."""
        if len(self._peer_at) > _ADDRESSES_KEPT:
            self._peer_at.clear()
        self._peer_at.update({address: peer for peer, address in partners.items()})

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for chan in channels:
            await chan.close()

    async def dial(self, offer: RoundOffer, peer: str, timeout_s: float) -> Outcome:
        """Exchange θ̃ with ``peer`` for ``offer.round``: both directions on one call."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        metadata, claim = self.auth.metadata(peer, "Exchange", offer.round)
        call = self.channel(offer.partners[peer]).stream_stream(EXCHANGE)(
            timeout=timeout_s, metadata=metadata
        )
        out = offer.take_buffer()
        receiver: Receiver | None = None
        timing: dict[str, float] = {}
        header = exchange_header(self.me, self.config, offer, peer)
        message = offer.message_for(peer)

        async def send() -> int:
            await self._check_acceptor(call, claim)  # before any byte of ours goes out
            sent = await send_message(call.write, header, message, self.config.pipeline_chunks)
            await call.done_writing()
            return sent

        async def receive() -> tuple[int, str | None]:
            nonlocal receiver
            first = await call.read()
            timing["header"] = loop.time()
            receiver = self._check_reply(first, offer, peer, out)
            await receive_data(call.read, receiver)
            timing["done"] = loop.time()
            try:  # the acceptor's verdict on *our* data: it ends the call after checking it
                await expect_end(call.read)
            except PeerRefused as refused:
                return receiver.received, refused.reason
            except grpc.aio.AioRpcError as err:
                return receiver.received, reason_from_details(err.details())
            return receiver.received, None

        done = False
        try:
            sent, (received, refusal) = await run_duplex(send(), receive())
            done = True
        except (Refusal, PeerRefused, AuthFailure, grpc.aio.AioRpcError) as exc:
            return self._failure(peer, exc, loop.time() - start)
        except PEER_GONE as exc:  # e.g. InvalidStateError: the acceptor ended the call
            return await self._gone(peer, call, exc, loop.time() - start)
        finally:
            if receiver is not None:
                await receiver.close()
            if not call.done():
                call.cancel()
            if not done:
                offer.buffers.append(out)  # garbage, but reusable by another partner
        self.stats.bytes_sent += sent
        self.stats.bytes_received += received
        return ExchangeResult(
            peer=peer,
            theta=out,
            codec=receiver.codec.name if receiver is not None else "",
            role="dial",
            bytes_sent=sent,
            bytes_received=received,
            wait_s=timing["header"] - start,
            transfer_s=timing["done"] - timing["header"],
            peer_refusal=refusal,
            codec_sent=message.codec.name,
        )

    def _failure(
        self,
        peer: str,
        exc: Refusal | PeerRefused | AuthFailure | grpc.aio.AioRpcError,
        elapsed_s: float,
    ) -> ExchangeFailure:
        """A dial that ended early, as the failure the round driver logs and counts."""
        if isinstance(exc, AuthFailure):  # the acceptor did not prove it is the partner
            self.stats.refused[exc.reason] += 1
            return ExchangeFailure(peer, f"rejected:{exc.reason}", exc.detail, "dial", elapsed_s)
        if isinstance(exc, Refusal):  # the partner's data failed our checks
            self.stats.rejected[exc.reason] += 1
            return ExchangeFailure(peer, f"rejected:{exc.reason}", exc.detail, "dial", elapsed_s)
        if isinstance(exc, PeerRefused):  # the partner refused our request
            return ExchangeFailure(peer, f"refused:{exc.reason}", exc.detail, "dial", elapsed_s)
        return failure_from_rpc(peer, exc, "dial", elapsed_s)

    async def _gone(
        self, peer: str, call: grpc.aio.Call, exc: BaseException, elapsed_s: float
    ) -> ExchangeFailure:
        """The call ended under us: the acceptor's status names why, if it gave one."""
        if call.done():
            code, details = await call.code(), await call.details()
            if code != grpc.StatusCode.OK:
                err = grpc.aio.AioRpcError(code, None, None, details)
                return failure_from_rpc(peer, err, "dial", elapsed_s)
        return ExchangeFailure(peer, "peer-gone", str(exc) or type(exc).__name__, "dial", elapsed_s)

    async def _check_acceptor(self, call: grpc.aio.Call, claim: Claim) -> None:
        """The acceptor's proof of identity, or the status it ended the call with."""
        metadata = await call.initial_metadata()
        try:
            self.auth.check_proof(metadata, claim)
        except AuthFailure:
            try:  # a refusal comes without a proof: its status is the better reason
                code = await asyncio.wait_for(call.code(), _PROOF_WAIT_S)
            except TimeoutError:
                raise AuthFailure("bad-signature", "the acceptor sent no proof") from None
            if code != grpc.StatusCode.OK:
                details = await call.details()
                raise grpc.aio.AioRpcError(code, metadata, None, details) from None
            raise

    def _check_reply(
        self, first: object, offer: RoundOffer, peer: str, out: torch.Tensor
    ) -> Receiver:
        if not isinstance(first, bytes):
            raise Refusal("truncated", "the acceptor closed the stream before its header")
        try:
            parsed = parse_chunk(first)
        except MalformedMessage as exc:
            raise Refusal("malformed", str(exc)) from None
        if parsed.refusal is not None:
            raise refused_by(parsed.refusal)
        h = parsed.header
        if h is None:
            raise Refusal("unexpected-message", f"a {parsed.kind} where a header was expected")
        check_static(self.me, h.run_id, h.fingerprint)
        if h.sender != peer:
            raise Refusal("wrong-sender", f"expected {peer!r}, the reply is from {h.sender[:64]!r}")
        if h.round != offer.round:
            raise Refusal("stale-round", f"reply for round {h.round}, we are in {offer.round}")
        codec = check_payload(self.config, h, offer.message.numel, offer.roster_digest)
        offer.declared(peer, h.long_rounds, float(h.link_bytes_per_s))
        return Receiver(
            codec,
            out,
            h.chunk_bytes,
            self._executor,
            self.config.pipeline_chunks,
            reference=offer.theta,
            max_distance=offer.max_distance(self.config.norm_bound),
        )

    async def fetch_state(
        self,
        address: str,
        expected: Mapping[str, int],
        timeout_s: float,
        *,
        peer: str,
        max_round: int = MAX_ROUND,
        codec: str = "fp32",
        streams: int = 1,
    ) -> PeerState:
        """Stream the state (θ, outer momentum, ...) sized as ``expected`` of ``peer``,
        asked for in ``codec`` (:data:`~gaslocd.net.state.STATE_CODECS`; it may come as
        fp32: ``PeerState.codec`` says); ``streams``: how many we read at once (the server
        then allows each a share of its minimum rate).

        Raises :class:`Refusal` when the reply fails our checks (sizes, ranges: see
        :mod:`gaslocd.net.state`), :class:`AuthFailure` when the server does not prove it
        is ``peer``, and ``AioRpcError`` when the peer refuses us or cannot be reached.
        Nothing of a refused state is returned.
        """
        request = pb.StateRequest(
            run_id=self.me.run_id,
            sender=self.me.peer_id,
            fingerprint=self.me.fingerprint,
            codec=codec,
            streams=streams,
        )
        metadata, claim = self.auth.metadata(peer, "GetState")
        call = self.channel(address).unary_stream(
            GET_STATE, request_serializer=pb.StateRequest.SerializeToString
        )(request, timeout=timeout_s, metadata=metadata)
        try:
            await self._check_acceptor(call, claim)
            state = await receive_state(
                call.read, expected, self.me, self.config, self._executor, max_round, codec
            )
        except Refusal as exc:
            self.stats.rejected[exc.reason] += 1
            raise
        except AuthFailure as exc:
            self.stats.refused[exc.reason] += 1
            raise
        finally:
            if not call.done():
                call.cancel()
        self.stats.bytes_received += state_nbytes(expected.values(), state.codec)
        return state

    async def notify_ready(self, address: str, round_: int, timeout_s: float) -> bool:
        """Tell a partner we finished our local steps of ``round_`` (see ``Ready``);
        whether it says it finished them too."""
        call = self.channel(address).unary_unary(
            READY,
            request_serializer=pb.ReadyNotice.SerializeToString,
            response_deserializer=pb.ReadyReply.FromString,
        )
        notice = pb.ReadyNotice(run_id=self.me.run_id, round=round_, sender=self.me.peer_id)
        metadata, _ = self.auth.metadata(self._peer_at.get(address, ""), "Ready", round_)
        reply: pb.ReadyReply = await call(notice, timeout=timeout_s, metadata=metadata)
        return reply.ready

    async def status(self, address: str, timeout_s: float) -> pb.StatusReply:
        """The peer's ``StatusReply`` (peer id, run, round, version, free-form fields)."""
        # Not the generated stub: importing peer_pb2_grpc would pull its untyped code into
        # mypy; this is the same call (the tests also drive the server with that stub).
        call = self.channel(address).unary_unary(
            STATUS,
            request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusReply.FromString,
        )
        request = pb.StatusRequest(run_id=self.me.run_id)
        metadata, _ = self.auth.metadata("", "Status")
        reply: pb.StatusReply = await call(request, timeout=timeout_s, metadata=metadata)
        return reply

    async def probe(
        self, address: str, prober: str, grpc_port: int, dht_port: int, timeout_s: float
    ) -> pb.ProbeReply:
        """Ask ``prober`` (at ``address``) to dial us back (see ``gaslocd.net.probe``)."""
        call = self.channel(address).unary_unary(
            PROBE,
            request_serializer=pb.ProbeRequest.SerializeToString,
            response_deserializer=pb.ProbeReply.FromString,
        )
        request = pb.ProbeRequest(
            run_id=self.me.run_id, sender=self.me.peer_id, grpc_port=grpc_port, dht_port=dht_port
        )
        metadata, _ = self.auth.metadata(prober, "Probe")
        reply: pb.ProbeReply = await call(request, timeout=timeout_s, metadata=metadata)
        return reply
