"""A newcomer on a slow link gets the whole state; one that stops reading frees its slot.

The state is 8 bytes per parameter (4.4 GB at 551M): how long it streams is set by the
newcomer's link, so the server bounds it by a rate (``STATE_MIN_RATE``), over the whole
state and per chunk, never by a fixed time (a fixed 60 s refused every newcomer slower
than ~600 Mbit/s at that size). A real server on 127.0.0.1; the reader is a raw gRPC
call that reads at the pace the test sets, as a slow link would.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import torch
from testkeys import auth_for

from gaslocd.config import WireConfig
from gaslocd.net.client import GET_STATE
from gaslocd.net.gate import Limits
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.server import ExchangeServer
from gaslocd.net.state import STATE_MIN_RATE, PeerState, state_read_s
from gaslocd.net.validation import Identity

pytestmark = pytest.mark.net

RUN = "pace"
NUMEL = 2_000_000  # θ and m: 16 MB, more than gRPC's flow-control windows hold
CHUNK = 64 * 1024  # the smallest allowed: the stall bound, a chunk at the slowest rate, is 4 s
WAIT_S = 0.5  # accept_wait_s: the old bound on the whole stream
STATE = PeerState(3, 0, {"theta": torch.ones(NUMEL), "outer_momentum": torch.zeros(NUMEL)})


async def _read(
    address: str, pause_s: float, stop_after: int | None, streams: int = 0
) -> tuple[int, int, str]:
    """GetState as peer ``cli``, pausing ``pause_s`` after each message (a slow link);
    ``stop_after``: stop reading after that many messages and wait for the call's end;
    ``streams``: how many states the request says it reads at once.
    Returns (messages, bytes, status code name)."""
    request = pb.StateRequest(run_id=RUN, sender="cli", fingerprint="fp", streams=streams)
    metadata = auth_for(RUN, "cli", "t").metadata("srv", "GetState")[0]
    count = nbytes = 0
    async with grpc.aio.insecure_channel(address) as chan:
        call = chan.unary_stream(GET_STATE, request_serializer=pb.StateRequest.SerializeToString)(
            request, timeout=60, metadata=metadata
        )
        try:
            while stop_after is None or count < stop_after:
                message = await call.read()
                if message is grpc.aio.EOF:
                    break
                count, nbytes = count + 1, nbytes + len(message)
                await asyncio.sleep(pause_s)  # the link's pace, not a wait for anything
            code = await call.code()
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
    return count, nbytes, code.name


def _server(limits: Limits | None = None) -> ExchangeServer:
    config = WireConfig(token="t", accept_wait_s=WAIT_S, chunk_bytes=CHUNK)
    server = ExchangeServer(
        config,
        Identity(RUN, "srv", "fp"),
        auth=auth_for(RUN, "srv", "t"),
        limits=limits or Limits(),
    )
    server.set_state_provider(lambda: STATE)
    return server


def test_a_slow_steady_reader_gets_the_whole_state_however_long_it_takes() -> None:
    async def scenario() -> None:
        server = _server()
        address = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
        try:
            began = time.monotonic()
            count, nbytes, code = await _read(address, 0.01, None)
            took = time.monotonic() - began
            assert code == "OK" and nbytes > 8 * NUMEL and count > 8 * NUMEL // CHUNK
            assert took > 2 * WAIT_S  # what a fixed bound of WAIT_S refused
            assert server.stats.rejected["timeout"] == 0
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_a_reader_that_stops_reading_is_refused_after_a_chunks_worth_and_frees_its_slot() -> None:
    """With one GetState slot: a reader that stops is refused once a chunk has waited
    ``state_read_s(chunk)`` (not the whole state's bound, 977 s here), and the next
    newcomer is served while the stalled call is still open (its status would queue
    behind the bytes it does not read; the server does not wait for it)."""
    stall_s = state_read_s(CHUNK, WAIT_S)
    assert stall_s == CHUNK / STATE_MIN_RATE  # 4 s: a chunk at the slowest rate waited for

    async def scenario() -> None:
        server = _server(Limits(state_fetches=1))
        address = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
        try:
            began = time.monotonic()
            stalled = asyncio.ensure_future(_read(address, 0.0, stop_after=2))
            while server.stats.rejected["timeout"] == 0:
                assert time.monotonic() - began < stall_s + 15, "never refused"
                await asyncio.sleep(0.1)  # polling a counter, bounded above
            refused_at = time.monotonic()
            assert refused_at - began >= stall_s
            code = "RESOURCE_EXHAUSTED"  # until the refusal has let the slot go (≤ 1 s)
            while code == "RESOURCE_EXHAUSTED" and time.monotonic() - refused_at < 5:
                _, nbytes, code = await _read(address, 0.0, None)
            assert code == "OK" and nbytes > 8 * NUMEL  # the slot was free
            assert not stalled.done()  # while the stalled call is still open
            stalled.cancel()
            await asyncio.gather(stalled, return_exceptions=True)
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_a_reader_of_two_states_at_once_gets_twice_as_long_per_chunk_and_no_more() -> None:
    """A join asks two peers for their states together (same-moment snapshots to cross-
    check), so each stream gets half its link: the request says so and each server allows
    half its minimum rate. Over 224 kbit/s the two streams read 14 kB/s each, under the
    16 KiB/s minimum, and every such join timed out (bench/stragglers_net.py at 10× T).
    A caller claiming more streams than that gets no longer."""
    stall_s = state_read_s(CHUNK, WAIT_S)

    async def refused_after(streams: int) -> float:
        server = _server(Limits(state_fetches=1))
        address = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
        try:
            began = time.monotonic()
            stalled = asyncio.ensure_future(_read(address, 0.0, 2, streams))
            while server.stats.rejected["timeout"] == 0:
                assert time.monotonic() - began < 2 * stall_s + 15, "never refused"
                await asyncio.sleep(0.1)  # polling a counter, bounded above
            stalled.cancel()
            await asyncio.gather(stalled, return_exceptions=True)
            return time.monotonic() - began
        finally:
            await server.stop()

    two, many = asyncio.run(refused_after(2)), asyncio.run(refused_after(50))
    assert state_read_s(CHUNK, WAIT_S, 2) == 2 * stall_s == state_read_s(CHUNK, WAIT_S, 50)
    assert 2 * stall_s <= two < 2 * stall_s + 10, two  # as one stream: refused at 4 s
    assert 2 * stall_s <= many < 2 * stall_s + 10, many  # uncapped: 200 s
