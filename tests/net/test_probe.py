"""The dial-back probe (``Probe``) between real gRPC servers on 127.0.0.1, and a real DHT
node that stops serving when its peer is found behind NAT.

What a hostile caller could try is covered too: naming another peer's port (the prober
checks whose server answers), asking many dial-backs at once (one per caller, a few in
all), a request under someone else's name, no credentials."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from testkeys import auth_for

from gaslocd.config import WireConfig
from gaslocd.net import probe
from gaslocd.net.client import PROBE
from gaslocd.net.probe import observed_host, verdict
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.server import ExchangeServer
from gaslocd.net.validation import Identity

RUN, FP, TOKEN = "probe-run", "fp-1", "t0k"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:5555", "127.0.0.1"),
        ("ipv6:[::1]:5555", "::1"),
        ("ipv6:%5B::1%5D:5555", "::1"),
        ("ipv4:10.0.0.2:1", "10.0.0.2"),
        ("unix:/tmp/x.sock", None),
        ("ipv4:not-an-ip:5", None),
        ("", None),
    ],
)
def test_observed_host_is_an_ip_or_nothing(peer: str, host: str | None) -> None:
    assert observed_host(peer) == host


def test_one_yes_proves_a_port_open_and_no_needs_every_answer() -> None:
    yes, no = pb.ProbeReply(grpc_reachable=True), pb.ProbeReply()
    assert verdict([]) is None
    assert verdict([no, yes]) == probe.Reach(grpc=True, dht=False)
    assert verdict([no, no]) == probe.Reach(grpc=False, dht=False)
    assert verdict([pb.ProbeReply(dht_reachable=True), no]) == probe.Reach(grpc=False, dht=True)


@contextlib.asynccontextmanager
async def _servers(*peers: str) -> AsyncIterator[dict[str, ExchangeServer]]:
    servers = {
        p: ExchangeServer(
            WireConfig(token=TOKEN), Identity(RUN, p, FP), auth=auth_for(RUN, p, TOKEN)
        )
        for p in peers
    }
    for server in servers.values():
        await server.start("127.0.0.1", 0)
    try:
        yield servers
    finally:
        for server in servers.values():
            await server.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.net
def test_probe_says_whether_the_callers_own_server_and_dht_port_answer() -> None:
    async def scenario() -> None:
        listener = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
        dht = listener.sockets[0].getsockname()[1]
        async with _servers("peer-a", "peer-b", "peer-c") as s:
            a, b, c = s["peer-a"], s["peer-b"], s["peer-c"]
            at_a = f"127.0.0.1:{a.port}"
            reply = await b.client.probe(at_a, "peer-a", b.port, dht, 10.0)
            assert (reply.grpc_reachable, reply.dht_reachable) == (True, True)
            assert reply.observed_host == "127.0.0.1"
            # Nothing listens there: no.
            reply = await b.client.probe(at_a, "peer-a", _closed_port(), _closed_port(), 10.0)
            assert (reply.grpc_reachable, reply.dht_reachable) == (False, False)
            # Another peer's server answers there, not b's: no (b cannot borrow c's port).
            reply = await b.client.probe(at_a, "peer-a", c.port, 0, 10.0)
            assert not reply.grpc_reachable and not reply.dht_reachable
        listener.close()

    asyncio.run(scenario())


async def _raw(address: str, sender: str, request: pb.ProbeRequest, signed: bool = True) -> str:
    metadata = auth_for(RUN, sender, TOKEN).metadata("peer-a", "Probe")[0] if signed else None
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(PROBE, response_deserializer=pb.ProbeReply.FromString)
        try:
            await call(request.SerializeToString(), timeout=10.0, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name} {exc.details()}"
        return "OK"


@contextlib.asynccontextmanager
async def _tarpit() -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A port that accepts and never answers, and an event set once someone connected."""
    held: list[asyncio.StreamWriter] = []
    arrived = asyncio.Event()

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        arrived.set()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], arrived
    finally:
        for writer in held:
            writer.close()
        server.close()


@pytest.mark.net
def test_a_hostile_caller_gets_one_dial_back_at_a_time_and_no_more_than_a_few_in_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dial-back into a port that accepts and never answers takes the whole
    ``DIAL_BACK_S``: a second one from the same caller, or one more than ``MAX_PROBES``
    in all, is refused while those are in flight; bad requests are refused outright."""
    monkeypatch.setattr(probe, "DIAL_BACK_S", 2.0)

    def req(sender: str, port: int) -> pb.ProbeRequest:
        return pb.ProbeRequest(run_id=RUN, sender=sender, grpc_port=port)

    async def scenario() -> None:
        async with _servers("peer-a") as s, contextlib.AsyncExitStack() as stack:
            at_a = f"127.0.0.1:{s['peer-a'].port}"
            # One tarpit per caller: gRPC would share one connection to the same target.
            pits = [await stack.enter_async_context(_tarpit()) for _ in range(probe.MAX_PROBES)]
            slow, arrived = pits[0]
            first = asyncio.ensure_future(_raw(at_a, "peer-x", req("peer-x", slow)))
            await asyncio.wait_for(arrived.wait(), 10.0)  # x's dial-back is in flight
            again = await _raw(at_a, "peer-x", req("peer-x", slow))
            assert again.startswith("RESOURCE_EXHAUSTED") and "probe-busy" in again
            assert await first == "OK"  # and it says no, once the dial-back timed out

            callers = [f"peer-{i}" for i in range(probe.MAX_PROBES)]
            flights = [
                asyncio.ensure_future(_raw(at_a, p, req(p, port)))
                for p, (port, _) in zip(callers, pits, strict=True)
            ]
            for _port, event in pits:
                event.clear()
            await asyncio.wait_for(asyncio.gather(*(e.wait() for _, e in pits)), 10.0)
            extra = await _raw(at_a, "peer-late", req("peer-late", slow))
            assert extra.startswith("RESOURCE_EXHAUSTED") and "probe-busy" in extra
            assert await asyncio.gather(*flights) == ["OK"] * probe.MAX_PROBES

            assert "wrong-sender" in await _raw(at_a, "peer-x", req("peer-y", slow))
            assert "malformed" in await _raw(at_a, "peer-x", req("peer-x", 0))
            wrong_run = pb.ProbeRequest(run_id="other", sender="peer-x", grpc_port=1)
            assert "wrong-run" in await _raw(at_a, "peer-x", wrong_run)
            unsigned = await _raw(at_a, "peer-x", req("peer-x", slow), signed=False)
            assert unsigned.startswith("UNAUTHENTICATED")
            assert s["peer-a"].stats.refused["unauthenticated"] == 1

    asyncio.run(scenario())


@pytest.mark.net
def test_a_dht_node_found_dialable_starts_serving_in_place() -> None:
    """A joiner on ``auto`` starts its DHT node as a client: nobody can join through it.
    Once found dialable, ``become_dht_server`` (same process, no restart) makes it one
    that others can join through. In its own process (``promote_peer.py``): this one has
    run gRPC, and a DHT forks."""
    script = Path(__file__).with_name("promote_peer.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"before": False, "promoted": True, "again": True, "after": True, "roster": 0}
