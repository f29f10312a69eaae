"""GetState: a newcomer streams θ, the outer momentum, the round and the data position.

The stream is a ``StateHeader`` chunk, then the fp32 bytes of each named tensor in the
header's order, cut into the same block spans as an exchange. State is always fp32: a
newcomer starts from exactly the live peer's state, and this happens once per join, not
every round. The receiver allocates by the sizes *it* expects for its own model (the
fingerprint already matched) and refuses a header whose tensor list differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
import torch

from gaslocd.config import WireConfig
from gaslocd.net.codecs import chunk_spans, get_codec
from gaslocd.net.frames import MalformedMessage, frame_data, frame_state_header, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.stream import Read, Receiver, Write, expect_end, receive_data
from gaslocd.net.validation import Identity, Refusal, check_static

_FP32 = get_codec("fp32")


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


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    if t.dtype != torch.float32 or t.dim() != 1 or not t.is_contiguous():
        raise ValueError("state tensors must be contiguous 1-D float32 CPU tensors")
    return t.detach().view(torch.uint8).numpy()


async def send_state(
    write: Write, state: PeerState, me: Identity, config: WireConfig, executor: Executor
) -> int:
    """Write the header and every tensor's bytes; returns the bytes written."""
    header = pb.StateHeader(
        run_id=me.run_id,
        fingerprint=me.fingerprint,
        round=state.round,
        data_position=state.data_position,
        tensors=[pb.TensorInfo(name=k, numel=v.numel()) for k, v in state.tensors.items()],
        chunk_bytes=config.chunk_bytes,
        extra=state.extra,
        token=config.token.encode(),
    )
    first = frame_state_header(header)
    await write(first)
    sent = len(first)
    loop = asyncio.get_running_loop()
    for tensor in state.tensors.values():
        raw = _bytes_of(tensor)
        for _, _, b0, b1 in chunk_spans(_FP32, tensor.numel(), config.chunk_bytes):
            data = await loop.run_in_executor(executor, frame_data, raw[b0:b1].data)
            await write(data)
            sent += len(data)
    return sent


async def receive_state(
    read: Read,
    expected: Mapping[str, int],
    me: Identity,
    config: WireConfig,
    executor: Executor,
) -> PeerState:
    """Read and check a state stream against the tensor sizes we expect."""
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
    check_static(config, me, header.token, header.run_id, header.fingerprint)
    declared = {t.name: t.numel for t in header.tensors}
    if declared != dict(expected):
        raise Refusal("size-mismatch", f"state has tensors {declared}, we expect {dict(expected)}")
    if not 0 < header.chunk_bytes <= config.max_chunk_bytes:
        raise Refusal("bad-chunk-size", f"chunk_bytes {header.chunk_bytes}")
    tensors: dict[str, torch.Tensor] = {}
    for name, numel in expected.items():
        out = torch.empty(numel, dtype=torch.float32)
        receiver = Receiver(_FP32, out, header.chunk_bytes, executor, config.pipeline_chunks)
        try:
            tensors[name] = await receive_data(read, receiver)
        finally:
            await receiver.close()
    await expect_end(read)
    return PeerState(header.round, header.data_position, tensors, dict(header.extra))
