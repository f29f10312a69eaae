"""Idle calls cannot starve a real server: strangers hold nothing, insiders little.

A caller without credentials is ended as its metadata arrives (UNAUTHENTICATED), before
any message is read, so a flood of idle strangers holds no slot at all. A caller with
credentials (an insider) that opens calls and sends nothing holds at most
``calls_per_peer`` of them, each for ``header_wait_s``; more are refused at once with
RESOURCE_EXHAUSTED. Every refusal is counted by reason.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc
import pytest
from testkeys import auth_for

from gaslocd.config import WireConfig
from gaslocd.net.client import EXCHANGE
from gaslocd.net.gate import Limits
from gaslocd.net.server import ExchangeServer
from gaslocd.net.validation import Identity
from tests.faults.fuzz import idle_call

pytestmark = pytest.mark.net

HEADER_WAIT_S = 1.0
HOLD_S = 30.0  # how long each idle caller would like to hold its call
RUN = "slots"


async def _insider_idle(address: str, hold_s: float) -> grpc.StatusCode:
    """An authenticated Exchange call (peer ``cli``) that sends nothing."""
    metadata = auth_for(RUN, "cli", "t").metadata("srv", "Exchange", 1)[0]
    async with grpc.aio.insecure_channel(address) as chan:
        call = chan.stream_stream(EXCHANGE)(timeout=hold_s, metadata=metadata)
        try:
            while await call.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return await call.code()


def test_idle_strangers_hold_nothing_and_insiders_are_limited() -> None:
    async def scenario() -> None:
        config = WireConfig(token="t", header_wait_s=HEADER_WAIT_S, accept_wait_s=60.0)
        server = ExchangeServer(
            config,
            Identity(RUN, "srv", "fp"),
            auth=auth_for(RUN, "srv", "t"),
            limits=Limits(calls_per_peer=4),
        )
        port = await server.start("127.0.0.1", 0)
        address = f"127.0.0.1:{port}"
        client = ExchangeServer(
            WireConfig(token="t"), Identity(RUN, "cli", "fp"), auth=auth_for(RUN, "cli", "t")
        )
        await client.start("127.0.0.1", 0)
        try:
            began = time.monotonic()
            idle = [idle_call(address, HOLD_S, None) for _ in range(80)]
            codes = Counter(await asyncio.gather(*idle))
            assert codes == Counter({grpc.StatusCode.UNAUTHENTICATED: 80}), codes
            assert server.stats.refused["unauthenticated"] == 80
            assert server.stats.rejected["timeout"] == 0  # none got as far as a handler
            # An insider's idle calls: 4 held until the header wait, the rest refused.
            insider = Counter(
                await asyncio.gather(*(_insider_idle(address, HOLD_S) for _ in range(10)))
            )
            took = time.monotonic() - began
            assert insider == Counter(
                {grpc.StatusCode.DEADLINE_EXCEEDED: 4, grpc.StatusCode.RESOURCE_EXHAUSTED: 6}
            ), insider
            assert server.stats.refused["busy-peer"] == 6
            assert server.stats.rejected["timeout"] == 4
            assert took < HOLD_S / 2, took
            # Nothing is held any more: a real request is answered.
            reply = await client.client.status(address, timeout_s=5.0)
            assert reply.peer_id == "srv"
        finally:
            await client.stop()
            await server.stop()

    asyncio.run(scenario())
