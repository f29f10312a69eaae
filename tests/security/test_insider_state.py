"""Which state a newcomer or a resyncing daemon takes (daemon/membership.py), with fake
peers: a typical source first, range checks, and a cross-check against a second peer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import torch

from gaslocd.daemon import membership
from gaslocd.daemon.membership import Membership, StartupError
from gaslocd.net.state import PeerState
from gaslocd.protocol.plan import LinkEstimates
from tests.protocol.records import record as _rec

N = 1000
HONEST = torch.ones(N)


class _Thread:
    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


def _membership(states: Mapping[str, tuple[int, torch.Tensor, torch.Tensor]]) -> Any:
    """A Membership over fake peers (address -> (round, θ, m)); records what it adopts."""
    asked: list[str] = []
    adopted: list[tuple[int, torch.Tensor]] = []

    async def fetch_state(
        address: str, expected: Any, timeout: float, *, peer: str, **_: Any
    ) -> PeerState:
        asked.append(peer)
        if address not in states:
            raise ConnectionError("unreachable")
        round_, theta, momentum = states[address]
        return PeerState(round_, 0, {"theta": theta, "outer_momentum": momentum})

    state = SimpleNamespace(numel=N, round=0, adopt=lambda r, theta, m: adopted.append((r, theta)))
    rt = SimpleNamespace(
        me="me",
        state=state,
        thread=_Thread(),
        wire=SimpleNamespace(norm_bound=1.0),
        server=SimpleNamespace(client=SimpleNamespace(fetch_state=fetch_state)),
        progress=lambda line: None,
        clock=time.monotonic,
        links=LinkEstimates(),
        stopping=False,
        cfg=SimpleNamespace(heartbeat_s=3.0),
        spawn=None,  # no roster prefetch here
        telemetry=SimpleNamespace(metrics=SimpleNamespace()),
    )
    m = Membership(rt)  # type: ignore[arg-type]
    m.asked, m.adopted = asked, adopted  # type: ignore[attr-defined]
    return m


def test_a_poisoned_state_from_the_highest_claim_is_never_asked_first() -> None:
    honest = (10, HONEST, torch.zeros(N))
    m = _membership({"a:1": honest, "b:1": honest, "liar:1": (2**40, -HONEST, torch.zeros(N))})
    records = [_rec("a", 10), _rec("b", 10), _rec("liar", 2**40)]
    assert asyncio.run(m.fetch_state(records)) == 10
    assert m.asked == ["a", "b"] and m.adopted[0][0] == 10


def test_a_state_that_disagrees_with_a_second_peer_is_refused_for_the_third() -> None:
    # "a" (the median round) serves a poisoned θ; b and c agree with each other.
    poisoned = (10, HONEST * 5, torch.zeros(N))
    honest = (10, HONEST, torch.zeros(N))
    m = _membership({"a:1": poisoned, "b:1": honest, "c:1": honest})
    records = [_rec("a", 10), _rec("b", 11), _rec("c", 9)]
    asyncio.run(m.fetch_state(records))
    assert m.asked == ["a", "b", "c"]
    assert torch.equal(m.adopted[0][1], HONEST)


def test_out_of_range_momentum_or_round_falls_back_to_the_next_source() -> None:
    honest = (10, HONEST, torch.zeros(N))
    huge_m = (10, HONEST, HONEST * 1e6)
    m = _membership({"a:1": huge_m, "b:1": honest})
    asyncio.run(m.fetch_state([_rec("a", 10), _rec("b", 10)]))
    assert m.asked == ["a", "b"] and torch.equal(m.adopted[0][1], HONEST)
    m = _membership({"a:1": (500, HONEST, torch.zeros(N))})  # round far from its record
    with pytest.raises(StartupError, match="state-range"):
        asyncio.run(m.fetch_state([_rec("a", 10)]))
    assert m.adopted == []


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retries' random pause is 0 (it is the product's backoff, not a wait in a test)."""
    monkeypatch.setattr(membership.random, "uniform", lambda _a, _b: 0.0)


@pytest.mark.usefixtures("no_backoff")
def test_two_disagreeing_states_and_nobody_else_are_both_refused() -> None:
    m = _membership({"a:1": (10, HONEST, torch.zeros(N)), "b:1": (10, -HONEST, torch.zeros(N))})
    with pytest.raises(StartupError, match="disagree"):
        asyncio.run(m.fetch_state([_rec("a", 10), _rec("b", 10)]))
    assert m.adopted == []
    assert m.asked == ["a", "b"] * (membership.STATE_BUSY_RETRIES + 1)  # asked again


@pytest.mark.usefixtures("no_backoff")
def test_states_that_disagree_are_asked_for_again_and_taken_once_they_agree() -> None:
    """Honest replicas early in a run can be near the norm bound apart and mix closer
    every round: a newcomer asks again instead of failing its start (a clean-clone run of
    the 5%-loss netns test saw it once)."""
    states = {"a:1": (10, HONEST, torch.zeros(N)), "b:1": (10, -HONEST, torch.zeros(N))}
    m = _membership(states)
    real_fetch = m.rt.server.client.fetch_state

    async def fetch_state(address: str, *args: Any, **kw: Any) -> PeerState:
        got = await real_fetch(address, *args, **kw)
        if address == "b:1":  # b mixed with a meanwhile
            states["b:1"] = (11, HONEST * 1.1, torch.zeros(N))
        return got

    m.rt.server.client.fetch_state = fetch_state
    asyncio.run(m.fetch_state([_rec("a", 10), _rec("b", 10)]))
    assert m.asked == ["a", "b", "a", "b"] and len(m.adopted) == 1


def test_a_lone_source_or_an_unreachable_second_is_taken_after_the_range_checks() -> None:
    m = _membership({"a:1": (10, HONEST, torch.zeros(N))})
    assert asyncio.run(m.fetch_state([_rec("a", 10)])) == 10
    m = _membership({"a:1": (10, HONEST, torch.zeros(N))})
    assert asyncio.run(m.fetch_state([_rec("a", 10), _rec("gone", 10)])) == 10


def test_the_two_states_compared_are_asked_for_at_once() -> None:
    """A run that moves fast (early training) moves past the norm bound in the time one
    state takes over a slow link: two honest states asked for one after the other then
    never agree, and a straggler that drifted off could never resync (seen in the
    1 Mbit/s netns test). Each fake peer serves the run's θ of the moment it is asked
    and one transfer passes when it has sent it: the two compared must be of the same
    moment (the old code asked b only after a's transfer, a θ 2.5 × ‖θ‖ further on)."""
    transfers = [0]  # transfers completed: the run's clock here
    m = _membership({})
    asked: list[tuple[str, int]] = []

    async def fetch_state(
        address: str, expected: Any, timeout: float, *, peer: str, **_: Any
    ) -> PeerState:
        asked.append((peer, transfers[0]))
        theta = HONEST * (1.0 + 2.5 * transfers[0])  # the run's θ when asked
        await asyncio.sleep(0)  # the transfer: other fetches may start meanwhile
        transfers[0] += 1
        return PeerState(10, 0, {"theta": theta, "outer_momentum": torch.zeros(N)})

    m.rt.server.client.fetch_state = fetch_state
    assert asyncio.run(m.fetch_state([_rec("a", 10), _rec("b", 10)])) == 10
    assert asked == [("a", 0), ("b", 0)] and len(m.adopted) == 1
    # Their shared transfer measured our link once, with both states' bytes.
    assert list(m.rt.links.bandwidth) == [membership.STATE_FETCH]


def test_a_refused_token_stops_the_other_fetch_at_once() -> None:
    """The two sources are asked at once: the one that refuses our token ends the join,
    and the other fetch is stopped, not left streaming a state nobody will take."""
    m = _membership({})
    stopped = asyncio.Event()

    async def fetch_state(address: str, *_: Any, peer: str, **__: Any) -> PeerState:
        if peer == "a":
            md = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAUTHENTICATED, md, md, "bad token")
        try:
            await asyncio.Event().wait()  # a slow link: never done on its own
        except asyncio.CancelledError:
            stopped.set()
            raise
        raise AssertionError("unreachable")

    m.rt.server.client.fetch_state = fetch_state

    async def body() -> None:
        with pytest.raises(StartupError, match="refused our join token"):
            await asyncio.wait_for(m.fetch_state([_rec("a", 10), _rec("b", 10)]), 10)
        assert stopped.is_set() and m.adopted == []

    asyncio.run(body())
