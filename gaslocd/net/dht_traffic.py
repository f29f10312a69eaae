"""What our DHT node's RPCs carry, by RPC and side, so a slow link's DHT share can be told apart.

A peer on a slow link (a 10× straggler: 0.36 Mbit/s) found about half of it used by
something other than θ̃, and its p2pd connections alone carried 1.5 MiB a minute
(bench/results/network_stragglers.md). What of that is our own publishes, the others'
stores to us, the answers our node gives to their roster reads, or hivemind's upkeep
(pings, routing-table refreshes) could not be seen from outside: libp2p encrypts and
multiplexes it all over one connection per neighbour. Counting in the DHT process, at
hivemind's RPC layer, can: every RPC our node *serves* (a request in, a response out) and
every one it *calls*, with the protobuf sizes of both messages.

The sizes are the messages' own, without libp2p's framing, encryption and p2pd's
control traffic: a floor for the bytes on the link, by cause. The daemon reads the tally
at each heartbeat (:func:`tally`, through ``DHT.run_coroutine``) and exports it as
``gasloc_dht_rpc_bytes_total`` and ``gasloc_dht_rpcs_total``.

What it showed first (bench/stragglers_net.py, 10× T): the fast hosts' nodes searched the
roster key two to three times as often as their full reads and record lifetimes explain,
and the straggler's node answered 340 finds in two minutes, 1.5 MB, each a whole roster.
hivemind's own caching explains it: a read that finds a roster newer than our node's copy
caches it, and a cached key that is read again gets re-read over the network shortly
before it expires (``cache_refresh_before_expiry``), again after each re-read while the
daemon keeps reading: in tests/net/test_discovery.py one such read and 3 s of quick reads
made 22 finds. It may also push what it found to another node (``cache_nearest``). Our
roster reads decide for themselves when to ask other nodes
(:mod:`gaslocd.net.roster_read`), so the daemon's DHT node runs with both off.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from hivemind.dht.protocol import DHTProtocol

RPCS = ("ping", "store", "find")
SIDES = ("served", "called")
# (rpc, side) -> [calls, bytes we sent, bytes we received]; lives in the DHT process
_TALLY: dict[tuple[str, str], list[int]] = {}


def _size(message: Any) -> int:
    byte_size = getattr(message, "ByteSize", None)
    return int(byte_size()) if callable(byte_size) else 0


def _count(rpc: str, side: str, request: Any, response: Any) -> None:
    row = _TALLY.setdefault((rpc, side), [0, 0, 0])
    ours, theirs = (response, request) if side == "served" else (request, response)
    row[0] += 1
    row[1] += _size(ours)
    row[2] += _size(theirs)


class _Counting:
    """A stand-in for hivemind's RPC wrapper (a servicer's or a stub's) that counts each
    ``rpc_*`` call it passes on; anything else is the wrapped object's own."""

    def __init__(self, inner: Any, side: str) -> None:
        self._inner, self._side = inner, side

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        rpc = name.removeprefix("rpc_")
        if not name.startswith("rpc_") or rpc not in RPCS:
            return method

        @functools.wraps(method)
        async def counted(request: Any, *args: Any, **kwargs: Any) -> Any:
            response = await method(request, *args, **kwargs)
            # A request is signed in place by hivemind's wrapper (client side): sized after.
            _count(rpc, self._side, request, response)
            return response

        return counted


def install() -> None:
    """In the DHT process, before its node starts: count the RPCs of every protocol it
    creates. Idempotent (a forked child may inherit a patched class)."""
    if getattr(DHTProtocol, "_gasloc_counted", False):
        return
    add_handlers: Callable[..., Awaitable[None]] = DHTProtocol.add_p2p_handlers
    get_stub: Callable[..., Any] = DHTProtocol.get_stub

    async def add_p2p_handlers(self: Any, p2p: Any, wrapper: Any = None, **kw: Any) -> None:
        servicer = _Counting(self if wrapper is None else wrapper, "served")
        await add_handlers(self, p2p, servicer, **kw)

    def counted_stub(self: Any, peer: Any) -> Any:
        return _Counting(get_stub(self, peer), "called")

    DHTProtocol.add_p2p_handlers = add_p2p_handlers
    DHTProtocol.get_stub = counted_stub
    DHTProtocol._gasloc_counted = True


async def tally(_dht: Any, _node: Any) -> dict[str, list[int]]:
    """``DHT.run_coroutine``: the counts so far, ``"rpc/side" -> [calls, sent, received]``."""
    return {f"{rpc}/{side}": list(row) for (rpc, side), row in _TALLY.items()}
