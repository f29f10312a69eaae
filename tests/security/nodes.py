"""Attackers for the live-daemon security tests, each on its own event-loop thread.

- :class:`IdleStrangers`: callers without credentials that keep opening Exchange calls
  and hold them as long as they are allowed to (the 100-idle-callers finding).
- :class:`HostileNode`: an insider with the run's token and a DHT identity of its own:
  it publishes a roster record pointing at a :class:`~tests.net.hostile.HostilePeer`
  server that aborts every exchange after its header and serves a hostile state.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
from hivemind.utils.crypto import RSAPrivateKey

import gaslocd
from gaslocd.net.auth import CallAuth
from gaslocd.net.client import EXCHANGE
from gaslocd.net.discovery import Discovery
from gaslocd.net.identity import write_identity
from gaslocd.net.roster_auth import peer_id_of_owner
from gaslocd.protocol.records import PeerRecord
from tests.daemon.procs import Daemon, wait_checkpoint
from tests.net.hostile import HostilePeer


@dataclass
class Site:
    """Honest daemons under attack, and what an attacker needs to know of them (the live
    security tests and bench/security.py)."""

    daemons: list[Daemon]
    ids: list[str]
    addresses: list[str]
    metrics: list[int]
    bootstrap: str
    fingerprint: str
    numel: int
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    poisoner: Daemon | None = None  # an insider daemon in the run (bench/security.py)
    attackers: list[int] = field(default_factory=list)  # attacker processes (pids)

    @classmethod
    def of(
        cls, daemons: list[Daemon], metrics: list[int], bootstrap: str, tmp: Path, **more: Any
    ) -> Site:
        """The site of running ``daemons``, its model read from ``tmp/c0``'s checkpoint."""
        found = [d.find(r"peer (\S+) run (\S+) gRPC (\S+)") for d in daemons]
        saved = wait_checkpoint(tmp / "c0" / "checkpoint.pt", 120)
        theta = saved["theta"]
        assert isinstance(theta, torch.Tensor)
        ids, addresses = [m.group(1) for m in found], [m.group(3) for m in found]
        fingerprint = str(saved["fingerprint"])
        return cls(
            daemons, ids, addresses, metrics, bootstrap, fingerprint, theta.numel(), tmp, **more
        )


def refused_counts(port: int) -> Counter[str]:
    """A daemon's ``gasloc_calls_refused_total`` by reason, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.findall(r'gasloc_calls_refused_total\{reason="([^"]+)"\} (\S+)', text)
    return Counter({reason: int(float(n)) for reason, n in found})


class _LoopThread:
    """An event loop on a thread of its own; ``run`` submits a coroutine to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class IdleStrangers(_LoopThread):
    """``per_address`` callers per address, each opening an Exchange call, holding it
    until it is ended, then (a second later) opening the next, until :meth:`stop`."""

    def __init__(self, addresses: list[str], per_address: int = 100) -> None:
        super().__init__()
        self.codes: Counter[str] = Counter()
        self._stop = asyncio.Event()
        self._callers = [
            asyncio.run_coroutine_threadsafe(self._caller(address), self.loop)
            for address in addresses
            for _ in range(per_address)
        ]

    async def _caller(self, address: str) -> None:
        async with grpc.aio.insecure_channel(address) as chan:
            while not self._stop.is_set():
                call = chan.stream_stream(EXCHANGE)(timeout=30.0)
                try:
                    while await call.read() is not grpc.aio.EOF:
                        pass
                    self.codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    self.codes[exc.code().name] += 1
                with contextlib.suppress(TimeoutError):  # the attack's pace, 1 call/s each
                    await asyncio.wait_for(self._stop.wait(), 1.0)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        for caller in self._callers:
            try:
                caller.result(10)  # each sees the flag within its 1 s pace
            except Exception:
                caller.cancel()
        self.close()


def identity_above(ids: list[str], path: Path) -> str:
    """Write a DHT identity whose peer id sorts after every one of ``ids`` (so their
    owners dial it), and return that id."""
    while True:
        key = RSAPrivateKey()
        peer = peer_id_of_owner(key.get_public_key().to_bytes())
        if all(peer > other for other in ids):
            write_identity(str(path), key)
            return peer


class HostileNode(_LoopThread):
    """An insider in the roster whose server misbehaves (see the module doc)."""

    def __init__(
        self,
        run_id: str,
        token: str,
        bootstrap: str,
        fingerprint: str,
        numel: int,
        identity: Path | None = None,
        round_: int | None = None,
    ) -> None:
        super().__init__()
        self.discovery = Discovery(
            run_id,
            initial_peers=[bootstrap],
            token=token,
            record_ttl_s=10.0,
            identity_path=None if identity is None else str(identity),
            start_timeout_s=120.0,  # a loaded 2-core CI machine can take over 30 s
        )
        self.discovery.start()
        d = self.discovery
        auth = CallAuth(
            run_id,
            token,
            d.peer_id,
            d.private_key,
            d.public_key_of,
            peer_id_of_key=peer_id_of_owner,
        )
        self.peer = HostilePeer(
            auth, fingerprint, numel, 64 * 1024, lambda _c: "abort-after-header"
        )
        self.peer.state_round, self.peer.momentum_scale = 2**60, 1e30
        self.address = self.run(self.peer.start())
        self._fixed_round = round_
        self._beat = asyncio.run_coroutine_threadsafe(self._heartbeat(fingerprint), self.loop)

    async def _heartbeat(self, fingerprint: str) -> None:
        started = time.time()
        while True:
            records = await self.discovery.roster(fingerprint)
            latest = max((r.round for r in records), default=0)
            round_ = self._fixed_round if self._fixed_round is not None else latest
            record = PeerRecord(
                peer_id=self.discovery.peer_id,
                address=self.address,
                fingerprint=fingerprint,
                round=round_,
                inner_steps=4,
                step_time_s=0.05,
                bandwidth_bytes_per_s=0.0,
                version=gaslocd.__version__,
                started_at=started,
                active_from=round_,
            )
            await self.discovery.publish(record)
            await asyncio.sleep(1.0)  # the heartbeat period, not a synchronisation

    def exchanges_seen(self) -> int:
        return self.peer.calls["Exchange"]

    def shutdown(self) -> None:
        self._beat.cancel()
        with contextlib.suppress(Exception):
            self.run(self.peer.stop(), 10)
        self.close()
        self.discovery.shutdown(quick=True)
