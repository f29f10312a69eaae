"""Checks on incoming messages, the refusal they raise, and the counts they leave.

Every refusal is a :class:`Refusal`: a stable short *reason* (a metric label), the gRPC
status code the refusing side answers with, and a human detail. The status details
string is ``"<reason>: <detail>"`` so the other side can count the reason too.

The order of the header checks is deliberate: the token first (a caller without the
run's secret learns nothing else, not even whether the run id or round was right), then
what is static for the run (run id, fingerprint), then the round and partner (done by the
rendezvous, which may wait for our round to open), then the payload description (codec,
sizes, chunking). Sizes are compared with what *we* know (our own numel): nothing is ever
allocated from a size the peer declares.
"""

from __future__ import annotations

import hmac
from collections import Counter
from dataclasses import dataclass, field

import grpc

from gaslocd.config import WireConfig
from gaslocd.net.codecs import CODEC_NAMES, Codec, get_codec
from gaslocd.net.proto import peer_pb2 as pb

_CODES: dict[str, grpc.StatusCode] = {
    "token-missing": grpc.StatusCode.UNAUTHENTICATED,
    "token-wrong": grpc.StatusCode.UNAUTHENTICATED,
    "wrong-run": grpc.StatusCode.FAILED_PRECONDITION,
    "fingerprint": grpc.StatusCode.FAILED_PRECONDITION,
    "stale-round": grpc.StatusCode.FAILED_PRECONDITION,
    "future-round": grpc.StatusCode.FAILED_PRECONDITION,
    "round-closed": grpc.StatusCode.FAILED_PRECONDITION,
    "not-a-partner": grpc.StatusCode.FAILED_PRECONDITION,
    "wrong-direction": grpc.StatusCode.FAILED_PRECONDITION,
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
}
REASONS = tuple(_CODES)


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
    """The reason a peer gave in its status details (``"other"`` if it gave none we know)."""
    head = (details or "").split(":", 1)[0].strip()
    return head if head in _CODES else "other"


@dataclass
class WireStats:
    """Plain counters; the daemon exports them (``gasloc_*_total``). Loop-thread only.

    ``rejected[reason]``: messages *we* refused. ``failures[reason]``: partner exchanges
    of a round that produced no usable θ̃_j, by why (``deadline``, ``unavailable``,
    ``refused:<reason>`` when the peer refused us, ``rejected:<reason>`` when we refused
    it, ...). Bytes count what crossed the wire (encoded), in both roles.
    """

    rejected: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    bytes_sent: int = 0
    bytes_received: int = 0
    exchanges_ok: int = 0

    def snapshot(self) -> dict[str, object]:
        """A JSON-friendly copy."""
        return {
            "rejected": dict(self.rejected),
            "failures": dict(self.failures),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "exchanges_ok": self.exchanges_ok,
        }


def check_token(expected: str, given: bytes) -> None:
    """Constant-time token check; an empty expected token disables it (loopback only)."""
    if not expected:
        return
    if not given:
        raise Refusal("token-missing", "this run requires a join token")
    if not hmac.compare_digest(expected.encode(), given):
        raise Refusal("token-wrong", "the join token does not match")


@dataclass(frozen=True)
class Identity:
    """Who we are and what we run: compared against every incoming header."""

    run_id: str
    peer_id: str
    fingerprint: str


def check_static(config: WireConfig, me: Identity, token: bytes, run_id: str, fp: str) -> None:
    """Token, run id and model fingerprint: the checks that do not depend on the round."""
    check_token(config.token, token)
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
