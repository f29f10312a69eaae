"""Finding the run again after a network cut: re-dialling the DHT neighbours we knew.

hivemind forgets a neighbour that fails one request (it leaves the routing table) and
bans it from searches for a time that doubles with each further failure. A peer whose
link went down for a minute thus comes back with an empty routing table and every old
neighbour banned: its lookups reach nobody, its roster shows only itself, and it would
train alone for good although every partner is reachable again. hivemind re-dials its
bootstrap peers only at start-up, so the daemon does it here: when its roster holds no
other peer, it clears the bans and pings the peers it has seen (and those it joined
through); every one that answers is back in the routing table, and one lookup of our own
id fills the rest, as a join does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterable

from hivemind import DHT
from hivemind.dht.node import DHTNode
from hivemind.p2p import PeerID

MAX_KNOWN = 32  # peers remembered for re-dialling; insiders only (records are authenticated)


def remember(known: dict[str, None], peer_ids: Iterable[str], cap: int = MAX_KNOWN) -> None:
    """Keep the ``cap`` most recently seen peer ids, newest last (an ordered set)."""
    for peer_id in peer_ids:
        known.pop(peer_id, None)
        known[peer_id] = None
    while len(known) > cap:
        del known[next(iter(known))]


async def _redial(_dht: DHT, node: DHTNode, *, peer_ids: tuple[str, ...], find_s: float) -> int:
    """Runs inside the DHT process (where the routing table and the bans live)."""
    node.blacklist.clear()
    answers = await asyncio.gather(
        *(node.protocol.call_ping(PeerID.from_base58(p)) for p in peer_ids),
        return_exceptions=True,
    )
    answered = sum(1 for a in answers if a is not None and not isinstance(a, BaseException))
    if answered:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(node.find_nearest_nodes([node.node_id]), timeout=find_s)
    return answered


async def redial(dht: DHT, peer_ids: Iterable[str], timeout_s: float) -> int:
    """How many of ``peer_ids`` answered and are our DHT neighbours again (0 on timeout)."""
    ids = tuple(dict.fromkeys(peer_ids))
    if not ids:
        return 0
    call = functools.partial(_redial, peer_ids=ids, find_s=timeout_s / 2)
    future = dht.run_coroutine(call, return_future=True)
    try:
        return int(await asyncio.wait_for(future, timeout_s))
    except TimeoutError:
        # Not future.cancel(): the DHT process would still finish the call (its pings
        # are bounded there) and then fail to set a cancelled future's result, a
        # traceback in every straggler's log (bench/results/network_stragglers.md).
        return 0
