"""A hand-driven Exchange client for the tests: sends exactly the bytes a test wants.

Built on the same framing as the real client, but nothing is checked on the way out, so a
test can send wrong credentials, a lying header, a NaN, too many bytes or garbage. The
call's credentials are those of the header's sender (a test peer key, see ``testkeys``)
for the header's round, unless the test passes its own ``metadata``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import testkeys
import torch
from wire_peer import FINGERPRINT, RUN_ID

from gaslocd.net.auth import Metadata
from gaslocd.net.client import EXCHANGE
from gaslocd.net.codecs import CODEC_NAMES, chunk_spans, get_codec
from gaslocd.net.frames import frame_data, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb


def header(numel: int, chunk_bytes: int, /, **overrides: object) -> pb.ExchangeHeader:
    codec = str(overrides.get("codec", "fp32"))
    fields: dict[str, object] = {
        "run_id": RUN_ID,
        "round": 1,
        "sender": "a-evil",
        "fingerprint": FINGERPRINT,
        "codec": codec,
        "numel": numel,
        "encoded_nbytes": get_codec(codec).encoded_nbytes(numel) if codec in CODEC_NAMES else 0,
        "chunk_bytes": chunk_bytes,
    }
    fields.update(overrides)
    return pb.ExchangeHeader(**fields)  # type: ignore[arg-type]


def data_messages(theta: torch.Tensor, chunk_bytes: int, codec: str = "fp32") -> list[bytes]:
    c = get_codec(codec)
    data = c.encode(theta).numpy()
    return [
        frame_data(data[b0:b1].tobytes())
        for _, _, b0, b1 in chunk_spans(c, theta.numel(), chunk_bytes)
    ]


@dataclass
class RawResult:
    """``code``/``details``: the acceptor's verdict (its in-band refusal if it sent one,
    else the call status). ``status``: the status grpc.aio reported, which a known
    grpc.aio race (grpc/grpc#36066) can turn into INTERNAL when we were still writing."""

    code: grpc.StatusCode
    details: str
    status: grpc.StatusCode
    replies: int  # messages read from the acceptor (its header and data)


async def raw_exchange(
    address: str,
    messages: Sequence[bytes],
    timeout_s: float = 20.0,
    read_delay_s: float = 0.0,
    stop_after_replies: int | None = None,
    hang_after_send: bool = False,
    on_reply: object = None,
    credentials: grpc.ChannelCredentials | None = None,
    target: str = "b-srv",
    metadata: Metadata | None = None,
    gate: asyncio.Event | None = None,
) -> RawResult:
    """Send ``messages`` as one Exchange call and read the replies; the call's status.
    ``gate``: the messages after the first (the header) wait for it to be set."""
    if metadata is None:
        metadata = credentials_for(messages, target)
    opts = [("grpc.max_receive_message_length", 8 << 20)]
    async with (
        grpc.aio.secure_channel(address, credentials, options=opts)
        if credentials is not None
        else grpc.aio.insecure_channel(address, options=opts)
    ) as channel:
        call = channel.stream_stream(EXCHANGE)(timeout=timeout_s, metadata=metadata)

        async def send() -> None:
            for i, m in enumerate(messages):
                if i == 1 and gate is not None:
                    await gate.wait()
                await call.write(m)
            if hang_after_send:
                await asyncio.sleep(3600)  # a peer that stops mid-stream but keeps the socket
            await call.done_writing()

        sender = asyncio.ensure_future(send())
        replies = 0
        read_error: grpc.aio.AioRpcError | None = None
        refusal: pb.Refusal | None = None
        try:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    break
                assert isinstance(msg, bytes)
                parsed = parse_chunk(msg)
                if parsed.refusal is not None:
                    refusal = parsed.refusal
                    continue
                replies += 1
                if callable(on_reply):
                    on_reply(replies)
                if stop_after_replies is not None and replies >= stop_after_replies:
                    call.cancel()
                    break
                if read_delay_s:
                    await asyncio.sleep(read_delay_s)
        except grpc.aio.AioRpcError as err:
            read_error = err
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        status = read_error.code() if read_error is not None else await call.code()
        details = read_error.details() if read_error is not None else await call.details()
        if refusal is not None:
            verdict = f"{refusal.reason}: {refusal.detail}"
            return RawResult(
                grpc.StatusCode(_code_by_value[refusal.code]), verdict, status, replies
            )
        return RawResult(status, details or "", status, replies)


def credentials_for(messages: Sequence[bytes], target: str, token: str = "tok") -> Metadata:
    """Metadata of the first message's sender and round (``a-evil``, round 1 if none)."""
    sender, round_ = "a-evil", 1
    try:
        head = parse_chunk(messages[0]).header if messages else None
    except Exception:
        head = None
    if head is not None and head.sender:
        sender, round_ = head.sender, head.round
    auth = testkeys.auth_for(RUN_ID, sender, token)
    return auth.metadata(target, "Exchange", round_)[0]


_code_by_value = {c.value[0]: c.value for c in grpc.StatusCode}
