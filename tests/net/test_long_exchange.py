"""A long exchange on the real wire: live ExchangeServers on 127.0.0.1. The round does not
wait for it, the next rounds open and close around it, and it still lands with the θ̃ of
its own round; past its own deadline it fails for both ends, and a stop ends it."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_link_codecs import _servers, _theta
from testkeys import auth_for
from wire_peer import FINGERPRINT, RUN_ID, theta_of
from wire_raw import data_messages, header, raw_exchange

from gaslocd.config import WireConfig
from gaslocd.net.frames import frame_header
from gaslocd.net.rendezvous import ExchangeFailure, ExchangeResult
from gaslocd.net.server import ExchangeServer
from gaslocd.net.validation import Identity
from gaslocd.protocol.plan import MAX_LONG_ROUNDS, LinkEstimates

pytestmark = pytest.mark.net

A, B, C = "peer-a", "peer-b", "peer-c"  # a dials b and c (the smaller id dials)
Z = "peer-0"  # dials a
FP32 = ("fp32",)
NUMEL, CHUNK = 50_000, 1 << 16


def _address(servers: dict, peer: str) -> str:  # type: ignore[type-arg]
    return f"127.0.0.1:{servers[peer].port}"


async def _late_long_exchange(late: str) -> None:
    async with _servers({A: FP32, late: FP32, C: FP32}) as s:
        a, b, c = s[A], s[late], s[C]
        B = late
        # Round 1: a pairs with b (long) and c (normal); b opens late, after a's round 1
        # is over and its round 2 (with c) is open.
        await a.open_round(1, _theta(A), {B: _address(s, B), C: _address(s, C)})
        await c.open_round(1, _theta(C), {A: _address(s, A)})
        first = await asyncio.wait_for(
            asyncio.gather(a.exchange_round(1, 5.0, long={B: 30.0}), c.exchange_round(1, 5.0)),
            20,
        )
        assert set(first[0]) == {C} and isinstance(first[0][C], ExchangeResult)
        flights = a.take_long(1)
        assert set(flights) == {B} and not flights[B].done()
        await a.open_round(2, _theta(A) + 1e-3, {C: _address(s, C)})
        await c.open_round(2, _theta(C), {A: _address(s, A)})
        second = await asyncio.wait_for(
            asyncio.gather(a.exchange_round(2, 5.0), c.exchange_round(2, 5.0)), 20
        )
        assert isinstance(second[0][C], ExchangeResult)
        # Now the late peer gets to round 1. When a dials it, its accept claims a's round-1
        # call, which has waited since; when it dials a, a's lingering round-1 offer
        # (closed, but keeping this partner) takes the call.
        partners = {A: _address(s, A)}
        theta_b = _theta(B)
        await b.open_round(1, theta_b, partners)
        out_b = await asyncio.wait_for(b.exchange_round(1, 10.0), 20)
        landed = await asyncio.wait_for(flights[B], 30)
        assert isinstance(landed, ExchangeResult), landed
        torch.testing.assert_close(landed.theta, theta_b)  # round 1's θ̃, not a later one
        got = out_b[A]
        assert isinstance(got, ExchangeResult), got
        torch.testing.assert_close(got.theta, _theta(A))  # a sent its round-1 θ̃


@pytest.mark.parametrize("late", [B, Z], ids=["it-is-dialed", "it-dials"])
def test_a_long_exchange_outlives_its_round_and_lands_with_that_rounds_theta(late: str) -> None:
    asyncio.run(_late_long_exchange(late))


def test_a_long_exchange_past_its_own_deadline_fails_and_a_stop_ends_one_in_flight() -> None:
    async def main() -> None:
        async with _servers({A: FP32, B: FP32}) as s:
            a = s[A]
            await a.open_round(1, _theta(A), {B: _address(s, B)})
            outcomes = await a.exchange_round(1, 1.0, long={B: 0.5})  # b never opens
            assert outcomes == {}
            late = await asyncio.wait_for(a.take_long(1)[B], 10)
            assert isinstance(late, ExchangeFailure) and late.reason == "deadline"
            await a.open_round(2, _theta(A), {B: _address(s, B)})
            await a.exchange_round(2, 1.0, long={B: 60.0})
            flight = a.take_long(2)[B]
            await a.stop(0.5)
            assert isinstance(await asyncio.wait_for(flight, 10), ExchangeFailure)

    asyncio.run(main())


async def _declared_long(long_rounds: int) -> tuple[dict[str, int], object, object, object]:
    """A partner (a raw client) whose header declares its exchange long by
    ``long_rounds`` rounds (and its link at 1000 × that B/s), and whose data comes only
    after our round's deadline: what our ``extend`` was told, our round's outcomes, how
    the kept exchange ended, and the link rates partners declared."""
    srv = ExchangeServer(
        WireConfig(token="tok"),
        Identity(RUN_ID, "b-srv", FINGERPRINT),
        auth=auth_for(RUN_ID, "b-srv", "tok"),
    )
    await srv.start("127.0.0.1", 0)
    theta_a, theta_b = theta_of("a-evil", NUMEL, 0), theta_of("b-srv", NUMEL, 0)
    told: dict[str, int] = {}
    deadline_passed = asyncio.Event()

    async def extend(running: dict[str, int]) -> dict[str, float]:
        told.update(running)
        deadline_passed.set()
        return {p: 30.0 for p, k in running.items() if k > 0}

    try:
        await srv.open_round(1, theta_b, {"a-evil": "127.0.0.1:1"})
        rate = 1000 * long_rounds
        head = frame_header(header(NUMEL, CHUNK, long_rounds=long_rounds, link_bytes_per_s=rate))
        client = asyncio.ensure_future(
            raw_exchange(
                f"127.0.0.1:{srv.port}",
                [head, *data_messages(theta_a, CHUNK)],
                gate=deadline_passed,
            )
        )
        outcomes = await srv.exchange_round(1, 3.0, {}, extend, 30.0)
        flights = srv.take_long(1)
        kept = await asyncio.wait_for(flights["a-evil"], 30) if flights else None
        await asyncio.wait_for(client, 30)
        return told, outcomes, kept, dict(srv.rate_hints)
    finally:
        await srv.stop(0.5)


def test_a_partner_that_declares_its_exchange_long_in_its_header_is_kept_past_the_deadline() -> (
    None
):
    """Records can be stale at one end (a slow peer's DHT publish starves on its own link),
    so the ends may plan a link differently: the header says so, and the other end keeps
    the stream instead of cutting it at its deadline; the θ̃ lands intact."""
    told, outcomes, kept, rates = asyncio.run(_declared_long(3))
    assert told == {"a-evil": 3} and outcomes == {} and rates == {"a-evil": 3000.0}
    assert isinstance(kept, ExchangeResult), kept
    torch.testing.assert_close(kept.theta, theta_of("a-evil", NUMEL, 0))
    # Declaring nothing: cut at the deadline as before. A hostile claim: capped.
    told, outcomes, kept, rates = asyncio.run(_declared_long(0))
    assert told == {"a-evil": 0} and kept is None and rates == {}  # 0: unknown, not kept
    assert isinstance(outcomes["a-evil"], ExchangeFailure), outcomes
    told, _, _, _ = asyncio.run(_declared_long(10_000))
    assert told == {"a-evil": MAX_LONG_ROUNDS}


def test_a_long_exchange_calls_again_while_its_partner_has_not_reached_the_round() -> None:
    """The partner of a long exchange may run rounds behind (it sat out, or its slow link
    delays its rounds): our call is refused as too far ahead, and retried until the
    exchange's own deadline rather than dropped."""

    async def main() -> None:
        async with _servers({A: FP32, B: FP32, C: FP32}) as s:
            a, b = s[A], s[B]
            await b.open_round(1, _theta(B), {C: _address(s, C)})  # b is at round 1
            await a.open_round(5, _theta(A), {B: _address(s, B)})
            assert await a.exchange_round(5, 1.0, long={B: 30.0}) == {}
            flight = a.take_long(5)[B]
            deadline = asyncio.get_running_loop().time() + 20
            while not b.stats.rejected["future-round"]:  # our first call was refused
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)  # polling a counter, bounded above
            assert not flight.done()
            theta_b = _theta(B) + 1e-3
            await b.open_round(5, theta_b, {A: _address(s, A)})  # b reaches round 5
            out_b = await asyncio.wait_for(b.exchange_round(5, 10.0), 20)
            landed = await asyncio.wait_for(flight, 20)
            assert isinstance(landed, ExchangeResult), landed
            torch.testing.assert_close(landed.theta, theta_b)
            assert isinstance(out_b[A], ExchangeResult)

    asyncio.run(main())


def test_a_late_acceptor_does_not_time_the_bytes_it_finds_buffered_as_its_link() -> None:
    """The dialer streams right after its header; an acceptor whose round opens later reads
    the first bytes (here all of them) from buffers, so its transfer time is not its link's
    (a 1 Mbit/s straggler on real daemons took 42 Mbit/s from one, left its sit-out schedule
    and missed its exchanges after). It says how long the data could arrive unread, and
    the sample is dropped; the dialer's, timed from the acceptor's reply, counts."""
    late_s = 0.3  # how late b opens: the situation under test, not a synchronisation

    async def main() -> tuple[ExchangeResult | ExchangeFailure, ExchangeResult | ExchangeFailure]:
        async with _servers({A: FP32, B: FP32}) as s:
            a, b = s[A], s[B]
            arrived = asyncio.Event()
            board = b._board  # a seam: when a's call starts waiting for b's round
            assert board is not None
            claim = board.claim

            async def seen(round_: int, sender: str, timeout_s: float):  # type: ignore[no-untyped-def]
                arrived.set()
                return await claim(round_, sender, timeout_s)

            board.claim = seen  # type: ignore[method-assign]
            await a.open_round(1, _theta(A), {B: _address(s, B)})
            dial = asyncio.ensure_future(a.exchange_round(1, 20.0))
            await asyncio.wait_for(arrived.wait(), 10)
            await asyncio.sleep(late_s)
            await b.open_round(1, _theta(B), {A: _address(s, A)})
            accepted = await asyncio.wait_for(b.exchange_round(1, 10.0), 20)
            dialed = await asyncio.wait_for(dial, 20)
            return dialed[B], accepted[A]

    dialed, accepted = asyncio.run(main())
    assert isinstance(dialed, ExchangeResult) and isinstance(accepted, ExchangeResult)
    assert accepted.role == "accept" and accepted.unread_s >= late_s
    assert dialed.role == "dial" and dialed.unread_s == 0.0
    links = LinkEstimates()
    links.record_transfer(A, accepted.transfer_s, accepted.bytes_received, accepted.unread_s)
    links.record_transfer(B, dialed.transfer_s, dialed.bytes_received, dialed.unread_s)
    assert set(links.bandwidth) == {B}
