"""A real peer process for the wire tests: an ExchangeServer driven by JSON lines on stdin.

Prints ``READY <port>`` once serving, then one JSON line per command result. Its θ̃ is a
deterministic function of (seed, peer id), so every process can check what it received
from a partner against what that partner must have sent. Fault injection for the tests:
``--die-after-chunks K`` SIGKILLs this process after it framed K data chunks.

Commands: ``{"op": "round", "round", "partners", "codec", "deadline_s", "ef"}`` opens the
round (answers ``{"op": "opened"}``), exchanges and answers with the outcomes (``codec``:
one name, or one per partner); ``{"op": "stats"}``; ``{"op": "quit"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
import time
import zlib

import testkeys
import torch
import uvloop

from gaslocd.config import WireConfig
from gaslocd.net import stream
from gaslocd.net.codecs import FeedbackBank
from gaslocd.net.server import ExchangeServer
from gaslocd.net.state import PeerState
from gaslocd.net.validation import Identity

RUN_ID = "test-run"
FINGERPRINT = "tiny:test"


def base_vector(numel: int, seed: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


def theta_of(peer: str, numel: int, seed: int) -> torch.Tensor:
    """The θ̃ peer ``peer`` offers: a shared base plus a small per-peer difference."""
    noise = torch.randn(numel, generator=torch.Generator().manual_seed(zlib.crc32(peer.encode())))
    return base_vector(numel, seed) + 0.01 * noise


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def _die_after(k: int) -> None:
    framed = stream.OutgoingMessage.framed
    count = 0

    async def counting(self: stream.OutgoingMessage, i: int) -> bytes:
        nonlocal count
        count += 1
        if count > k:
            os.kill(os.getpid(), signal.SIGKILL)
        return await framed(self, i)

    stream.OutgoingMessage.framed = counting  # type: ignore[method-assign]


class Peer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.theta = theta_of(args.peer_id, args.numel, args.seed)
        self.model = self.theta.clone()  # changed only by outcomes that passed every check
        self.feedback = FeedbackBank(args.numel)  # a residual per lossy codec used
        config = WireConfig(
            token=args.token,
            chunk_bytes=args.chunk_bytes,
            max_chunk_bytes=max(args.chunk_bytes, 4 << 20),
            norm_bound=args.norm_bound,
            accept_wait_s=args.accept_wait_s,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_ca=args.tls_ca,
            tls_server_name=args.tls_server_name,
        )
        self.server = ExchangeServer(
            config,
            Identity(RUN_ID, args.peer_id, FINGERPRINT),
            auth=testkeys.auth_for(RUN_ID, args.peer_id, args.token),
        )
        self.server.set_state_provider(self.state)
        self.server.status_provider = lambda: {"numel": args.numel, "role": "test"}

    def state(self) -> PeerState:
        return PeerState(
            round=7,
            data_position=12345,
            tensors={"theta": self.theta.clone(), "outer_momentum": 0.5 * self.theta},
            extra={"note": "from wire_peer"},
        )

    async def do_round(self, cmd: dict) -> dict:
        codec = cmd.get("codec", "fp32")  # one name, or {partner: name}
        feedback = self.feedback if cmd.get("ef") else None
        before = digest(self.model)
        await self.server.open_round(
            cmd["round"], self.theta, cmd["partners"], codec=codec, feedback=feedback
        )
        emit({"op": "opened", "round": cmd["round"]})
        start = time.monotonic()
        outcomes = await self.server.exchange_round(cmd["round"], cmd["deadline_s"])
        elapsed = time.monotonic() - start
        report = {}
        for peer, out in outcomes.items():
            if out.ok:
                expected = theta_of(peer, self.args.numel, self.args.seed)
                err = float((out.theta - expected).norm() / expected.norm())
                self.model = 0.5 * (self.model + out.theta)
                report[peer] = {
                    "ok": True,
                    "rel_err": err,
                    "digest": digest(out.theta),
                    "transfer_s": out.transfer_s,
                    "bytes_received": out.bytes_received,
                    "peer_refusal": out.peer_refusal,
                    "role": out.role,
                    "codec": out.codec,
                    "codec_sent": out.codec_sent,
                }
            else:
                report[peer] = {"ok": False, "reason": out.reason, "detail": out.detail}
        return {
            "op": "round",
            "round": cmd["round"],
            "elapsed_s": elapsed,
            "outcomes": report,
            "model_before": before,
            "model_after": digest(self.model),
            "stats": self.server.stats.snapshot(),
        }


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(args: argparse.Namespace) -> None:
    peer = Peer(args)
    port = await peer.server.start("127.0.0.1", 0)
    emit({"op": "ready", "port": port, "pid": os.getpid()})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    running: set[asyncio.Task[None]] = set()

    async def run(cmd: dict) -> None:
        emit(await peer.do_round(cmd))

    while line := await reader.readline():
        cmd = json.loads(line)
        if cmd["op"] == "round":
            task = asyncio.ensure_future(run(cmd))
            running.add(task)
            task.add_done_callback(running.discard)
        elif cmd["op"] == "stats":
            emit({"op": "stats", "stats": peer.server.stats.snapshot()})
        elif cmd["op"] == "quit":
            break
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    await peer.server.stop(0.5)
    emit({"op": "bye"})


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--peer-id", required=True)
    p.add_argument("--numel", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token", default="tok")
    p.add_argument("--chunk-bytes", type=int, default=256 * 1024)
    p.add_argument("--norm-bound", type=float, default=1.0)
    p.add_argument("--accept-wait-s", type=float, default=10.0)
    p.add_argument("--die-after-chunks", type=int, default=None)
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--tls-ca")
    p.add_argument("--tls-server-name")
    parsed = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(1)
    if parsed.die_after_chunks is not None:
        _die_after(parsed.die_after_chunks)
    uvloop.run(main(parsed))
