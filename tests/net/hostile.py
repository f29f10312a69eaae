"""A hostile peer server for the tests: a real gRPC server that misbehaves on purpose.

It holds a valid key (an insider, or a sybil that captured nothing) and answers:

- ``Exchange`` per ``mode``: ``abort-after-header`` (its header, then an abort: the dialer
  is still writing, which made grpc.aio raise "RPC already finished"),
  ``abort-mid-stream`` (header, two data chunks, abort), ``garbage`` (random bytes),
  ``finish-early`` (header, then a clean end with no data), ``capture`` (records the
  call's metadata and messages, then aborts);
- ``GetState`` with a state whose ``momentum_scale`` or ``round`` a test picks.

Everything it received is kept in :attr:`seen` (metadata and messages), so a test can
check what an honest client gives away.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import torch

from gaslocd.net.auth import AuthFailure, CallAuth, Claim
from gaslocd.net.codecs import chunk_spans, get_codec
from gaslocd.net.frames import frame_data, frame_header, frame_state_header, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Peer"].full_name


class HostilePeer(grpc.GenericRpcHandler):
    def __init__(
        self,
        auth: CallAuth,
        fingerprint: str,
        numel: int,
        chunk_bytes: int,
        mode: Callable[[Claim], str],
        *,
        verify: bool = True,
    ) -> None:
        self.auth = auth
        self.fingerprint = fingerprint
        self.numel = numel
        self.chunk_bytes = chunk_bytes
        self.mode = mode
        self.verify = verify  # False: a sybil that takes any call to capture it
        self.state_round = 5
        self.momentum_scale = 1.0
        self.state_codec = ""  # the codec its state header names (the data stays fp32)
        self.seen: list[bytes] = []
        self.calls: Counter[str] = Counter()  # authenticated calls by method
        self.server: grpc.aio.Server | None = None

    async def start(self) -> str:
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((self,))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        name = str(details.method).rsplit("/", 1)[-1]  # type: ignore[attr-defined]
        metadata = details.invocation_metadata  # type: ignore[attr-defined]
        self.seen.append(repr(metadata).encode())
        try:
            claim = self.auth.verify(metadata, name, open_target=True)
        except AuthFailure:
            if self.verify:
                return None
            claim = Claim("?", "?", "?", name, 0, 0, "")
        else:
            self.calls[name] += 1
        if name == "Exchange":

            async def exchange(_req: object, ctx: grpc.aio.ServicerContext) -> None:
                await self._exchange(claim, ctx)

            return grpc.stream_stream_rpc_method_handler(exchange)
        if name == "GetState":

            async def state(req: bytes, ctx: grpc.aio.ServicerContext) -> None:
                self.seen.append(req)
                await self._state(claim, ctx)

            return grpc.unary_stream_rpc_method_handler(state)
        return None

    def _header(self, round_: int) -> bytes:
        fp32 = get_codec("fp32")
        return frame_header(
            pb.ExchangeHeader(
                run_id=self.auth.run_id,
                round=round_,
                sender=self.auth.my_peer_id,
                fingerprint=self.fingerprint,
                codec="fp32",
                numel=self.numel,
                encoded_nbytes=fp32.encoded_nbytes(self.numel),
                chunk_bytes=self.chunk_bytes,
            )
        )

    def _data(self, scale: float = 1.0) -> list[bytes]:
        raw = (torch.ones(self.numel) * scale).view(torch.uint8).numpy()
        spans = chunk_spans(get_codec("fp32"), self.numel, self.chunk_bytes)
        return [frame_data(raw[b0:b1].tobytes()) for _, _, b0, b1 in spans]

    async def _exchange(self, claim: Claim, ctx: grpc.aio.ServicerContext) -> None:
        mode = self.mode(claim)
        await ctx.send_initial_metadata(self.auth.proof(claim))
        first = await ctx.read()
        if isinstance(first, bytes):
            self.seen.append(first)
            with contextlib.suppress(Exception):  # answer with the caller's sizes
                head = parse_chunk(first).header
                if head is not None and head.numel:
                    self.numel, self.chunk_bytes = head.numel, head.chunk_bytes
        if mode == "capture":
            while isinstance(msg := await ctx.read(), bytes):
                self.seen.append(msg)
            await ctx.abort(grpc.StatusCode.UNAVAILABLE, "captured")
        if mode == "garbage":
            rng = random.Random(claim.round)
            for _ in range(3):
                await ctx.write(rng.randbytes(rng.randint(1, 4096)))
            return
        await ctx.write(self._header(claim.round))
        if mode == "abort-mid-stream":
            for data in self._data()[:2]:
                await ctx.write(data)
        if mode == "finish-early":
            return
        await ctx.abort(grpc.StatusCode.ABORTED, "hostile abort")

    async def _state(self, claim: Claim, ctx: grpc.aio.ServicerContext) -> Any:
        await ctx.send_initial_metadata(self.auth.proof(claim))
        names = ("theta", "outer_momentum")
        header = pb.StateHeader(
            run_id=self.auth.run_id,
            fingerprint=self.fingerprint,
            round=self.state_round,
            data_position=0,
            tensors=[pb.TensorInfo(name=n, numel=self.numel) for n in names],
            chunk_bytes=self.chunk_bytes,
            codec=self.state_codec,
        )
        await ctx.write(frame_state_header(header))
        for msg in [*self._data(), *self._data(self.momentum_scale)]:
            await ctx.write(msg)
