"""One direction of a stream, chunk by chunk: encode → frame → write, read → decode → check.

The pipelines overlap the CPU work with the socket: while gRPC writes chunk k, chunk k+1
is being encoded and framed in a worker thread (torch and numpy release the GIL in their
copies and kernels); while the receiver waits for chunk k+1, chunk k is decoded and checked
in a worker thread. At most ``depth`` chunks are in flight per stream on either side,
so memory stays a few chunks, whatever the model size and whatever the peer's speed:
gRPC's HTTP/2 flow control stops ``write`` when the reader does not read, and we do not
read ahead of our decoder.

Memory, per round: fp32 is sent straight from θ̃'s memory (one copy per chunk into the
``bytes`` gRPC needs) and received straight into the output buffer. A lossy codec encodes
each chunk once into one buffer of the *encoded* size that all partners of the round
share (so error feedback advances once per round, not once per partner). With a codec
per partner (:func:`round_messages`) that holds per codec: one message, one buffer and
one error-feedback step for each distinct codec of the round, shared by its partners.

Checks while receiving: each chunk must be exactly the next span both sides computed from
(codec, numel, chunk_bytes); the values must be finite; ‖θ̃_j − θ̃_i‖ accumulates chunk by
chunk and is compared with ``norm_bound · ‖θ̃_i‖`` at the end (and refused early as soon as
the partial sum exceeds it). The output buffer is handed over only after every check.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import TypeVar

import grpc
import numpy as np
import torch

from gaslocd.net.codecs import Codec, ErrorFeedback, FeedbackBank, chunk_spans, get_codec
from gaslocd.net.frames import MalformedMessage, frame_data, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.validation import PeerRefused, Refusal, reason_from_details

Write = Callable[[bytes], Awaitable[None]]
Read = Callable[[], Awaitable[object]]
_T = TypeVar("_T")
# How a call ends when the other side aborted, reset or finished it under us: grpc.aio
# raises any of these from read/write (InvalidStateError: "RPC already finished"). The
# exchange with that peer fails with a counted reason; nothing else does.
PEER_GONE = (
    grpc.aio.AbortError,
    grpc.aio.AioRpcError,
    grpc.aio.UsageError,
    asyncio.InvalidStateError,
)


def _u8(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU float32 tensor as a writable numpy view (no copy)."""
    return t.detach().view(torch.uint8).numpy()


class OutgoingMessage:
    """θ̃ for one round, encoded lazily chunk by chunk and shared by all partner streams."""

    def __init__(
        self,
        theta: torch.Tensor,
        codec: Codec,
        chunk_bytes: int,
        executor: Executor,
        feedback: ErrorFeedback | None = None,
    ) -> None:
        if theta.dtype != torch.float32 or theta.dim() != 1 or not theta.is_contiguous():
            raise ValueError("θ̃ must be a contiguous 1-D float32 CPU tensor")
        if feedback is not None and (
            feedback.codec is not codec or feedback.numel != theta.numel()
        ):
            raise ValueError("error feedback must be for the same codec and size as θ̃")
        self.theta = theta
        self.codec = codec
        self.chunk_bytes = chunk_bytes
        self.numel = theta.numel()
        self.nbytes = codec.encoded_nbytes(self.numel)
        self.spans = chunk_spans(codec, self.numel, chunk_bytes)
        self._executor = executor
        self._feedback = feedback
        self._direct = codec.name == "fp32"  # the wire bytes are θ̃'s own bytes
        self._encoded: np.ndarray | None = None
        self._encoded_t: torch.Tensor | None = None
        self._ready: dict[int, asyncio.Future[None]] = {}

    def _encode(self, k: int) -> None:
        assert self._encoded_t is not None
        e0, e1, b0, b1 = self.spans[k]
        src, out = self.theta[e0:e1], self._encoded_t[b0:b1]
        if self._feedback is not None:
            self._feedback.encode_chunk(src, e0, out)
        else:
            self.codec.encode_into(src, out)

    def _frame(self, k: int) -> bytes:
        _, _, b0, b1 = self.spans[k]
        source = _u8(self.theta) if self._direct else self._encoded
        assert source is not None
        return frame_data(source[b0:b1].data)

    async def framed(self, k: int) -> bytes:
        """Chunk ``k`` as a serialized ``Chunk(data=...)``, encoding it first if needed."""
        loop = asyncio.get_running_loop()
        if not self._direct:
            if self._encoded_t is None:
                self._encoded_t = torch.empty(self.nbytes, dtype=torch.uint8)
                self._encoded = self._encoded_t.numpy()
            if k not in self._ready:
                self._ready[k] = loop.run_in_executor(self._executor, self._encode, k)
            # shield: one partner's cancelled stream must not cancel the shared encoding
            await asyncio.shield(self._ready[k])
        return await loop.run_in_executor(self._executor, self._frame, k)


def round_messages(
    theta: torch.Tensor,
    codec: str | Mapping[str, str],
    partners: Iterable[str],
    chunk_bytes: int,
    executor: Executor,
    feedback: ErrorFeedback | FeedbackBank | None = None,
) -> tuple[OutgoingMessage, dict[str, OutgoingMessage]]:
    """A round's outgoing messages: the main one, and the one for each partner.

    ``codec`` is one name for every partner, or a name per partner id (every partner
    needs one; entries for others are ignored). Partners with the same codec share one
    :class:`OutgoingMessage` (one encoding, one error-feedback step). ``feedback`` is a
    :class:`FeedbackBank` (a residual per codec), or one :class:`ErrorFeedback`, which can
    serve one lossy codec only. The main message is the only one for a single name, else
    the first partner's (an fp32 one, never encoded, when there are no partners).
    """
    if isinstance(codec, str):
        fb = feedback.for_codec(codec) if isinstance(feedback, FeedbackBank) else feedback
        return OutgoingMessage(theta, get_codec(codec), chunk_bytes, executor, fb), {}
    partners = list(partners)
    missing = [p for p in partners if p not in codec]
    if missing:
        raise ValueError(f"no codec for partner(s) {', '.join(map(repr, missing))}")
    shared: dict[str, OutgoingMessage] = {}
    for name in dict.fromkeys(codec[p] for p in partners):
        c = get_codec(name)
        if isinstance(feedback, FeedbackBank):
            fb = feedback.for_codec(c)
        elif feedback is None or c.lossless:
            fb = None
        elif feedback.codec is c:
            fb = feedback
        else:
            raise ValueError(
                f"one ErrorFeedback serves {feedback.codec.name} only, not {name}: "
                "pass a FeedbackBank for a codec per partner"
            )
        shared[name] = OutgoingMessage(theta, c, chunk_bytes, executor, fb)
    by_peer = {p: shared[codec[p]] for p in partners}
    main = next(iter(shared.values()), None)
    if main is None:
        main = OutgoingMessage(theta, get_codec("fp32"), chunk_bytes, executor)
    return main, by_peer


async def send_message(write: Write, header: bytes, message: OutgoingMessage, depth: int) -> int:
    """Write the header and every data chunk; returns the bytes written."""
    await write(header)
    sent = len(header)
    ahead: deque[asyncio.Future[bytes]] = deque()
    upcoming = iter(range(len(message.spans)))
    try:
        for _ in range(len(message.spans)):
            for k in upcoming:
                ahead.append(asyncio.ensure_future(message.framed(k)))
                if len(ahead) >= depth:
                    break
            data = await ahead.popleft()
            await write(data)
            sent += len(data)
    finally:
        for fut in ahead:
            fut.cancel()
        if ahead:
            await asyncio.gather(*ahead, return_exceptions=True)
    return sent


class Receiver:
    """Decodes and checks one incoming θ̃ into ``out``; ``finish`` hands it over."""

    def __init__(
        self,
        codec: Codec,
        out: torch.Tensor,
        chunk_bytes: int,
        executor: Executor,
        depth: int,
        reference: torch.Tensor | None = None,
        max_distance: float = math.inf,
    ) -> None:
        self.codec = codec
        self.out = out
        self.spans = chunk_spans(codec, out.numel(), chunk_bytes)
        self.nbytes = codec.encoded_nbytes(out.numel())
        self.received = 0  # payload bytes accepted so far
        self._executor = executor
        self._depth = depth
        self._reference = reference
        self._max_sq = max_distance**2
        self._sq = 0.0
        self._next = 0
        self._pending: deque[asyncio.Future[float]] = deque()
        self._staging: list[torch.Tensor] = []
        self._out_u8 = _u8(out) if codec.name == "fp32" else None

    @property
    def complete(self) -> bool:
        return self._next == len(self.spans)

    def _decode(self, payload: memoryview, k: int) -> float:
        """Worker thread: decode chunk ``k`` into ``out``; its squared distance (NaN: bad)."""
        e0, e1, b0, b1 = self.spans[k]
        chunk = self.out[e0:e1]
        src = np.frombuffer(payload, dtype=np.uint8)
        if self._out_u8 is not None:
            self._out_u8[b0:b1] = src  # fp32: the wire bytes are the values
        else:
            # Chunk k and k + depth are never in flight together: slot k % depth is free.
            slot = self._staging[k % self._depth]
            slot[: b1 - b0].numpy()[:] = src
            self.codec.decode(slot[: b1 - b0], chunk)
        if self._reference is None:
            return 0.0 if bool(torch.isfinite(chunk).all()) else math.nan
        dist = float(torch.dist(chunk, self._reference[e0:e1]))
        if not math.isfinite(dist) and not bool(torch.isfinite(chunk).all()):
            return math.nan
        return dist * dist  # inf here means finite values too far away: the norm check

    def _account(self, sq: float) -> None:
        if math.isnan(sq):
            raise Refusal("non-finite", "θ̃ contains NaN or infinite values")
        self._sq += sq
        if self._sq > self._max_sq:
            raise Refusal(
                "norm-bound",
                f"‖θ̃_j − θ̃_i‖ ≥ {math.sqrt(self._sq):.4g} > bound {math.sqrt(self._max_sq):.4g}",
            )

    async def add(self, payload: memoryview) -> None:
        """Accept the next data chunk (or refuse it); decoding continues in the background."""
        if self.complete:
            raise Refusal("oversize", f"more than the declared {self.nbytes} bytes")
        _, _, b0, b1 = self.spans[self._next]
        if len(payload) != b1 - b0:
            raise Refusal(
                "chunk-mismatch", f"chunk {self._next}: {len(payload)} != {b1 - b0} bytes"
            )
        if self._out_u8 is None and len(self._staging) < self._depth:
            self._staging.append(torch.empty(self.spans[0][3], dtype=torch.uint8))
        while len(self._pending) >= self._depth:
            self._account(await self._pending.popleft())
        loop = asyncio.get_running_loop()
        self._pending.append(
            loop.run_in_executor(self._executor, self._decode, payload, self._next)
        )
        self._next += 1
        self.received += len(payload)

    async def finish(self) -> torch.Tensor:
        """Wait for the last decodes and run the final checks; the validated ``out``."""
        if not self.complete:
            raise Refusal("truncated", f"stream ended after {self.received} of {self.nbytes} bytes")
        while self._pending:
            self._account(await self._pending.popleft())
        return self.out

    async def close(self) -> None:
        """Wait out decodes still running (threads cannot be cancelled) before ``out`` is reused."""
        while self._pending:
            fut = self._pending.popleft()
            with contextlib.suppress(Exception):  # the stream has already failed for a reason
                await asyncio.shield(fut)


async def receive_data(read: Read, receiver: Receiver) -> torch.Tensor:
    """Read data chunks until the declared size, check it, then require the end of the stream."""
    while not receiver.complete:
        raw = await read()
        if raw is grpc.aio.EOF:
            raise Refusal("truncated", f"stream ended after {receiver.received} bytes")
        await receiver.add(_data_of(raw))
    return await receiver.finish()


async def expect_end(read: Read) -> None:
    """After the declared bytes, the sender must close its side: anything else is refused
    (except the peer's own refusal of our data, raised as :class:`PeerRefused`)."""
    raw = await read()
    if raw is not grpc.aio.EOF:
        _data_of(raw)  # raises PeerRefused for a refusal, Refusal for junk
        raise Refusal("oversize", "data after the declared size")


def _data_of(raw: object) -> memoryview:
    if not isinstance(raw, bytes):
        raise Refusal("malformed", f"unexpected message type {type(raw).__name__}")
    try:
        parsed = parse_chunk(raw)
    except MalformedMessage as exc:
        raise Refusal("malformed", str(exc)) from None
    if parsed.refusal is not None:
        raise refused_by(parsed.refusal)
    if parsed.data is None:
        raise Refusal("unexpected-message", f"a {parsed.kind} where data was expected")
    return parsed.data


def refused_by(refusal: pb.Refusal) -> PeerRefused:
    """The peer's in-band refusal as an exception (an unknown reason becomes "other")."""
    reason = reason_from_details(refusal.reason)
    return PeerRefused(reason, refusal.detail[:200])


async def run_duplex(send: Awaitable[int], receive: Awaitable[_T]) -> tuple[int, _T]:
    """Run both directions at once; the first failure cancels the other and is raised.

    Both tasks are always finished (awaited) before this returns or raises, cancellation
    included, so no task outlives the stream. The receiver's error wins when both fail:
    it names what was wrong with the data, the sender's is usually the echo of it.
    """
    send_task = asyncio.ensure_future(send)
    recv_task = asyncio.ensure_future(receive)
    try:
        await asyncio.wait({send_task, recv_task}, return_when=asyncio.FIRST_EXCEPTION)
        for task in (recv_task, send_task):
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return send_task.result(), recv_task.result()
    finally:
        for task in (send_task, recv_task):
            if not task.done():
                task.cancel()
        await asyncio.gather(send_task, recv_task, return_exceptions=True)
