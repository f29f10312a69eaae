"""The server's front door: every call is authenticated and admitted here, or refused.

gRPC asks :meth:`CallGate.service` for a handler as soon as a call's metadata arrives,
before any message is read. An unauthenticated call (see :mod:`gaslocd.net.auth`) gets a
handler that ends it at once with its status: it holds no slot, and nothing it sends is
read (the refusal handler is a streaming one, so gRPC does not even wait for a unary
request). An authenticated call runs under per-caller limits: at most
``calls_per_peer`` calls of one peer id at a time, ``calls_total`` calls in all and
``state_fetches`` concurrent ``GetState`` streams. Every refusal here is counted by
reason in ``WireStats.refused`` (``gasloc_calls_refused_total``): gRPC's own
``maximum_concurrent_rpcs`` is not used, because its RESOURCE_EXHAUSTED answers never
reach Python and so could not be counted.

A handler gets ``(request, context, claim)``: ``claim.sender`` is the authenticated peer
id, which every message's own ``sender`` field must then match.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from gaslocd.net.auth import AuthFailure, CallAuth, Claim
from gaslocd.net.frames import frame_refusal

log = logging.getLogger(__name__)

Behaviour = Callable[[Any, grpc.aio.ServicerContext, Claim], Awaitable[Any]]


@dataclass(frozen=True)
class Method:
    """One RPC: its behaviour and shape, and whether a peer signature is required."""

    behaviour: Behaviour
    request_streaming: bool
    response_streaming: bool
    response_serializer: Callable[[Any], bytes] | None = None
    signed: bool = True
    open_target: bool = False


@dataclass(frozen=True)
class Limits:
    calls_per_peer: int = 8  # an exchange or two, a Ready, a GetState: 8 leaves room
    calls_total: int = 64
    state_fetches: int = 2  # each streams θ and m: a few at a time is plenty for joins


class CallGate(grpc.GenericRpcHandler):
    """Authenticates, limits and counts every incoming call of one service."""

    def __init__(
        self,
        service: str,
        methods: Mapping[str, Method],
        auth: CallAuth,
        refused: Counter[str],
        limits: Limits = Limits(),
    ) -> None:
        self._prefix = f"/{service}/"
        self._methods = dict(methods)
        self._auth = auth
        self._refused = refused
        self._limits = limits
        self._per_peer: Counter[str] = Counter()
        self._total = 0
        self._states = 0

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = str(details.method)
        name = path[len(self._prefix) :] if path.startswith(self._prefix) else ""
        method = self._methods.get(name)
        if method is None:
            return None  # gRPC answers UNIMPLEMENTED
        try:
            claim = self._auth.verify(
                details.invocation_metadata,
                name,
                signed=method.signed,
                open_target=method.open_target,
            )
        except AuthFailure as failure:
            return self._refusal(failure.reason, failure.code, str(failure), name == "Exchange")
        return self._admitted(name, method, claim)

    def _refusal(
        self, reason: str, code: grpc.StatusCode, details: str, in_band: bool
    ) -> grpc.RpcMethodHandler:
        self._refused[reason] += 1
        log.info("refused a call: %s", details)

        async def refuse(_requests: object, context: grpc.aio.ServicerContext) -> None:
            if in_band:  # see Refusal in peer.proto: a writing caller may lose the status
                with contextlib.suppress(Exception):
                    await context.write(frame_refusal(code.value[0], reason, details))
            await context.abort(code, details)

        return grpc.stream_stream_rpc_method_handler(refuse)

    def _admitted(self, name: str, method: Method, claim: Claim) -> grpc.RpcMethodHandler:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with self._slot(name, claim.sender) as refusal:
                if refusal is not None:
                    self._refused[refusal] += 1
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED, f"{refusal}: too many calls"
                    )
                with contextlib.suppress(Exception):  # the caller may be gone already
                    await context.send_initial_metadata(self._auth.proof(claim))
                return await method.behaviour(request, context, claim)

        if method.request_streaming and method.response_streaming:
            return grpc.stream_stream_rpc_method_handler(run)
        if method.response_streaming:
            return grpc.unary_stream_rpc_method_handler(run)
        return grpc.unary_unary_rpc_method_handler(
            run, response_serializer=method.response_serializer
        )

    @contextlib.contextmanager
    def _slot(self, name: str, peer: str) -> Any:
        """Hold a slot for the call's duration; yields the refusal reason if none is free."""
        lim = self._limits
        if self._per_peer[peer] >= lim.calls_per_peer:
            yield "busy-peer"
            return
        if self._total >= lim.calls_total:
            yield "busy"
            return
        state = name == "GetState"
        if state and self._states >= lim.state_fetches:
            yield "busy-state"
            return
        self._per_peer[peer] += 1
        self._total += 1
        self._states += state
        try:
            yield None
        finally:
            self._per_peer[peer] -= 1
            if self._per_peer[peer] <= 0:
                del self._per_peer[peer]
            self._total -= 1
            self._states -= state
