"""A live ExchangeServer against hostile peers (issue 14): every failure of the remote
side ends that exchange or fetch with a counted reason, and the server goes on."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hostile import HostilePeer
from testkeys import auth_for

from gaslocd.config import WireConfig
from gaslocd.net.client import PeerClient
from gaslocd.net.server import ExchangeServer
from gaslocd.net.state import check_ranges
from gaslocd.net.validation import Identity, Refusal, WireStats

pytestmark = pytest.mark.net

RUN, FP, NUMEL, CHUNK = "hostile-run", "fp-h", 50_000, 64 * 1024
MODES = ("abort-after-header", "abort-mid-stream", "garbage", "finish-early")
TOKEN = "hostile-s3cret"


def test_aborting_and_lying_acceptors_fail_only_their_exchange() -> None:
    async def scenario() -> None:
        hostile = HostilePeer(
            auth_for(RUN, "b-hostile", TOKEN), FP, NUMEL, CHUNK, lambda c: MODES[c.round - 1]
        )
        address = await hostile.start()
        honest = ExchangeServer(
            WireConfig(token=TOKEN, chunk_bytes=CHUNK),
            Identity(RUN, "a-honest", FP),
            auth=auth_for(RUN, "a-honest", TOKEN),
        )
        await honest.start("127.0.0.1", 0)
        try:
            reasons = {}
            for r, mode in enumerate(MODES, start=1):
                await honest.open_round(r, torch.ones(NUMEL), {"b-hostile": address})
                out = await asyncio.wait_for(honest.exchange_round(r, 10.0), 30)
                assert not out["b-hostile"].ok, (mode, out)
                reasons[mode] = out["b-hostile"].reason
            # (which label an abort gets depends on what our side was doing when it came)
            gone = {"aborted", "peer-gone", "stream-broken", "rejected:truncated"}
            assert reasons["abort-after-header"] in gone, reasons
            assert reasons["abort-mid-stream"] in gone, reasons
            assert reasons["garbage"] == "rejected:malformed"
            # an early clean end lands while we still write under load: "peer-gone"
            early = ("rejected:truncated", "stream-broken", "peer-gone")
            assert reasons["finish-early"] in early, reasons
            assert sum(honest.stats.failures.values()) == len(MODES)
            # the token never went on the wire, in any call
            assert not any(TOKEN.encode() in blob for blob in hostile.seen)
        finally:
            await honest.stop()
            await hostile.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("round_", "momentum", "reason"),
    [(2**60, 1.0, "state-range"), (5, 1e30, "state-range"), (5, float("inf"), "non-finite")],
)
def test_a_hostile_state_is_refused_whole(round_: int, momentum: float, reason: str) -> None:
    async def scenario() -> None:
        hostile = HostilePeer(auth_for(RUN, "b-hostile", TOKEN), FP, NUMEL, CHUNK, lambda c: "")
        hostile.state_round, hostile.momentum_scale = round_, momentum
        address = await hostile.start()
        stats = WireStats()
        with ThreadPoolExecutor(1) as pool:
            client = PeerClient(
                WireConfig(token=TOKEN, chunk_bytes=CHUNK),
                Identity(RUN, "a-newcomer", FP),
                pool,
                stats,
                auth_for(RUN, "a-newcomer", TOKEN),
            )
            try:
                sizes = {"theta": NUMEL, "outer_momentum": NUMEL}
                with pytest.raises(Refusal) as refused:
                    await client.fetch_state(address, sizes, 10, peer="b-hostile")
                assert refused.value.reason == reason
                assert stats.rejected[reason] == 1
            finally:
                await client.close()
                await hostile.stop()

    asyncio.run(scenario())


def test_range_checks_of_a_state() -> None:
    theta = torch.randn(1000) * 0.02
    check_ranges({"theta": theta, "outer_momentum": theta * 0.5})
    check_ranges({"theta": theta, "outer_momentum": torch.zeros(1000)})
    for bad, reason in (
        ({"theta": theta, "outer_momentum": theta * 1e6}, "state-range"),
        ({"theta": torch.full((1000,), 1e30), "outer_momentum": theta}, "state-range"),
        ({"theta": theta, "outer_momentum": torch.full((1000,), float("nan"))}, "non-finite"),
    ):
        with pytest.raises(Refusal) as refused:
            check_ranges(bad)
        assert refused.value.reason == reason
