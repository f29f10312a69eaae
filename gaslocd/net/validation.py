"""Checks on incoming messages, the refusal they raise, and the counts they leave.

Every refusal is a :class:`Refusal`: a stable short *reason* (a metric label), the gRPC
status code the refusing side answers with, and a human detail. The status details
string is ``"<reason>: <detail>"`` so the other side can count the reason too.

Before any message is read, the call itself was authenticated from its metadata
(:mod:`gaslocd.net.auth`: run credential, sender's signature, freshness), so a caller
without the run's secret learns nothing, not even whether the run id or round was right.
The order of the message checks: the sender field against the authenticated caller,
what is static for the run (run id, fingerprint), then the round and partner (done by the
rendezvous, which may wait for our round to open), then the payload description (codec,
sizes, chunking). Sizes are compared with what *we* know (our own numel): nothing is ever
allocated from a size the peer declares.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from gaslocd.config import WireConfig
from gaslocd.net.auth import REFUSAL_REASONS
from gaslocd.net.codecs import CODEC_NAMES, Codec, get_codec
from gaslocd.net.frames import MalformedMessage, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb

_CODES: dict[str, grpc.StatusCode] = {
    "wrong-run": grpc.StatusCode.FAILED_PRECONDITION,
    "fingerprint": grpc.StatusCode.FAILED_PRECONDITION,
    "stale-round": grpc.StatusCode.FAILED_PRECONDITION,
    "future-round": grpc.StatusCode.FAILED_PRECONDITION,
    "round-closed": grpc.StatusCode.FAILED_PRECONDITION,
    "not-a-partner": grpc.StatusCode.FAILED_PRECONDITION,
    "wrong-direction": grpc.StatusCode.FAILED_PRECONDITION,
    "sitting-out": grpc.StatusCode.FAILED_PRECONDITION,
    "roster-mismatch": grpc.StatusCode.FAILED_PRECONDITION,
    "wrong-sender": grpc.StatusCode.FAILED_PRECONDITION,
    "codec-not-allowed": grpc.StatusCode.FAILED_PRECONDITION,
    "duplicate": grpc.StatusCode.ALREADY_EXISTS,
    "unknown-codec": grpc.StatusCode.INVALID_ARGUMENT,
    "size-mismatch": grpc.StatusCode.INVALID_ARGUMENT,
    "bad-chunk-size": grpc.StatusCode.INVALID_ARGUMENT,
    "chunk-mismatch": grpc.StatusCode.INVALID_ARGUMENT,
    "oversize": grpc.StatusCode.INVALID_ARGUMENT,
    "truncated": grpc.StatusCode.INVALID_ARGUMENT,
    "malformed": grpc.StatusCode.INVALID_ARGUMENT,
    "unexpected-message": grpc.StatusCode.INVALID_ARGUMENT,
    "non-finite": grpc.StatusCode.INVALID_ARGUMENT,
    "norm-bound": grpc.StatusCode.INVALID_ARGUMENT,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "no-state": grpc.StatusCode.UNAVAILABLE,
    "state-range": grpc.StatusCode.INVALID_ARGUMENT,
    "probe-busy": grpc.StatusCode.RESOURCE_EXHAUSTED,
}
REASONS = tuple(_CODES)
M = TypeVar("M", bound=Message)


class Refusal(Exception):
    """An incoming message is refused; nothing it carried reaches the model."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in _CODES:
            raise ValueError(f"unknown refusal reason {reason!r}")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    @property
    def code(self) -> grpc.StatusCode:
        return _CODES[self.reason]

    @property
    def status_details(self) -> str:
        """What goes into the gRPC status details: ``reason: detail``."""
        return str(self)


class PeerRefused(Exception):
    """The other side refused what we sent (an in-band ``Refusal`` or its status)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def reason_from_details(details: str | None) -> str:
    """The reason a peer gave in its status details (``"other"`` if it gave none we know):
    a message check's, or its gate's (credentials, limits: ``auth.REFUSAL_REASONS``)."""
    head = (details or "").split(":", 1)[0].strip()
    return head if head in _CODES or head in REFUSAL_REASONS else "other"


@dataclass
class WireStats:
    """Plain counters; the daemon exports them (``gasloc_*_total``). Loop-thread only.

    ``rejected[reason]``: messages *we* refused. ``refused[reason]``: calls the server's
    gate ended before reading anything (credentials, per-caller limits; ``auth``).
    ``failures[reason]``: partner exchanges of a round that produced no usable θ̃_j, by
    why (``deadline``, ``unavailable``, ``refused:<reason>`` when the peer refused us,
    ``rejected:<reason>`` when we refused it, ...). Bytes count what crossed the wire
    (encoded), in both roles.
    """

    rejected: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # calls ended by the gate
    failures: Counter[str] = field(default_factory=Counter)
    bytes_sent: int = 0
    bytes_received: int = 0
    exchanges_ok: int = 0

    def snapshot(self) -> dict[str, object]:
        """A JSON-friendly copy."""
        return {
            "rejected": dict(self.rejected),
            "refused": dict(self.refused),
            "failures": dict(self.failures),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "exchanges_ok": self.exchanges_ok,
        }


@dataclass(frozen=True)
class Identity:
    """Who we are and what we run: compared against every incoming header."""

    run_id: str
    peer_id: str
    fingerprint: str


def check_sender(claimed: str, authenticated: str) -> None:
    """A message's sender field must be the peer whose key signed the call."""
    if claimed != authenticated:
        raise Refusal(
            "wrong-sender", f"the call is from {authenticated[:64]!r}, not {claimed[:64]!r}"
        )


def check_static(me: Identity, run_id: str, fp: str) -> None:
    """Run id and model fingerprint: the checks that do not depend on the round."""
    if run_id != me.run_id:
        raise Refusal("wrong-run", f"this peer is in run {me.run_id!r}, not {run_id!r}")
    if fp != me.fingerprint:
        raise Refusal("fingerprint", f"model fingerprint {fp!r} differs from ours")


def check_payload(
    config: WireConfig, header: pb.ExchangeHeader, numel: int, roster_digest: bytes
) -> Codec:
    """Codec, sizes and chunking of an exchange header against what we know; its codec."""
    if roster_digest and header.roster_digest and header.roster_digest != roster_digest:
        raise Refusal("roster-mismatch", "the sender computed its partners from another roster")
    if header.codec not in CODEC_NAMES:
        raise Refusal("unknown-codec", f"{header.codec[:32]!r} is not one of {CODEC_NAMES}")
    if header.codec not in config.codecs:
        raise Refusal("codec-not-allowed", f"this peer accepts {', '.join(config.codecs)}")
    codec = get_codec(header.codec)
    want = codec.encoded_nbytes(numel)
    if header.numel != numel or header.encoded_nbytes != want:
        raise Refusal(
            "size-mismatch",
            f"declared {header.numel} elements / {header.encoded_nbytes} bytes; "
            f"this model has {numel} elements = {want} bytes in {codec.name}",
        )
    if not 0 < header.chunk_bytes <= config.max_chunk_bytes:
        raise Refusal(
            "bad-chunk-size",
            f"chunk_bytes {header.chunk_bytes} not in (0, {config.max_chunk_bytes}]",
        )
    return codec


def parse_request(kind: type[M], raw: bytes) -> M:
    """A unary request decoded, or refused as malformed."""
    try:
        return kind.FromString(raw)
    except DecodeError as exc:
        raise Refusal("malformed", f"not a {kind.__name__}: {exc}") from None


def exchange_header_of(raw: object) -> pb.ExchangeHeader:
    """The first message of an Exchange as its header, or refused."""
    if not isinstance(raw, bytes):
        raise Refusal("truncated", "the stream ended before its header")
    try:
        parsed = parse_chunk(raw)
    except MalformedMessage as exc:
        raise Refusal("malformed", str(exc)) from None
    if parsed.header is None:
        raise Refusal("unexpected-message", f"a {parsed.kind} where a header was expected")
    return parsed.header
