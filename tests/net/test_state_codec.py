"""A join's or resync's state in fp16 (gaslocd/net/state.py): half the bytes of fp32, so a
newcomer on a slow link is half as many rounds behind once its state has arrived. A real
server on 127.0.0.1; a hostile one (tests/net/hostile.py) for the lies a client refuses."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from hostile import HostilePeer
from testkeys import auth_for

from gaslocd.config import WireConfig
from gaslocd.net.client import PeerClient
from gaslocd.net.server import ExchangeServer
from gaslocd.net.state import PeerState
from gaslocd.net.validation import Identity, Refusal, WireStats

pytestmark = pytest.mark.net

RUN, FP, TOKEN, NUMEL, CHUNK = "codec-run", "fp-c", "c0dec", 300_000, 64 * 1024
SIZES = {"theta": NUMEL, "outer_momentum": NUMEL}
THETA = torch.randn(NUMEL, generator=torch.Generator().manual_seed(0)) * 0.05
MOMENTUM = THETA * 1e-3  # small values: fp16 keeps them (its subnormals reach 6e-8)


async def _fetch(state: PeerState, codecs: list[str]) -> tuple[list[PeerState], list[int]]:
    """Fetch ``state`` from a real server once per codec asked; the states, and the
    bytes the server sent for each."""
    config = WireConfig(token=TOKEN, chunk_bytes=CHUNK)
    server = ExchangeServer(config, Identity(RUN, "srv", FP), auth=auth_for(RUN, "srv", TOKEN))
    server.set_state_provider(lambda: state)
    address = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
    got, sent = [], []
    with ThreadPoolExecutor(1) as pool:
        me = Identity(RUN, "new", FP)
        client = PeerClient(config, me, pool, WireStats(), auth_for(RUN, "new", TOKEN))
        try:
            for codec in codecs:
                before = server.stats.bytes_sent
                got.append(await client.fetch_state(address, SIZES, 30, peer="srv", codec=codec))
                sent.append(server.stats.bytes_sent - before)
        finally:
            await client.close()
            await server.stop()
    return got, sent


def test_a_state_asked_for_in_fp16_is_half_the_bytes_and_rounded_only() -> None:
    state = PeerState(4, 77, {"theta": THETA, "outer_momentum": MOMENTUM}, {"k": "v"})
    (exact, older, half), sent = asyncio.run(_fetch(state, ["fp32", "", "fp16"]))
    for whole in (exact, older):  # fp32, and an older caller that names no codec
        assert whole.codec == "fp32" and torch.equal(whole.tensors["theta"], THETA)
    assert half.codec == "fp16" and (half.round, half.data_position, half.extra) == (
        4,
        77,
        {"k": "v"},
    )
    for name, values in state.tensors.items():
        assert torch.equal(half.tensors[name], values.half().float())  # rounded, nothing else
        err = float((half.tensors[name] - values).norm() / values.norm())
        assert 0 < err < 1e-3
    assert sent[0] == sent[1] and 0.49 < sent[2] / sent[0] < 0.51


def test_a_value_beyond_fp16_is_sent_in_fp32_and_arrives_exact() -> None:
    theta = THETA.clone()
    theta[7] = 1e5  # no real model's weight, but a state must never arrive infinite
    state = PeerState(4, 0, {"theta": theta, "outer_momentum": MOMENTUM})
    (got,), sent = asyncio.run(_fetch(state, ["fp16"]))
    assert got.codec == "fp32" and torch.equal(got.tensors["theta"], theta)
    assert sent[0] > 8 * NUMEL


def test_a_request_for_another_codec_is_refused_and_the_server_serves_on() -> None:
    async def scenario() -> None:
        config = WireConfig(token=TOKEN, chunk_bytes=CHUNK)
        server = ExchangeServer(config, Identity(RUN, "srv", FP), auth=auth_for(RUN, "srv", TOKEN))
        server.set_state_provider(
            lambda: PeerState(1, 0, {"theta": THETA, "outer_momentum": MOMENTUM})
        )
        address = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
        with ThreadPoolExecutor(1) as pool:
            me = Identity(RUN, "new", FP)
            client = PeerClient(config, me, pool, WireStats(), auth_for(RUN, "new", TOKEN))
            try:
                for codec in ("q4", "int8", "zip" * 100):  # lossy blockwise, or none at all
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await client.fetch_state(address, SIZES, 30, peer="srv", codec=codec)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "unknown-codec" in (err.value.details() or "")
                assert server.stats.bytes_sent == 0  # refused before anything was streamed
                state = await client.fetch_state(address, SIZES, 30, peer="srv", codec="fp16")
                assert state.round == 1
            finally:
                await client.close()
                await server.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(("asked", "named"), [("fp32", "fp16"), ("fp16", "q4"), ("fp16", "bf16")])
def test_a_state_in_a_codec_not_asked_for_is_refused(asked: str, named: str) -> None:
    """A server may answer fp32 to any request, never another codec: a client that asked
    for an exact copy gets one, and no blockwise-rounded state is ever adopted."""

    async def scenario() -> None:
        hostile = HostilePeer(auth_for(RUN, "srv", TOKEN), FP, NUMEL, CHUNK, lambda c: "")
        hostile.state_codec = named
        address = await hostile.start()
        stats = WireStats()
        with ThreadPoolExecutor(1) as pool:
            config = WireConfig(token=TOKEN, chunk_bytes=CHUNK)
            client = PeerClient(
                config, Identity(RUN, "new", FP), pool, stats, auth_for(RUN, "new", TOKEN)
            )
            try:
                with pytest.raises(Refusal) as refused:
                    await client.fetch_state(address, SIZES, 10, peer="srv", codec=asked)
                assert refused.value.reason == "unknown-codec"
                assert stats.rejected["unknown-codec"] == 1
                # fp32, which every server may answer in, is taken whatever was asked
                hostile.state_codec = "fp32"
                state = await client.fetch_state(address, SIZES, 10, peer="srv", codec=asked)
                assert state.codec == "fp32" and torch.equal(
                    state.tensors["theta"], torch.ones(NUMEL)
                )
            finally:
                await client.close()
                await hostile.stop()

    asyncio.run(scenario())
