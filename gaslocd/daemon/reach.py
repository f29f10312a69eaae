"""``--reachable auto``: find out at start-up whether other peers can dial this one.

A newcomer (one that joins through ``--bootstrap``) asks up to :data:`PROBERS` live,
reachable peers to dial it back (:mod:`gaslocd.net.probe`), after its gRPC server and
DHT node are up and before its record is published. The verdict then decides:

- its record's ``reachable`` (the pairing never puts two unreachable peers together, and
  a reachable partner is the one that dials);
- its DHT node, started as a client: one that can be dialled starts serving (in place);
- whether it prints a bootstrap address at all.

The first peer of a run (no ``--bootstrap``) has nobody to ask: it is taken as dialable,
which it must be anyway, since everyone joins through it. Nobody answering is not a
verdict either: the peer keeps its DHT node and says reachable, with a warning that
names ``--reachable no``. A DiLoCo peer found unreachable stops with one clear line:
its averager (hivemind's, a process forked at start-up, which cannot be forked again
once gRPC runs) already serves; with ``--reachable no`` it starts as a client instead,
whose part of the all-reduce the reachable members reduce.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from pathlib import Path

from gaslocd.config import DaemonConfig
from gaslocd.daemon.membership import POLL_S, StartupError
from gaslocd.daemon.runtime import Runtime
from gaslocd.net.discovery import DiscoveryError
from gaslocd.net.probe import DIAL_BACK_S, Reach, become_dht_server, verdict
from gaslocd.net.proto import peer_pb2 as pb

log = logging.getLogger(__name__)

PROBERS = 2  # peers asked: one "yes" proves it, and two "no"s rarely both err
PROBE_CALL_S = DIAL_BACK_S + 5.0  # the prober's dial-back plus the call itself
LOOKAROUND_S = 10.0  # how long a newcomer looks for a reachable peer to ask


def probes(cfg: DaemonConfig) -> bool:
    """Whether this daemon probes at start-up; its DHT node then starts as a client."""
    return cfg.reachable == "auto" and bool(cfg.bootstrap)


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def dht_port(maddrs: list[str]) -> int:
    """The TCP port of our DHT node's multiaddrs (``/ip4/…/tcp/PORT/p2p/…``); 0 if none."""
    for maddr in maddrs:
        found = re.search(r"/tcp/(\d+)", maddr)
        if found:
            return int(found.group(1))
    return 0


async def ask_probers(rt: Runtime) -> list[pb.ProbeReply]:
    """Answers of up to :data:`PROBERS` reachable peers: stops at a "yes" for both ports,
    or once every reachable peer in the roster was asked, or after :data:`LOOKAROUND_S`."""
    ports = _port(rt.address), dht_port(rt.discovery.bootstrap_addresses())
    deadline = rt.clock() + LOOKAROUND_S
    asked: set[str] = set()
    answers: list[pb.ProbeReply] = []
    while not rt.stopping and rt.clock() < deadline:
        records = []
        with contextlib.suppress(DiscoveryError):
            records = await rt.discovery.roster()
        fresh = [r for r in records if r.reachable and r.peer_id not in {rt.me, *asked}]
        random.shuffle(fresh)
        for record in fresh[: PROBERS - len(answers)]:
            asked.add(record.peer_id)
            try:
                reply = await rt.server.client.probe(
                    record.address, record.peer_id, *ports, PROBE_CALL_S
                )
            except Exception as exc:  # an old version, a busy or a gone prober: ask another
                log.info("probe by %s failed: %s", record.address, exc)
                continue
            answers.append(reply)
            if reply.grpc_reachable and reply.dht_reachable:
                return answers
        if len(answers) >= PROBERS or (answers and not fresh):
            return answers
        await asyncio.sleep(POLL_S)  # a roster poll's pause, bounded by `deadline`
    return answers


async def settle(rt: Runtime, all_reduce: bool) -> None:
    """Set ``rt.reachable`` and ``rt.dht_serving`` from the flag, or from probes (auto)."""
    cfg = rt.cfg
    if cfg.reachable != "auto":
        rt.reachable = rt.dht_serving = cfg.reachable == "yes"
        return
    if not probes(cfg):
        log.info("reachable: assumed (the first peer; everyone joins through it)")
        return
    answers = await ask_probers(rt)
    reach = verdict(answers)
    if reach is None:
        log.warning(
            "no live peer could check whether others can dial this one: assuming they can "
            "(if this peer is behind NAT, pass --reachable no)"
        )
        await _apply(rt, Reach(grpc=True, dht=True))
        return
    seen = answers[0].observed_host
    rt.progress(
        f"reachable: gRPC {_yes(reach.grpc)}, DHT {_yes(reach.dht)} (seen as {seen} by "
        f"{len(answers)} peer{'s' if len(answers) > 1 else ''})"
    )
    if all_reduce and not (reach.grpc and reach.dht):
        raise StartupError(
            f"other peers cannot dial this one (seen as {seen}), and DiLoCo's averager "
            "started as one they can: start again with --reachable no (it then averages "
            "as a client of reachable peers), or forward the --port and --dht-port"
        )
    await _apply(rt, reach)


async def _apply(rt: Runtime, reach: Reach) -> None:
    """Our record's flag, and our DHT node (a joiner on auto starts it as a client)."""
    rt.reachable, rt.dht_serving = reach.grpc, False
    if not (reach.grpc and reach.dht):
        return
    try:
        rt.dht_serving = await become_dht_server(rt.discovery.dht)
    except Exception as exc:  # a client still reads and stores through the others
        log.warning("could not start serving the DHT (it stays a client): %s", exc)


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def share_bootstrap(rt: Runtime) -> str:
    """Write our bootstrap address to ``--address-file`` and say it; a node that does not
    serve the DHT writes none (a restarting compose fleet would try it in vain)."""
    if not rt.dht_serving:
        return (
            "bootstrap address: none (this peer cannot be dialled: give newcomers the "
            "address of a reachable peer)"
        )
    bootstrap = rt.discovery.bootstrap_addresses()
    if rt.cfg.address_file:
        Path(rt.cfg.address_file).write_text("\n".join(bootstrap) + "\n")
    return f"bootstrap address: {bootstrap[0]}"
