"""Idle calls cannot starve a real server of its concurrent-call slots for long.

A caller that opens Exchange calls and sends nothing is dropped after ``header_wait_s``
(not after ``accept_wait_s``, the much longer wait for a round to open), so a flood of
more idle calls than the server has slots (64) locks real partners out only briefly.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc
import pytest

from gaslocd.config import WireConfig
from gaslocd.net.server import ExchangeServer
from gaslocd.net.validation import Identity
from tests.faults.fuzz import idle_call

pytestmark = pytest.mark.net

HEADER_WAIT_S = 1.0
HOLD_S = 30.0  # how long each idle caller would like to hold its call


def test_a_flood_of_silent_calls_is_dropped_after_the_header_wait() -> None:
    async def scenario() -> None:
        config = WireConfig(token="t", header_wait_s=HEADER_WAIT_S, accept_wait_s=60.0)
        server = ExchangeServer(config, Identity("slots", "srv", "fp"))
        port = await server.start("127.0.0.1", 0)
        address = f"127.0.0.1:{port}"
        client = ExchangeServer(WireConfig(token="t"), Identity("slots", "cli", "fp"))
        await client.start("127.0.0.1", 0)
        try:
            began = time.monotonic()
            idle = [idle_call(address, HOLD_S, None) for _ in range(80)]
            codes = Counter(await asyncio.gather(*idle))
            took = time.monotonic() - began
            # Those that got a slot were dropped for sending no header; the rest were
            # turned away at once. None held its call for the HOLD_S it wanted.
            assert set(codes) <= {
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            }, codes
            assert took < HOLD_S / 2, took
            assert server.stats.rejected["timeout"] == codes[grpc.StatusCode.DEADLINE_EXCEEDED]
            assert server.stats.rejected["timeout"] >= 1
            # The slots are free again: a real request is answered.
            reply = await client.client.status(address, timeout_s=5.0)
            assert reply.peer_id == "srv"
        finally:
            await client.stop()
            await server.stop()

    asyncio.run(scenario())
