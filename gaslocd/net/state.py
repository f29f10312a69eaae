"""GetState: a newcomer streams θ, the outer momentum, the round and the data position.

The stream is a ``StateHeader`` chunk, then the bytes of each named tensor in the
header's order, cut into the same block spans as an exchange, in the encoding the caller
asked for (:data:`STATE_CODECS`): fp32, the live peer's exact state, or fp16, half the
bytes. A join or resync over a slow link takes as long as its bytes, and the run moves on
meanwhile: a 1 Mbit/s straggler's resync arrived more rounds stale than the norm bound
lets its partners accept, in a fast-moving run, and it was locked out for good. fp16's
rounding (2⁻¹¹ of each value) is far below the spread of honest replicas. A value beyond
fp16's range would arrive infinite: the server then answers in fp32, and the header says
which it sent. The receiver allocates by the sizes *it* expects for its own model (the
fingerprint already matched) and refuses a header whose tensor list differs, or whose
encoding is neither the one asked for nor fp32.

A state is taken whole or not at all: after the bytes arrive, the round must be below
``MAX_ROUND`` (and below a bound the caller knows, if it passes one), every value finite,
θ's RMS at most ``MAX_THETA_RMS`` and ‖m‖ at most ``MAX_MOMENTUM_RATIO`` · ‖θ‖ (the outer
momentum accumulates per-round changes of θ, which are far smaller than θ); otherwise
``Refusal("state-range")`` and nothing is returned. The serving side streams one shared
snapshot per round (:class:`StateSource`), however many newcomers ask at once.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
import torch

from gaslocd.config import WireConfig
from gaslocd.net.codecs import Codec, chunk_spans, get_codec
from gaslocd.net.frames import MalformedMessage, frame_data, frame_state_header, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.stream import Read, Receiver, Write, expect_end, receive_data
from gaslocd.net.validation import Identity, Refusal, check_static

_FP32 = get_codec("fp32")
STATE_CODECS = ("fp32", "fp16")  # exact, or half the bytes (never a blockwise codec)
_FP16_MAX = float(torch.finfo(torch.float16).max)
MAX_ROUND = 2**31  # 68 years at one round a second
MAX_THETA_RMS = 1e3  # an LM's weights have an RMS of order 0.01-1
MAX_MOMENTUM_RATIO = 10.0
# The slowest a state may stream and still be waited for (bytes/s, 131 kbit/s). A state is
# 8 bytes per parameter in fp32 (4 in fp16): 4.4 GB at 551M, 6 min at 100 Mbit/s.
# Bounding the whole stream by a fixed time (60 s at the server, 120 s at the client)
# refused every newcomer on a link slower than ~600 Mbit/s at that size, and, on a
# 0.28 Mbit/s straggler, the tiny model's 2 MB; so both bounds grow with the state's size
# at this rate. A reader that stops reading is found by the bound on each chunk, not the
# whole stream's (which, at this rate, lasts days at 551M): it would hold one of the few
# GetState slots.
STATE_MIN_RATE = 16 * 1024


# A caller that reads this many states at once (a join's cross-check: two) shares its
# link between them, and each stream may go at that share of STATE_MIN_RATE: two over a
# 224 kbit/s link read 14 kB/s each, and every straggler's join there timed out. More
# streams do not count: a caller claiming them only slows the bound on its slot.
MAX_STATE_STREAMS = 2


def state_read_s(nbytes: int, floor_s: float, streams: int = 1) -> float:
    """How long ``nbytes`` of state may take to stream, one of ``streams`` read at once
    over the reader's link (a StateRequest's 0, an older caller: one): ``floor_s`` at
    least."""
    return max(floor_s, nbytes * min(max(streams, 1), MAX_STATE_STREAMS) / STATE_MIN_RATE)


@dataclass(frozen=True)
class PeerState:
    """A live peer's state. ``tensors`` are flat float32 (e.g. ``theta``, ``outer_momentum``).

    A state provider must return tensors that do not change while they are streamed (a
    snapshot: the training thread keeps going meanwhile).
    """

    round: int
    data_position: int
    tensors: dict[str, torch.Tensor]
    extra: dict[str, str] = field(default_factory=dict)
    codec: str = "fp32"  # how it came over the wire (received states)


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    if t.dtype != torch.float32 or t.dim() != 1 or not t.is_contiguous():
        raise ValueError("state tensors must be contiguous 1-D float32 CPU tensors")
    return t.detach().view(torch.uint8).numpy()


def state_nbytes(numels: Iterable[int], codec: str = "fp32") -> int:
    """The bytes of a state whose tensors have these sizes, in ``codec`` on the wire."""
    return get_codec(codec).encoded_nbytes(sum(numels))


def state_codec(asked: str) -> str:
    """The encoding a ``StateRequest`` asks for (empty: an older caller, fp32); a
    ``Refusal`` for any other."""
    codec = asked or "fp32"
    if codec not in STATE_CODECS:
        raise Refusal("unknown-codec", f"a state is sent in {' or '.join(STATE_CODECS)}")
    return codec


def fits_codec(state: PeerState, codec: str) -> bool:
    """Whether every value of ``state`` survives ``codec`` finite (fp16: |x| ≤ 65504)."""
    if codec != "fp16":
        return True
    return all(float(t.abs().max()) <= _FP16_MAX for t in state.tensors.values() if t.numel())


async def send_state(
    write: Write,
    state: PeerState,
    me: Identity,
    config: WireConfig,
    executor: Executor,
    codec_name: str = "fp32",
    streams: int = 1,
) -> int:
    """Write the header and every tensor's bytes in ``codec_name`` (:data:`STATE_CODECS`;
    fp32 instead when a value would not survive it); returns the bytes written. Raises
    ``TimeoutError`` when the reader is slower than :data:`STATE_MIN_RATE` (its share,
    one of ``streams``): over the whole state, or for one chunk (``config.accept_wait_s``
    at least, either way)."""
    stall_s = state_read_s(config.chunk_bytes, config.accept_wait_s, streams)
    loop = asyncio.get_running_loop()
    if not await loop.run_in_executor(executor, fits_codec, state, codec_name):
        codec_name = "fp32"
    codec = get_codec(codec_name)

    async def bounded(data: bytes) -> None:
        async with asyncio.timeout(stall_s):
            await write(data)

    header = pb.StateHeader(
        run_id=me.run_id,
        fingerprint=me.fingerprint,
        round=state.round,
        data_position=state.data_position,
        tensors=[pb.TensorInfo(name=k, numel=v.numel()) for k, v in state.tensors.items()],
        chunk_bytes=config.chunk_bytes,
        extra=state.extra,
        codec=codec.name,
    )
    nbytes = state_nbytes((t.numel() for t in state.tensors.values()), codec.name)
    async with asyncio.timeout(state_read_s(nbytes, config.accept_wait_s, streams)):
        first = frame_state_header(header)
        await bounded(first)
        sent = len(first)
        for tensor in state.tensors.values():
            raw = _bytes_of(tensor)
            for e0, e1, b0, b1 in chunk_spans(codec, tensor.numel(), config.chunk_bytes):
                if codec is _FP32:  # the values are the wire bytes: no copy
                    data = await loop.run_in_executor(executor, frame_data, raw[b0:b1].data)
                else:
                    data = await loop.run_in_executor(executor, _framed, codec, tensor[e0:e1])
                await bounded(data)
                sent += len(data)
        return sent


def _framed(codec: Codec, values: torch.Tensor) -> bytes:
    return frame_data(codec.encode(values).numpy().data)


async def receive_state(
    read: Read,
    expected: Mapping[str, int],
    me: Identity,
    config: WireConfig,
    executor: Executor,
    max_round: int = MAX_ROUND,
    asked: str = "fp32",
) -> PeerState:
    """Read and check a state stream against the tensor sizes and ranges we expect, in
    the encoding we ``asked`` for or fp32 (which a server may always answer in)."""
    raw = await read()
    if not isinstance(raw, bytes):
        raise Refusal("truncated", "the state stream ended before its header")
    try:
        parsed = parse_chunk(raw)
    except MalformedMessage as exc:
        raise Refusal("malformed", str(exc)) from None
    header = parsed.state_header
    if header is None:
        raise Refusal("unexpected-message", f"a {parsed.kind} where a state header was expected")
    check_static(me, header.run_id, header.fingerprint)
    if header.round >= min(max_round, MAX_ROUND):
        raise Refusal("state-range", f"round {header.round} is beyond {min(max_round, MAX_ROUND)}")
    declared = {t.name: t.numel for t in header.tensors}
    if declared != dict(expected):
        raise Refusal("size-mismatch", f"state has tensors {declared}, we expect {dict(expected)}")
    if not 0 < header.chunk_bytes <= config.max_chunk_bytes:
        raise Refusal("bad-chunk-size", f"chunk_bytes {header.chunk_bytes}")
    sent_as = header.codec or "fp32"
    if sent_as not in {asked, "fp32"}:
        raise Refusal("unknown-codec", f"state sent in {sent_as[:32]!r}; we asked for {asked}")
    codec = get_codec(sent_as)
    tensors: dict[str, torch.Tensor] = {}
    for name, numel in expected.items():
        out = torch.empty(numel, dtype=torch.float32)
        receiver = Receiver(codec, out, header.chunk_bytes, executor, config.pipeline_chunks)
        try:
            tensors[name] = await receive_data(read, receiver)
        finally:
            await receiver.close()
    await expect_end(read)
    await asyncio.get_running_loop().run_in_executor(executor, check_ranges, tensors)
    return PeerState(header.round, header.data_position, tensors, dict(header.extra), sent_as)


def check_ranges(tensors: Mapping[str, torch.Tensor]) -> None:
    """θ and m finite and of a sane size (see the module doc); ``Refusal`` otherwise."""
    norms = {name: float(t.double().norm()) for name, t in tensors.items()}
    for name, norm in norms.items():
        if not math.isfinite(norm):
            raise Refusal("non-finite", f"state tensor {name} has NaN, infinite or huge values")
    theta, numel = norms.get("theta"), tensors["theta"].numel() if "theta" in tensors else 0
    if theta is None:
        return
    if numel and theta / math.sqrt(numel) > MAX_THETA_RMS:
        raise Refusal("state-range", f"θ has RMS {theta / math.sqrt(numel):.3g}")
    momentum = norms.get("outer_momentum", 0.0)
    if momentum > MAX_MOMENTUM_RATIO * theta:
        raise Refusal("state-range", f"‖m‖ = {momentum:.3g} is over 10 · ‖θ‖ = {theta:.3g}")


StateProvider = Callable[[], PeerState | Awaitable[PeerState]]
StatusProvider = Callable[[], Mapping[str, object]]  # extra fields of a Status reply


class StateSource:
    """One snapshot of our state per round, shared by every concurrent GetState.

    A provider copies θ and m (a snapshot, the training thread goes on); without this each
    caller made its own copy, so 64 unread fetches held 64 copies. The snapshot is taken
    on the first request of a round and dropped when the round changes.
    """

    def __init__(self, provider: StateProvider) -> None:
        self._provider = provider
        self._cached: tuple[int | None, asyncio.Future[PeerState]] | None = None

    async def get(self, round_: int | None) -> PeerState:
        if self._cached is None or self._cached[0] != round_ or self._failed():
            fut = asyncio.ensure_future(self._take())
            self._cached = (round_, fut)
        return await asyncio.shield(self._cached[1])

    def _failed(self) -> bool:
        fut = self._cached[1] if self._cached is not None else None
        return fut is not None and fut.done() and (fut.cancelled() or fut.exception() is not None)

    async def _take(self) -> PeerState:
        state = self._provider()
        if inspect.isawaitable(state):
            state = await state
        return state
