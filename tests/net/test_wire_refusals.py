"""Every bad input to a real peer process is refused as specified, and θ never changes.

One server process (``b-srv``) accepts the partner ``a-evil`` round after round; the test
plays ``a-evil`` (or an impostor) with hand-made bytes. A refusal *before* the call is
bound to the partner's slot (bad credentials, wrong run, stale round, impostor, ...) must leave
the slot to the real partner: the test then sends a good exchange and checks that it
arrives intact. A refusal *after* (bad data) ends the partner's exchange for the round.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import torch
import uvloop
from testkeys import private_key, public_key_of
from wire_control import PeerProcess
from wire_peer import theta_of
from wire_raw import credentials_for, data_messages, header, raw_exchange

from gaslocd.net.auth import CallAuth, Metadata
from gaslocd.net.frames import frame_data, frame_header

pytestmark = [pytest.mark.net, pytest.mark.slow]

NUMEL = 65_536  # 256 KiB in fp32: four 64 KiB chunks
CHUNK = 64 * 1024
SEED = 0
Case = Callable[[int], list[bytes]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerProcess]:
    logs = tmp_path_factory.mktemp("refusals")
    peer = PeerProcess("b-srv", Path(logs), "--numel", str(NUMEL), "--chunk-bytes", str(CHUNK))
    try:
        yield peer
    finally:
        try:
            peer.quit()
        finally:
            if peer.proc.poll() is None:
                peer.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                peer.proc.wait(10)
            peer.close_pipes()


def _theta(scale: float = 1.0) -> torch.Tensor:
    return theta_of("a-evil", NUMEL, SEED) * scale


def _good(r: int, **over: object) -> list[bytes]:
    return [frame_header(header(NUMEL, CHUNK, round=r, **over)), *data_messages(_theta(), CHUNK)]


def _with_data(r: int, theta: torch.Tensor) -> list[bytes]:
    return [frame_header(header(NUMEL, CHUNK, round=r)), *data_messages(theta, CHUNK)]


def _nan(r: int) -> list[bytes]:
    t = _theta()
    t[NUMEL // 2] = float("nan")
    return _with_data(r, t)


BEFORE_CLAIM: dict[str, tuple[Case, grpc.StatusCode]] = {
    "wrong-run": (lambda r: _good(r, run_id="other-run"), grpc.StatusCode.FAILED_PRECONDITION),
    "fingerprint": (lambda r: _good(r, fingerprint="x"), grpc.StatusCode.FAILED_PRECONDITION),
    "stale-round": (lambda r: _good(r - 1), grpc.StatusCode.FAILED_PRECONDITION),
    "future-round": (lambda r: _good(r + 5), grpc.StatusCode.FAILED_PRECONDITION),
    "not-a-partner": (lambda r: _good(r, sender="a-stranger"), grpc.StatusCode.FAILED_PRECONDITION),
    # the header names the partner, the call is signed by a-stranger's own key
    "wrong-sender": (
        lambda r: [
            credentials_for(_good(r, sender="a-stranger"), "b-srv"),  # type: ignore[list-item]
            *_good(r),
        ],
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    "malformed": (lambda r: [b"\xff\xff\xff\xff"], grpc.StatusCode.INVALID_ARGUMENT),
    "unexpected-message": (
        lambda r: data_messages(_theta(), CHUNK),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
}

AFTER_CLAIM: dict[str, tuple[Case, grpc.StatusCode]] = {
    "unknown-codec": (lambda r: _good(r, codec="zstd"), grpc.StatusCode.INVALID_ARGUMENT),
    "size-mismatch": (
        lambda r: _good(r, numel=1 << 40, encoded_nbytes=4 << 40),  # "gigabytes", never sent
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "bad-chunk-size": (lambda r: _good(r, chunk_bytes=1 << 30), grpc.StatusCode.INVALID_ARGUMENT),
    "oversize": (
        lambda r: [*_good(r), data_messages(_theta(), CHUNK)[0]],
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "truncated": (lambda r: _good(r)[:3], grpc.StatusCode.INVALID_ARGUMENT),
    "chunk-mismatch": (
        lambda r: [*_good(r)[:2], frame_data(b"\x00" * 1000)],
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "non-finite": (_nan, grpc.StatusCode.INVALID_ARGUMENT),
    "norm-bound": (lambda r: _with_data(r, _theta(3.0)), grpc.StatusCode.INVALID_ARGUMENT),
}

_round = iter(range(10, 10_000))


def _exchange(address: str, messages: list) -> tuple[grpc.StatusCode, str]:  # type: ignore[type-arg]
    metadata = None
    if messages and not isinstance(messages[0], bytes):  # a case with its own credentials
        metadata, messages = messages[0], messages[1:]
    result = uvloop.run(raw_exchange(address, messages, timeout_s=20, metadata=metadata))
    # The call's own status is the verdict too, unless grpc.aio lost it to a pending write
    # of ours (grpc/grpc#36066): then it reads INTERNAL and the in-band refusal is all we have.
    assert result.status in (result.code, grpc.StatusCode.INTERNAL), result
    return result.code, result.details


@pytest.mark.parametrize("reason", list(BEFORE_CLAIM))
def test_refused_before_the_slot_is_bound(server: PeerProcess, reason: str) -> None:
    case, code = BEFORE_CLAIM[reason]
    r = next(_round)
    rejected_before = server.stats()["rejected"].get(reason, 0)
    server.start_round(r, {"a-evil": "127.0.0.1:9"}, deadline_s=30)
    got_code, details = _exchange(server.address, case(r))
    assert (got_code, details.split(":")[0]) == (code, reason), details
    # the real partner still gets through, and what arrives is exactly what it sent
    ok_code, ok_details = _exchange(server.address, _good(r))
    assert ok_code == grpc.StatusCode.OK, ok_details
    done = server.expect("round", 30)
    outcome = done["outcomes"]["a-evil"]
    assert outcome["ok"] and outcome["rel_err"] == 0.0, outcome
    assert done["stats"]["rejected"][reason] == rejected_before + 1


@pytest.mark.parametrize("reason", list(AFTER_CLAIM))
def test_refused_data_never_reaches_the_model(server: PeerProcess, reason: str) -> None:
    case, code = AFTER_CLAIM[reason]
    r = next(_round)
    rejected_before = server.stats()["rejected"].get(reason, 0)
    server.start_round(r, {"a-evil": "127.0.0.1:9"}, deadline_s=30)
    got_code, details = _exchange(server.address, case(r))
    assert (got_code, details.split(":")[0]) == (code, reason), details
    done = server.expect("round", 30)
    outcome = done["outcomes"]["a-evil"]
    assert not outcome["ok"] and outcome["reason"] == f"rejected:{reason}", outcome
    assert done["model_after"] == done["model_before"]  # θ untouched
    assert done["stats"]["rejected"][reason] == rejected_before + 1
    assert done["elapsed_s"] < 10  # refused at once, not at the deadline


def _as(peer: str, key_of: str | None = None, token: str = "tok", **kw: object) -> CallAuth:
    """Credentials claiming ``peer``, signed with ``key_of``'s key (an insider's, say)."""
    key = private_key(key_of or peer)
    return CallAuth("test-run", token, peer, key, public_key_of, **kw)  # type: ignore[arg-type]


def _creds(auth: CallAuth, r: int, target: str = "b-srv") -> Metadata:
    return auth.metadata(target, "Exchange", r)[0]


_replayed: dict[str, Metadata] = {}


def _replay(r: int) -> Metadata:
    """A blob the server has already seen (a refused stale call of the same round)."""
    blob = _creds(_as("a-evil"), r)
    uvloop.run(raw_exchange(SERVER_ADDRESS[0], _good(r - 1), timeout_s=20, metadata=blob))
    return blob


SERVER_ADDRESS: list[str] = []
# Refused by the gate before any message is read: counted in stats["refused"].
GATE: dict[str, tuple[Callable[[int], Metadata], grpc.StatusCode]] = {
    "unauthenticated": (lambda r: (), grpc.StatusCode.UNAUTHENTICATED),  # no credentials
    "unauthenticated-token": (
        lambda r: _creds(_as("a-evil", token="not-the-token"), r),
        grpc.StatusCode.UNAUTHENTICATED,
    ),
    "bad-signature": (  # an insider (token, own key) claiming the partner's id
        lambda r: _creds(_as("a-evil", key_of="a-insider"), r),
        grpc.StatusCode.PERMISSION_DENIED,
    ),
    "wrong-target": (
        lambda r: _creds(_as("a-evil"), r, "c-other"),
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    "clock-skew": (
        lambda r: _creds(_as("a-evil", clock=lambda: time.time() - 600), r),
        grpc.StatusCode.PERMISSION_DENIED,
    ),
    "replay": (_replay, grpc.StatusCode.PERMISSION_DENIED),
}


@pytest.mark.parametrize("case", list(GATE))
def test_refused_at_the_gate(server: PeerProcess, case: str) -> None:
    make, code = GATE[case]
    reason = case.split("-token")[0]
    r = next(_round)
    SERVER_ADDRESS[:] = [server.address]
    server.start_round(r, {"a-evil": "127.0.0.1:9"}, deadline_s=30)
    refused_before = server.stats()["refused"].get(reason, 0)
    blob = make(r)
    result = uvloop.run(raw_exchange(server.address, _good(r), timeout_s=20, metadata=blob))
    assert (result.code, result.details.split(":")[0]) == (code, reason), result
    assert result.status in (code, grpc.StatusCode.INTERNAL), result  # grpc/grpc#36066
    assert result.replies == 0  # nothing of the server's θ̃ went out
    ok_code, ok_details = _exchange(server.address, _good(r))
    assert ok_code == grpc.StatusCode.OK, ok_details
    done = server.expect("round", 30)
    assert done["outcomes"]["a-evil"]["ok"], done
    assert done["stats"]["refused"][reason] == refused_before + 1
