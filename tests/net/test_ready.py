"""Ready notices between real gRPC servers on 127.0.0.1: a partner's "I finished my local
steps" reaches the other, and a bad notice is refused, counted and remembered by no one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
import torch

from gaslocd.config import WireConfig
from gaslocd.net.client import READY
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.server import ExchangeServer
from gaslocd.net.validation import Identity

pytestmark = pytest.mark.net

RUN, FP = "ready-run", "fp-1"


@contextlib.asynccontextmanager
async def _pair() -> AsyncIterator[tuple[ExchangeServer, ExchangeServer, str]]:
    """Two live servers on 127.0.0.1 (a, b) and b's address; stopped on exit."""
    a = ExchangeServer(WireConfig(token="t0k"), Identity(RUN, "peer-a", FP))
    b = ExchangeServer(WireConfig(token="t0k"), Identity(RUN, "peer-b", FP))
    await a.start("127.0.0.1", 0)
    port = await b.start("127.0.0.1", 0)
    try:
        yield a, b, f"127.0.0.1:{port}"
    finally:
        await a.stop()
        await b.stop()


async def _raw(address: str, payload: bytes) -> grpc.StatusCode:
    """Send ``payload`` as a Ready request; the status code it gets back."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(READY)
        try:
            await call(payload, timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


def _notice(**over: object) -> bytes:
    fields: dict[str, object] = {"run_id": RUN, "round": 3, "sender": "peer-x", "token": b"t0k"}
    fields.update(over)
    return pb.ReadyNotice(**fields).SerializeToString()  # type: ignore[arg-type]


def test_a_ready_notice_reaches_the_partner_for_that_round_only() -> None:
    async def scenario() -> None:
        async with _pair() as (a, b, b_addr):
            assert not b.partners_ready(3, ["peer-a"])
            await a.client.notify_ready(b_addr, 3, timeout_s=5.0)
            assert b.partners_ready(3, ["peer-a"])
            assert not b.partners_ready(4, ["peer-a"])  # another round
            assert not b.partners_ready(3, ["peer-a", "peer-c"])  # 2-peer: both needed
            assert b.partners_ready(3, [])  # nobody to wait for

    asyncio.run(scenario())


def test_bad_notices_are_refused_counted_and_change_nothing() -> None:
    async def scenario() -> None:
        async with _pair() as (_, b, b_addr):
            # b has round 5 open: notices for earlier rounds are stale, far ones refused.
            await b.open_round(5, torch.zeros(4), {"peer-a": "127.0.0.1:1"})
            cases = {
                "token-wrong": (_notice(token=b"nope", round=5), grpc.StatusCode.UNAUTHENTICATED),
                "token-missing": (_notice(token=b"", round=5), grpc.StatusCode.UNAUTHENTICATED),
                "wrong-run": (
                    _notice(run_id="other", round=5),
                    grpc.StatusCode.FAILED_PRECONDITION,
                ),
                "stale-round": (_notice(round=4), grpc.StatusCode.FAILED_PRECONDITION),
                "future-round": (_notice(round=50), grpc.StatusCode.FAILED_PRECONDITION),
                "malformed": (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT),
            }
            for reason, (payload, code) in cases.items():
                before = b.stats.rejected[reason]
                assert await _raw(b_addr, payload) == code, reason
                assert b.stats.rejected[reason] == before + 1, reason
            empty = _notice(sender="", round=5)
            assert await _raw(b_addr, empty) == grpc.StatusCode.INVALID_ARGUMENT
            assert not b.partners_ready(5, ["peer-x"])
            assert not b.partners_ready(4, ["peer-x"])
            # A good notice still gets through afterwards.
            assert await _raw(b_addr, _notice(round=6)) == grpc.StatusCode.OK
            assert b.partners_ready(6, ["peer-x"])

    asyncio.run(scenario())


def test_memory_of_notices_stays_bounded_under_a_flood() -> None:
    async def scenario() -> None:
        async with _pair() as (_, b, b_addr):
            # No round open yet: any round is taken, but only the latest few are kept,
            # and only so many senders per round.
            for r in range(40):
                assert await _raw(b_addr, _notice(round=r)) == grpc.StatusCode.OK
            for i in range(200):
                assert await _raw(b_addr, _notice(round=39, sender=f"s{i}")) == grpc.StatusCode.OK
            assert len(b._ready) <= 8
            assert 0 < len(b._ready[39]) <= 64
            assert not b.partners_ready(0, ["peer-x"])

    asyncio.run(scenario())
