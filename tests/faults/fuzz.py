"""Hostile input against a live daemon's gRPC port (issue 7): the cases and how to send them.

A :class:`Target` is one running daemon ("the acceptor") that we attack while it trains
with a real partner. The cases are drawn by hypothesis (:func:`cases`); every one of them
is wrong in at least one way, so every one must be refused:

- ``bytes``: random bytes as an Exchange message (one or several), or as a GetState /
  Status request;
- ``header``: a well-formed Exchange header with one or more fields wrong (credentials
  missing or with a wrong token, another run, another model, a stale / far-future /
  absurd round, the partner's id claimed by the insider, unknown codec, wrong sizes, a
  zero or huge chunk size, a foreign roster digest), followed by nothing or by data;
- ``data``: a correct header of the insider for the acceptor's next round, followed by bad
  data: NaN, inf, huge values, a θ̃ far from ours, too few bytes (truncated), too many
  (oversize), a chunk of the wrong size, garbage where data belongs, or a second header.

The attacker is an *insider*: it holds the run's token and a key of its own, so its calls
pass the gate (``gaslocd.net.auth``) and reach the message checks. It cannot sign as the
acceptor's real partner, so it is never that partner: its data is refused at the claim
(``not-a-partner``). Bad data from the partner itself is tested against a server whose
partner key the test holds (tests/net/test_wire_refusals.py).

Random draws may miss a kind altogether (40 draws once held no ``data`` case), so
:data:`SWEEP` holds one fixed case of every kind, and of every method for ``bytes``; the
test runs them before the drawn ones.

:func:`flood` opens many connections at once (idle calls, garbage calls, raw TCP sockets
that write random bytes that are not even HTTP/2). ``GASLOCD_FUZZ_EXAMPLES`` sets how
many cases test_fuzz.py draws (40 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch
from hypothesis import strategies as st

from gaslocd.net.auth import CallAuth, Metadata
from gaslocd.net.client import EXCHANGE, GET_STATE, STATUS
from gaslocd.net.codecs import chunk_spans, get_codec
from gaslocd.net.frames import frame_data, frame_header, parse_chunk
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.validation import reason_from_details

CHUNK = 64 * 1024
CALL_TIMEOUT_S = 75.0  # > accept_wait_s (60): a case waiting for a round that never opens
# (the daemon trains alone that round) gets the daemon's own "timeout" refusal, not ours
_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


@dataclass(frozen=True)
class Target:
    """What an insider knows about the daemon under attack (all of it is public but the token)."""

    address: str  # host:port of its gRPC server
    run_id: str
    token: str
    fingerprint: str
    numel: int
    partner: str  # the peer id of its real partner, which dials it (partner < acceptor)
    peer_id: str  # the acceptor's own
    insider: CallAuth  # the attacker's credentials: the token and a key of its own


@dataclass
class Verdict:
    """What the daemon answered: the refusal reason it named, or why there is none."""

    case: str
    code: grpc.StatusCode
    reason: str  # a validation reason, or "other"
    details: str

    @property
    def refused(self) -> bool:
        return self.code != grpc.StatusCode.OK


@dataclass
class Tally:
    verdicts: list[Verdict] = field(default_factory=list)

    def by_reason(self) -> Counter[str]:
        return Counter(v.reason for v in self.verdicts if v.reason != "other")


# -- the cases ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kind: str  # "bytes", "header", "data"
    method: str = EXCHANGE
    messages: tuple[bytes, ...] = ()
    request: bytes = b""  # unary request of GetState / Status
    header_faults: tuple[str, ...] = ()
    data_fault: str = ""
    round_offset: int = 1  # relative to the round the daemon's Status reports
    seed: int = 0

    def describe(self) -> str:
        if self.kind == "bytes":
            return f"bytes->{self.method.rsplit('/', 1)[-1]}"
        return f"{self.kind}:{'+'.join(self.header_faults) or '-'}:{self.data_fault or '-'}"


HEADER_FAULTS = (
    "token-missing", "token-wrong", "wrong-run", "fingerprint", "stale-round",
    "future-round", "absurd-round", "not-a-partner", "impostor-self", "unknown-codec",
    "numel", "encoded-nbytes", "chunk-zero", "chunk-huge", "roster-digest",
)  # fmt: skip
DATA_FAULTS = (
    "nan", "inf", "huge", "far", "truncated", "nothing", "oversize", "chunk-size",
    "garbage", "second-header", "empty-message",
)  # fmt: skip


def cases() -> st.SearchStrategy[Case]:
    random_messages = st.lists(st.binary(min_size=0, max_size=2048), min_size=1, max_size=4)
    raw = st.one_of(
        random_messages.map(lambda m: Case("bytes", EXCHANGE, messages=tuple(m))),
        st.binary(max_size=512).map(lambda b: Case("bytes", GET_STATE, request=b)),
        st.binary(max_size=512).map(lambda b: Case("bytes", STATUS, request=b)),
    )
    header = st.builds(
        lambda faults, data, seed: Case(
            "header", header_faults=tuple(sorted(faults)), data_fault=data, seed=seed
        ),
        st.sets(st.sampled_from(HEADER_FAULTS), min_size=1, max_size=3),
        st.sampled_from(("", "garbage", "nan")),
        st.integers(0, 2**31),
    )
    data = st.builds(
        lambda fault, seed: Case("data", data_fault=fault, seed=seed),
        st.sampled_from(DATA_FAULTS),
        st.integers(0, 2**31),
    )
    return st.one_of(raw, header, data)


# One fixed case of every kind, and of every method for raw bytes (b"\xff" is no valid
# protobuf: field 31 with wire type 7), run before the drawn ones so none is ever missed.
SWEEP: tuple[Case, ...] = (
    Case("bytes", EXCHANGE, messages=(b"\xff\xff", b"\x00" * 64)),
    Case("bytes", GET_STATE, request=b"\xff\xff"),
    Case("bytes", STATUS, request=b"\xff\xff"),
    Case("header", header_faults=("token-wrong",), data_fault="nan", seed=1),
    Case("data", data_fault="nan", seed=2),
)


def kind_of(description: str) -> str:
    """The kind in a :meth:`Case.describe`, with the method for raw bytes: "header",
    "data", "bytes->Status", ... (the kinds :data:`SWEEP` covers)."""
    return description.split(":", 1)[0]


def _header(target: Target, round_: int, faults: tuple[str, ...], rng: random.Random) -> bytes:
    codec = get_codec("fp32")
    fields: dict[str, object] = {
        "run_id": target.run_id,
        "round": round_,
        "sender": target.insider.my_peer_id,
        "fingerprint": target.fingerprint,
        "codec": "fp32",
        "numel": target.numel,
        "encoded_nbytes": codec.encoded_nbytes(target.numel),
        "chunk_bytes": CHUNK,
    }
    for fault in faults:
        if fault == "wrong-run":
            fields["run_id"] = target.run_id + "-other"
        elif fault == "fingerprint":
            fields["fingerprint"] = "f" * rng.randint(0, 80)
        elif fault == "stale-round":
            fields["round"] = max(0, round_ - rng.randint(3, 50))
        elif fault == "future-round":
            fields["round"] = round_ + rng.randint(3, 50)
        elif fault == "absurd-round":
            fields["round"] = 2**64 - 1
        elif fault == "not-a-partner":
            fields["sender"] = "zz-" + rng.randbytes(8).hex()
        elif fault == "impostor-self":  # the insider names the real partner as sender
            fields["sender"] = target.partner
        elif fault == "unknown-codec":
            fields["codec"] = rng.choice(["fp8", "", "FP32", "pickle", "x" * 300])
        elif fault == "numel":
            fields["numel"] = target.numel + rng.choice([-1, 1, target.numel, 2**40])
        elif fault == "encoded-nbytes":
            fields["encoded_nbytes"] = rng.choice([0, 1, 2**63])
        elif fault == "chunk-zero":
            fields["chunk_bytes"] = 0
        elif fault == "chunk-huge":
            fields["chunk_bytes"] = 2**32 - 1
        elif fault == "roster-digest":
            fields["roster_digest"] = rng.randbytes(32)
    return frame_header(pb.ExchangeHeader(**fields))  # type: ignore[arg-type]


def _data(target: Target, fault: str, rng: random.Random) -> list[bytes]:
    """Data messages for ``fault``: the right count and sizes unless the fault is the size."""
    codec = get_codec("fp32")
    spans = list(chunk_spans(codec, target.numel, CHUNK))
    theta = torch.zeros(target.numel)
    if fault == "nan":
        theta[rng.randrange(target.numel)] = float("nan")
    elif fault == "inf":
        theta[rng.randrange(target.numel)] = float("-inf") if rng.random() < 0.5 else float("inf")
    elif fault == "huge":
        theta.fill_(3e38)
    elif fault == "far":
        theta.normal_(0.0, 1e3, generator=torch.Generator().manual_seed(rng.randrange(2**31)))
    raw = codec.encode(theta).numpy()
    chunks = [frame_data(raw[b0:b1].tobytes()) for _, _, b0, b1 in spans]
    if fault == "truncated":
        return chunks[: rng.randrange(len(chunks))] + (
            [frame_data(raw[:7].tobytes())] if rng.random() < 0.5 else []
        )
    if fault == "nothing":
        return []
    if fault == "oversize":
        return [*chunks, frame_data(b"\0" * CHUNK)]
    if fault == "chunk-size":
        return [frame_data(raw[: CHUNK + 4].tobytes()), *chunks[1:]]
    if fault == "garbage":
        return [rng.randbytes(rng.randint(1, 4096)) for _ in range(rng.randint(1, 3))]
    if fault == "second-header":
        return [frame_header(pb.ExchangeHeader(run_id=target.run_id)), *chunks]
    if fault == "empty-message":
        return [b"", *chunks]
    return chunks


def credentials_for(case: Case, target: Target, round_: int) -> Metadata:
    """The insider's metadata for ``case``, or none / a wrong token's for those faults."""
    method = case.method.rsplit("/", 1)[-1]
    round_ = round_ + case.round_offset if case.kind != "bytes" else 0
    if "token-missing" in case.header_faults:
        return ()
    auth = target.insider
    if "token-wrong" in case.header_faults:
        rng = random.Random(case.seed)
        wrong = rng.randbytes(rng.randint(1, 40)).hex()
        auth = CallAuth(target.run_id, wrong, auth.my_peer_id, None, lambda _p: None)
    return auth.metadata(target.peer_id, method, round_)[0]


def messages_for(case: Case, target: Target, round_: int) -> list[bytes]:
    rng = random.Random(case.seed)
    if case.kind == "bytes":
        return list(case.messages)
    head = _header(target, round_ + case.round_offset, case.header_faults, rng)
    return [head, *(_data(target, case.data_fault, rng) if case.data_fault else [])]


# -- sending ------------------------------------------------------------------------------


def _channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 << 20)]
    )


async def daemon_round(address: str, run_id: str, token: str, timeout_s: float = 10.0) -> int:
    """The round the daemon has last opened for exchanges (Status, as ``gaslocd status``)."""
    metadata = CallAuth(run_id, token, "fuzz", None, lambda _p: None).metadata("", "Status")[0]
    async with _channel(address) as chan:
        req = pb.StatusRequest(run_id=run_id).SerializeToString()
        reply = await chan.unary_unary(STATUS)(req, timeout=timeout_s, metadata=metadata)
        return int(pb.StatusReply.FromString(reply).round)


async def _exchange(
    chan: grpc.aio.Channel, messages: list[bytes], metadata: Metadata
) -> tuple[grpc.StatusCode, str]:
    call = chan.stream_stream(EXCHANGE)(timeout=CALL_TIMEOUT_S, metadata=metadata)

    async def send() -> None:
        with contextlib.suppress(Exception):
            for m in messages:
                await call.write(m)
            await call.done_writing()

    sender = asyncio.ensure_future(send())
    in_band: tuple[grpc.StatusCode, str] | None = None
    error: grpc.aio.AioRpcError | None = None
    try:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                break
            with contextlib.suppress(Exception):
                parsed = parse_chunk(bytes(msg))
                if parsed.refusal is not None:
                    r = parsed.refusal
                    in_band = (
                        _BY_VALUE.get(r.code, grpc.StatusCode.UNKNOWN),
                        r.reason + ": " + r.detail,
                    )
    except grpc.aio.AioRpcError as exc:
        error = exc
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    if in_band is not None:  # the acceptor's own verdict (see peer.proto, Refusal)
        return in_band
    if error is not None:
        return error.code(), error.details() or ""
    return await call.code(), await call.details() or ""


async def send_case(case: Case, target: Target, round_: int) -> Verdict:
    metadata = credentials_for(case, target, round_)
    async with _channel(target.address) as chan:
        if case.method == EXCHANGE:
            code, details = await _exchange(chan, messages_for(case, target, round_), metadata)
        else:
            try:
                stream = case.method == GET_STATE
                call = (chan.unary_stream if stream else chan.unary_unary)(case.method)
                if stream:
                    async for _ in call(case.request, timeout=CALL_TIMEOUT_S, metadata=metadata):  # type: ignore[union-attr]
                        pass
                else:
                    await call(case.request, timeout=CALL_TIMEOUT_S, metadata=metadata)  # type: ignore[misc]
                code, details = grpc.StatusCode.OK, ""
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
    return Verdict(case.describe(), code, reason_from_details(details), details)


# -- floods -------------------------------------------------------------------------------


async def _garbage_socket(host: str, port: int, rng: random.Random, hold_s: float) -> None:
    with contextlib.suppress(OSError, asyncio.TimeoutError):
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        try:
            writer.write(rng.randbytes(rng.randint(1, 65536)))
            await asyncio.wait_for(writer.drain(), 5.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(reader.read(1 << 16), hold_s)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2.0)


async def idle_call(address: str, hold_s: float, garbage: bytes | None) -> grpc.StatusCode:
    """An Exchange call that sends nothing (or one garbage message) and holds the stream."""
    async with _channel(address) as chan:
        call = chan.stream_stream(EXCHANGE)(timeout=hold_s)
        if garbage is not None:
            with contextlib.suppress(Exception):
                await call.write(garbage)
        try:
            while await call.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return await call.code()


async def flood(address: str, connections: int, hold_s: float, seed: int = 0) -> Counter[str]:
    """``connections`` hostile connections at once, a third of each kind; status counts."""
    rng = random.Random(seed)
    host, port = address.rsplit(":", 1)
    jobs: list[asyncio.Future[object]] = []
    for i in range(connections):
        kind = i % 3
        if kind == 0:
            jobs.append(asyncio.ensure_future(_garbage_socket(host, int(port), rng, hold_s)))
        else:
            junk = rng.randbytes(rng.randint(1, 1024)) if kind == 2 else None
            jobs.append(asyncio.ensure_future(idle_call(address, hold_s, junk)))
    results = await asyncio.gather(*jobs, return_exceptions=True)
    return Counter(r.name if isinstance(r, grpc.StatusCode) else type(r).__name__ for r in results)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and its children started in its session (Linux)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(entry) == pid or int(stat[1]) == pid:  # itself or a direct child
                pages = int(Path(f"/proc/{entry}/statm").read_text().split()[1])
                total += pages * os.sysconf("SC_PAGE_SIZE")
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
