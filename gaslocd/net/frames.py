"""Framing of the ``Chunk`` messages of ``protos/peer.proto`` without extra copies.

Every message on the Exchange and GetState streams is a serialized ``gaslocd.v1.Chunk``.
Headers go through protobuf as usual. Data chunks are hot (a 256 MiB model is 64–128 of
them per direction), and going through the protobuf classes would copy each payload two
more times (into the message, then into the serialized string). So data chunks are
written by hand as protobuf writes field 2 of type ``bytes`` — tag ``0x12``, a varint
length, the payload — which is byte-for-byte the encoding the generated class produces:
any protobuf client reads them, and anything we cannot parse by the fast path goes
through the real protobuf parser. Nothing is pickled.

gRPC is used with identity (de)serializers for these streams (the handlers get raw
``bytes``) so that a malformed message reaches our code and is refused with
INVALID_ARGUMENT and a counted reason, instead of dying inside gRPC's deserializer.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from gaslocd.net.proto import peer_pb2 as pb

DATA_TAG = 0x12  # (field 2 << 3) | wire type 2 (length-delimited)


class MalformedMessage(ValueError):
    """The bytes are not a ``Chunk`` (a parse error, or an empty oneof)."""


@dataclass(frozen=True)
class Parsed:
    """One parsed message: exactly one field is set."""

    data: memoryview | None = None
    header: pb.ExchangeHeader | None = None
    state_header: pb.StateHeader | None = None
    refusal: pb.Refusal | None = None

    @property
    def kind(self) -> str:
        if self.data is not None:
            return "data"
        if self.header is not None:
            return "header"
        return "state_header" if self.state_header is not None else "refusal"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def data_prefix(payload_nbytes: int) -> bytes:
    """The bytes that precede a data payload: tag and varint length."""
    return bytes((DATA_TAG,)) + _varint(payload_nbytes)


def frame_data(payload: memoryview | bytes) -> bytes:
    """A serialized ``Chunk(data=payload)``; one copy of the payload (gRPC needs ``bytes``)."""
    return b"".join((data_prefix(len(payload)), payload))


def frame_header(header: pb.ExchangeHeader) -> bytes:
    return pb.Chunk(header=header).SerializeToString()


def frame_state_header(header: pb.StateHeader) -> bytes:
    return pb.Chunk(state_header=header).SerializeToString()


def frame_refusal(code: int, reason: str, detail: str) -> bytes:
    return pb.Chunk(refusal=pb.Refusal(code=code, reason=reason, detail=detail)).SerializeToString()


def _fast_data(raw: bytes) -> memoryview | None:
    """The payload of ``raw`` if it is exactly one data field, without copying it."""
    if not raw or raw[0] != DATA_TAG:
        return None
    length, shift, pos = 0, 0, 1
    while pos < len(raw) and pos <= 10:
        byte = raw[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            break
        shift += 7
    else:
        return None
    if pos + length != len(raw):
        return None  # more fields follow (or fewer bytes): let protobuf decide
    return memoryview(raw)[pos:]


def parse_chunk(raw: bytes) -> Parsed:
    """Parse one ``Chunk``; ``MalformedMessage`` if it is not one."""
    fast = _fast_data(raw)
    if fast is not None:
        return Parsed(data=fast)
    try:
        chunk = pb.Chunk.FromString(raw)
    except DecodeError as exc:
        raise MalformedMessage(f"not a Chunk message: {exc}") from None
    which = chunk.WhichOneof("body")
    if which == "data":
        return Parsed(data=memoryview(chunk.data))
    if which == "header":
        return Parsed(header=chunk.header)
    if which == "state_header":
        return Parsed(state_header=chunk.state_header)
    if which == "refusal":
        return Parsed(refusal=chunk.refusal)
    raise MalformedMessage("empty Chunk message (no header and no data)")
