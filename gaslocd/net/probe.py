"""Whether others can dial this peer: a dial-back probe through a live peer (``Probe``).

A peer behind NAT (a home router, a cloud NAT) cannot accept calls, and it cannot tell
that from inside: its own addresses look fine. So a newcomer with ``--reachable auto``
asks live peers to dial it back. The callee dials **only the address the call came
from** (the one a NAT rewrote it to), never one the caller names: otherwise any insider
could make every daemon of the run scan a third party's ports. It checks two things:

- the gRPC port: a ``Status`` call, which must answer with the caller's own peer id and
  run id (something else listening there does not count);
- the DHT port: a TCP connect (the libp2p handshake is the DHT process's, not ours).

The caller decides from the answers (:func:`verdict`): one "yes" is proof; "no" needs
every answer to say so. What a lying prober can do is limited to that one newcomer's
choice between dialling out only and accepting calls, which it could as well get wrong
by itself. A prober runs at most :data:`MAX_PROBES` dial-backs at once and one per caller,
each bounded by :data:`DIAL_BACK_S`; a dial-back's channel is closed after it (a caller
naming many ports makes no channel that outlives its call).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

import grpc

from gaslocd.config import WireConfig
from gaslocd.net.auth import CallAuth, Claim
from gaslocd.net.client import STATUS
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.security import channel_credentials, channel_options
from gaslocd.net.validation import Identity, Refusal, check_sender, check_static, parse_request

if TYPE_CHECKING:
    from hivemind import DHT
    from hivemind.dht.node import DHTNode

log = logging.getLogger(__name__)

MAX_PROBES = 4  # dial-backs in flight at once (each one is a Status call and a connect)
DIAL_BACK_S = 3.0  # a reachable peer answers a Status call on any link within this

Refuse = Callable[[grpc.aio.ServicerContext, Refusal], Awaitable[None]]


@dataclass(frozen=True)
class Reach:
    """What the probes said: can others dial our gRPC port, and our DHT port."""

    grpc: bool
    dht: bool


def verdict(answers: Sequence[pb.ProbeReply]) -> Reach | None:
    """One "yes" proves a port open (the prober reached our own server there); it is
    closed only if every answer says so. ``None``: nobody answered, nothing is known."""
    if not answers:
        return None
    return Reach(
        grpc=any(a.grpc_reachable for a in answers), dht=any(a.dht_reachable for a in answers)
    )


def observed_host(peer: str) -> str | None:
    """The IP address in gRPC's ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``,
    sometimes percent-encoded); ``None`` for anything else (a unix socket)."""
    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host = rest.rsplit(":", 1)[0].strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _joined(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class DialBack:
    """The callee's side of ``Probe``: dial the caller back where its call came from."""

    def __init__(self, config: WireConfig, me: Identity, auth: CallAuth, refuse: Refuse) -> None:
        self._config = config
        self._me = me
        self._auth = auth
        self._refuse = refuse
        self._callers: set[str] = set()  # callers whose dial-back is in flight

    async def handle(
        self, request: bytes, context: grpc.aio.ServicerContext, claim: Claim
    ) -> pb.ProbeReply:
        try:
            req = parse_request(pb.ProbeRequest, request)
            check_sender(req.sender, claim.sender)
            check_static(self._me, req.run_id, self._me.fingerprint)
            host = observed_host(context.peer())
            if host is None or not 0 < req.grpc_port < 65536 or req.dht_port > 65535:
                raise Refusal("malformed", "a probe needs an IP caller and ports in range")
            if claim.sender in self._callers or len(self._callers) >= MAX_PROBES:
                raise Refusal("probe-busy", "too many dial-backs in flight; ask again later")
        except Refusal as refusal:
            await self._refuse(context, refusal)
            raise AssertionError("unreachable: abort raises") from None
        self._callers.add(claim.sender)
        try:
            grpc_ok, dht_ok = await asyncio.gather(
                self._status_answers(_joined(host, req.grpc_port), claim.sender),
                self._connects(host, req.dht_port),
            )
        finally:
            self._callers.discard(claim.sender)
        log.info("probe for %s at %s: grpc %s dht %s", claim.sender, host, grpc_ok, dht_ok)
        return pb.ProbeReply(grpc_reachable=grpc_ok, dht_reachable=dht_ok, observed_host=host)

    async def _status_answers(self, address: str, sender: str) -> bool:
        """Whether the caller's own server answers ``Status`` at ``address``."""
        creds, opts = channel_credentials(self._config), channel_options(self._config)
        channel = (
            grpc.aio.insecure_channel(address, options=opts)
            if creds is None
            else grpc.aio.secure_channel(address, creds, options=opts)
        )
        try:
            call = channel.unary_unary(
                STATUS,
                request_serializer=pb.StatusRequest.SerializeToString,
                response_deserializer=pb.StatusReply.FromString,
            )
            metadata, _ = self._auth.metadata("", "Status")
            reply = await call(
                pb.StatusRequest(run_id=self._me.run_id), timeout=DIAL_BACK_S, metadata=metadata
            )
            return bool(reply.peer_id == sender and reply.run_id == self._me.run_id)
        except Exception as exc:  # refused, timed out, not gRPC at all: not reachable
            log.debug("dial-back to %s failed: %s", address, exc)
            return False
        finally:
            await channel.close()

    @staticmethod
    async def _connects(host: str, port: int) -> bool:
        if port == 0:
            return False
        try:
            async with asyncio.timeout(DIAL_BACK_S):
                _reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return True


async def _serve(_dht: DHT, node: DHTNode) -> bool:
    """Runs inside the DHT process: a node started in client mode (hivemind fixes that at
    start-up) begins serving DHT calls and announces itself, as a server does when it
    starts. Only this direction is safe in place: nodes that already route to a server
    would keep returning it to its own lookups after it stopped serving."""
    from hivemind.proto import dht_pb2
    from hivemind.utils.auth import AuthRole, AuthRPCWrapper

    protocol = node.protocol
    if protocol.client_mode:
        servicer = AuthRPCWrapper(protocol, AuthRole.SERVICER, protocol.authorizer)
        await protocol.add_p2p_handlers(protocol.p2p, servicer)
        protocol.node_info = dht_pb2.NodeInfo(node_id=node.node_id.to_bytes())
        protocol.client_mode = False
        with contextlib.suppress(TimeoutError):  # our requests now carry our node info
            await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), timeout=5.0)
    return not protocol.client_mode


async def become_dht_server(dht: DHT, timeout_s: float = 10.0) -> bool:
    """Turn a DHT node started as a client into a server (a joiner found dialable). In
    place, because starting a new DHT process would fork one that already runs gRPC."""
    future = dht.run_coroutine(_serve, return_future=True)
    return bool(await asyncio.wait_for(future, timeout_s))
