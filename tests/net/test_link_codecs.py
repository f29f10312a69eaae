"""A codec per link on the real wire: live ExchangeServers on 127.0.0.1 (in one event loop,
as the daemons' servers are, each with its own port, channels and threads) send each
partner its own codec, in both roles, and a codec the receiver does not accept is refused
with the usual ``codec-not-allowed``. Plus the message sharing of ``round_messages``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from testkeys import auth_for
from wire_peer import theta_of

from gaslocd.config import WireConfig
from gaslocd.net.codecs import ErrorFeedback, FeedbackBank, get_codec, roundtrip
from gaslocd.net.rendezvous import ExchangeResult, Outcome
from gaslocd.net.server import ExchangeServer
from gaslocd.net.stream import round_messages
from gaslocd.net.validation import Identity

pytestmark = pytest.mark.net

RUN, FP, NUMEL = "link-codecs", "fp-1", 100_003  # odd: partial last blocks of every codec
DEADLINE_S = 20.0


def _theta(peer: str) -> torch.Tensor:
    return theta_of(peer, NUMEL, 0)  # a shared base and a small difference: within the bound


@contextlib.asynccontextmanager
async def _servers(
    accepts: Mapping[str, tuple[str, ...]],
) -> AsyncIterator[dict[str, ExchangeServer]]:
    """One live server per peer id, accepting the codecs given; stopped on exit."""
    servers = {
        peer: ExchangeServer(
            WireConfig(token="t0k", codecs=codecs),
            Identity(RUN, peer, FP),
            auth=auth_for(RUN, peer, "t0k"),
        )
        for peer, codecs in accepts.items()
    }
    try:
        for server in servers.values():
            await server.start("127.0.0.1", 0)
        yield servers
    finally:
        for server in servers.values():
            await server.stop(0.5)


async def _round(
    servers: dict[str, ExchangeServer],
    codecs: Mapping[str, str | Mapping[str, str]],
    banks: Mapping[str, FeedbackBank],
    round_: int = 1,
) -> dict[str, dict[str, Outcome]]:
    """Every server offers its θ̃ to all the others and exchanges; the outcomes."""
    address = {p: f"127.0.0.1:{s.port}" for p, s in servers.items()}
    for peer, server in servers.items():
        partners = {q: a for q, a in address.items() if q != peer}
        await server.open_round(
            round_, _theta(peer), partners, codec=codecs[peer], feedback=banks[peer]
        )
    rounds = [s.exchange_round(round_, DEADLINE_S) for s in servers.values()]
    results = await asyncio.wait_for(asyncio.gather(*rounds), 3 * DEADLINE_S)
    return dict(zip(servers, results, strict=True))


def test_each_partner_gets_its_own_codec_in_both_directions_and_roles() -> None:
    """peer-a dials b and c, b dials c (the smaller id dials). a sends q4 to b and int8
    to c, b sends fp16 to a and q4 to c, c sends bf16 to both."""
    codecs: dict[str, str | Mapping[str, str]] = {
        "peer-a": {"peer-b": "q4", "peer-c": "int8"},
        "peer-b": {"peer-a": "fp16", "peer-c": "q4", "peer-z": "fp32"},  # extra: ignored
        "peer-c": "bf16",
    }
    sent_in = {
        ("peer-a", "peer-b"): "q4",
        ("peer-a", "peer-c"): "int8",
        ("peer-b", "peer-a"): "fp16",
        ("peer-b", "peer-c"): "q4",
        ("peer-c", "peer-a"): "bf16",
        ("peer-c", "peer-b"): "bf16",
    }

    async def scenario() -> None:
        banks = {p: FeedbackBank(NUMEL) for p in codecs}
        async with _servers(dict.fromkeys(codecs, ("fp32", "fp16", "bf16", "int8", "q4"))) as s:
            outcomes = await _round(s, codecs, banks)
        for (sender, receiver), codec in sent_in.items():
            got = outcomes[receiver][sender]
            assert isinstance(got, ExchangeResult), got
            assert got.codec == codec, (sender, receiver)
            back = outcomes[sender][receiver]
            assert isinstance(back, ExchangeResult) and back.codec_sent == codec
            # first round, zero residuals: exactly what one encoding decodes to
            assert torch.equal(got.theta, roundtrip(get_codec(codec), _theta(sender)))
            nbytes = get_codec(codec).encoded_nbytes(NUMEL)
            assert got.bytes_received == nbytes  # the payload
            assert nbytes < back.bytes_sent < nbytes + 4096  # + the header and framing
        assert banks["peer-a"].codecs == ("q4", "int8")  # one residual per lossy codec used
        assert banks["peer-b"].codecs == ("fp16", "q4")
        assert banks["peer-c"].codecs == ("bf16",)
        roles = {outcomes["peer-b"]["peer-a"].role, outcomes["peer-a"]["peer-b"].role}
        assert isinstance(outcomes["peer-b"]["peer-a"], ExchangeResult)
        assert roles == {"dial", "accept"}

    asyncio.run(scenario())


def test_a_codec_the_receiver_does_not_accept_is_refused_clearly() -> None:
    """peer-b accepts no q4. a dials b and sends q4: b, the acceptor, refuses the header
    and a's outcome names b's refusal. b dials c and gets c's q4 reply: b, the dialer,
    refuses it. a and c accept each other's codecs: their link is unaffected."""
    accepts = {
        "peer-a": ("fp32", "fp16", "int8", "q4"),
        "peer-b": ("fp32", "fp16", "int8"),
        "peer-c": ("fp32", "int8"),
    }
    codecs: dict[str, str | Mapping[str, str]] = {
        "peer-a": {"peer-b": "q4", "peer-c": "int8"},
        "peer-b": {"peer-a": "fp16", "peer-c": "int8"},
        "peer-c": "q4",
    }

    async def scenario() -> None:
        banks = {p: FeedbackBank(NUMEL) for p in codecs}
        async with _servers(accepts) as s:
            outcomes = await _round(s, codecs, banks)
            assert s["peer-b"].stats.rejected["codec-not-allowed"] == 2  # as acceptor, dialer
        a_from_b, b_from_a = outcomes["peer-a"]["peer-b"], outcomes["peer-b"]["peer-a"]
        assert not a_from_b.ok and a_from_b.reason == "refused:codec-not-allowed"
        assert "this peer accepts fp32, fp16, int8" in a_from_b.detail
        assert not b_from_a.ok and b_from_a.reason == "rejected:codec-not-allowed"
        assert b_from_a.role == "accept"
        b_from_c = outcomes["peer-b"]["peer-c"]
        assert not b_from_c.ok and b_from_c.reason == "rejected:codec-not-allowed"
        assert b_from_c.role == "dial"
        assert not outcomes["peer-c"]["peer-b"].ok  # b ended the call: nothing for c
        for receiver, sender in (("peer-a", "peer-c"), ("peer-c", "peer-a")):
            assert outcomes[receiver][sender].ok, (receiver, sender)
        assert outcomes["peer-a"]["peer-c"].codec == "q4"

    asyncio.run(scenario())


# -- round_messages --------------------------------------------------------------------


def test_partners_with_the_same_codec_share_one_message() -> None:
    theta = torch.randn(1000)
    with ThreadPoolExecutor(1) as pool:
        bank = FeedbackBank(1000)
        codecs = {"p1": "int8", "p2": "q4", "p3": "int8", "p4": "fp32"}
        main, by_peer = round_messages(theta, codecs, ["p1", "p2", "p3", "p4"], 4096, pool, bank)
        assert by_peer["p1"] is by_peer["p3"] is main  # the first partner's message
        assert len({id(m) for m in by_peer.values()}) == 3
        assert {p: m.codec.name for p, m in by_peer.items()} == codecs
        assert by_peer["p2"].nbytes == get_codec("q4").encoded_nbytes(1000)
        assert bank.codecs == ("int8", "q4")
        one, none = round_messages(theta, "fp16", ["p1"], 4096, pool, bank)
        assert one.codec.name == "fp16" and none == {}
        alone, nobody = round_messages(theta, {}, [], 4096, pool)
        assert alone.codec.name == "fp32" and nobody == {}


def test_round_messages_refuses_what_it_cannot_honour() -> None:
    theta = torch.randn(1000)
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match=r"no codec for partner.*'p2'"):
            round_messages(theta, {"p1": "int8"}, ["p1", "p2"], 4096, pool)
        with pytest.raises(ValueError, match="unknown codec"):
            round_messages(theta, {"p1": "zstd"}, ["p1"], 4096, pool)
        single = ErrorFeedback(get_codec("int8"), 1000)
        with pytest.raises(ValueError, match="FeedbackBank"):
            round_messages(theta, {"p1": "int8", "p2": "q4"}, ["p1", "p2"], 4096, pool, single)
        # one ErrorFeedback still serves its codec, next to lossless ones
        _, by_peer = round_messages(
            theta, {"p1": "int8", "p2": "fp32"}, ["p1", "p2"], 4096, pool, single
        )
        assert by_peer["p1"]._feedback is single and by_peer["p2"]._feedback is None
        with pytest.raises(ValueError, match="same codec"):  # as before, a single name
            round_messages(theta, "q4", ["p1"], 4096, pool, single)
