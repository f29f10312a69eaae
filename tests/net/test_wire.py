"""Real peer processes on 127.0.0.1: exchanges per codec, dead and hung partners, a slow
reader, GetState and Status. (Bad input: test_wire_refusals.py; TLS: test_wire_tls.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import torch
import uvloop
from testkeys import auth_for
from wire_control import PeerProcess, start_peers
from wire_peer import FINGERPRINT, RUN_ID, theta_of
from wire_raw import data_messages, header, raw_exchange

from gaslocd.config import WireConfig
from gaslocd.net.auth import CallAuth
from gaslocd.net.client import PeerClient
from gaslocd.net.frames import frame_header
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.proto import peer_pb2_grpc
from gaslocd.net.validation import Identity, WireStats

pytestmark = [pytest.mark.net, pytest.mark.slow]

# Relative error of a received θ̃ per codec (cf. test_codecs.REL_ERROR_BOUND).
BOUND = {"fp32": 0.0, "fp16": 4e-4, "bf16": 3e-3, "int8": 1.2e-2, "q4": 0.125}
TRIO_NUMEL = 300_007  # odd: the last int8 block and the last chunk are partial


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PeerProcess]]:
    logs = Path(tmp_path_factory.mktemp("trio"))
    args = ["--numel", str(TRIO_NUMEL), "--chunk-bytes", str(256 * 1024)]
    peers = start_peers(logs, {p: args for p in ("p0", "p1", "p2")})
    yield peers
    for peer in peers.values():
        try:
            peer.quit()
        finally:
            peer.kill()


@pytest.mark.parametrize("codec", ["fp32", "fp16", "bf16", "int8"])
def test_three_peers_exchange_every_codec(trio: dict[str, PeerProcess], codec: str) -> None:
    """A random-ring round (2 partners each): every θ̃ arrives within the codec's bound,
    and both partners of a sender receive the very same bytes (one encoding, one EF step)."""
    r = {"fp32": 1, "fp16": 2, "bf16": 3, "int8": 4}[codec]
    for pid, peer in trio.items():
        partners = {q: trio[q].address for q in trio if q != pid}
        peer.start_round(r, partners, deadline_s=60, codec=codec, ef=True)
    done = {pid: peer.expect("round", 90) for pid, peer in trio.items()}
    for pid, result in done.items():
        for sender, outcome in result["outcomes"].items():
            assert outcome["ok"], (pid, sender, outcome)
            assert outcome["rel_err"] <= BOUND[codec], (pid, sender, outcome)
            assert outcome["peer_refusal"] is None
    for sender in trio:
        digests = {done[pid]["outcomes"][sender]["digest"] for pid in trio if pid != sender}
        assert len(digests) == 1, f"{sender} sent different bytes to its two partners"


def test_three_peers_exchange_with_a_codec_per_link(trio: dict[str, PeerProcess]) -> None:
    """Each peer sends each partner its own codec (p0 → p1 in q4, p1 → p0 in fp16, ...),
    with a residual per codec: every θ̃ arrives in the codec its sender chose for that
    link, within its bound."""
    codecs = {
        "p0": {"p1": "q4", "p2": "int8"},
        "p1": {"p0": "fp16", "p2": "q4"},
        "p2": {"p0": "bf16", "p1": "int8"},
    }
    for pid, peer in trio.items():
        partners = {q: trio[q].address for q in trio if q != pid}
        peer.start_round(5, partners, deadline_s=60, codec=codecs[pid], ef=True)  # after 1-4
    done = {pid: peer.expect("round", 90) for pid, peer in trio.items()}
    for pid, result in done.items():
        for sender, outcome in result["outcomes"].items():
            assert outcome["ok"], (pid, sender, outcome)
            assert outcome["codec"] == codecs[sender][pid], (pid, sender, outcome)
            assert outcome["codec_sent"] == codecs[pid][sender], (pid, sender, outcome)
            # residuals of earlier rounds' codecs ride along: √2 × one encoding's error
            assert outcome["rel_err"] <= 1.5 * BOUND[outcome["codec"]], (pid, sender, outcome)


def test_get_state_and_status(trio: dict[str, PeerProcess]) -> None:
    async def scenario() -> None:
        config = WireConfig(token="tok")
        me = Identity(RUN_ID, "newcomer", FINGERPRINT)
        sizes = {"theta": TRIO_NUMEL, "outer_momentum": TRIO_NUMEL}
        with ThreadPoolExecutor(1) as pool:
            client = PeerClient(config, me, pool, WireStats(), auth_for(RUN_ID, "newcomer"))
            try:
                state = await client.fetch_state(trio["p1"].address, sizes, 30, peer="p1")
                theta = theta_of("p1", TRIO_NUMEL, 0)
                assert torch.equal(state.tensors["theta"], theta)
                assert torch.equal(state.tensors["outer_momentum"], 0.5 * theta)
                assert (state.round, state.data_position) == (7, 12345)
                assert state.extra == {"note": "from wire_peer"}
                reply = await client.status(trio["p1"].address, 10)
                assert (reply.peer_id, reply.run_id, reply.fields["role"]) == ("p1", RUN_ID, "test")
                # the generated stub talks to the server too (the wire is plain protobuf)
                # (an operator's status: the run credential alone, no peer key, any target)
                stub = peer_pb2_grpc.PeerStub(client.channel(trio["p2"].address))
                status = CallAuth(RUN_ID, "tok", "op", None, lambda _p: None)
                request = pb.StatusRequest(run_id=RUN_ID)
                md = status.metadata("", "Status")[0]
                reply = await stub.Status(request, timeout=10, metadata=md)
                assert reply.peer_id == "p2"
                for md in (
                    (),
                    CallAuth(RUN_ID, "bad", "op", None, lambda _p: None).metadata("", "Status")[0],
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.Status(request, timeout=10, metadata=md)
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                # a newcomer with the wrong token: refused before anything is streamed
                bad = PeerClient(config, me, pool, WireStats(), auth_for(RUN_ID, "newcomer", "bad"))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await bad.fetch_state(trio["p1"].address, sizes, 10, peer="p1")
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                # a sybil answering at p1's address for p2 cannot prove it is p2
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.fetch_state(trio["p1"].address, sizes, 10, peer="p2")
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # wrong-target
                await bad.close()
            finally:
                await client.close()

    uvloop.run(scenario())


@pytest.mark.parametrize("victim", ["a-dies", "c-dies"])  # the dialer, then the acceptor
def test_a_partner_killed_mid_stream_costs_at_most_the_deadline(
    tmp_path: Path, reaper: list, victim: str
) -> None:
    numel, deadline_s = 2_000_000, 8.0
    args = ["--numel", str(numel), "--chunk-bytes", str(256 * 1024)]
    peers = start_peers(tmp_path, {victim: [*args, "--die-after-chunks", "3"], "b-live": args})
    reaper.extend(p.proc for p in peers.values())
    live, dying = peers["b-live"], peers[victim]
    live.start_round(1, {victim: dying.address}, deadline_s=deadline_s)
    dying.start_round(1, {"b-live": live.address}, deadline_s=deadline_s)
    done = live.expect("round", deadline_s + 30)
    assert dying.proc.wait(10) == -9  # it really was SIGKILLed mid-stream
    outcome = done["outcomes"][victim]
    assert not outcome["ok"], outcome
    assert done["elapsed_s"] <= deadline_s + 1.0, done
    assert done["model_after"] == done["model_before"]
    live.quit()
    dying.close_pipes()


def test_a_hung_partner_costs_the_deadline_and_no_more(tmp_path: Path, reaper: list) -> None:
    """The partner sends its header and one chunk, then stalls with the socket open."""
    numel, chunk, deadline_s = 200_000, 64 * 1024, 3.0
    srv = PeerProcess("b-srv", tmp_path, "--numel", str(numel), "--chunk-bytes", str(chunk))
    reaper.append(srv.proc)
    srv.start_round(1, {"a-hung": "127.0.0.1:9"}, deadline_s=deadline_s)
    messages = [
        frame_header(header(numel, chunk, sender="a-hung")),
        data_messages(theta_of("a-hung", numel, 0), chunk)[0],
    ]
    start = time.monotonic()
    result = uvloop.run(raw_exchange(srv.address, messages, timeout_s=30, hang_after_send=True))
    assert time.monotonic() - start < deadline_s + 5
    assert result.code == grpc.StatusCode.DEADLINE_EXCEEDED, result
    done = srv.expect("round", 30)
    assert done["outcomes"]["a-hung"] == {
        "ok": False,
        "reason": "deadline",
        "detail": "round closed",
    }
    assert deadline_s - 0.5 <= done["elapsed_s"] <= deadline_s + 1.0
    srv.quit()


def test_a_slow_reader_does_not_make_the_sender_buffer_the_model(
    tmp_path: Path, reaper: list
) -> None:
    """Flow control end to end: the acceptor streams a 64 MiB θ̃ to a caller that reads one
    1 MiB chunk every 50 ms; the acceptor's resident memory must not grow by the model."""
    numel, chunk = 16 << 20, 1 << 20
    model_bytes = 4 * numel
    srv = PeerProcess("b-big", tmp_path, "--numel", str(numel), "--chunk-bytes", str(chunk))
    reaper.append(srv.proc)
    srv.start_round(1, {"a-slow": "127.0.0.1:9"}, deadline_s=60)
    baseline = srv.rss_bytes()
    peak = [baseline]

    def sample(_: int) -> None:
        peak.append(srv.rss_bytes())

    messages = [frame_header(header(numel, chunk, sender="a-slow"))]  # and then no data
    result = uvloop.run(
        raw_exchange(
            srv.address,
            messages,
            timeout_s=60,
            read_delay_s=0.05,
            stop_after_replies=30,
            hang_after_send=True,
            on_reply=sample,
            target="b-big",
        )
    )
    assert result.replies == 30
    growth = max(peak) - baseline
    assert growth < model_bytes / 4, f"sender grew by {growth / 2**20:.1f} MiB for a 64 MiB model"
    done = srv.expect("round", 90)
    assert not done["outcomes"]["a-slow"]["ok"]
    srv.quit()
