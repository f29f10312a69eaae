"""Publishing a record without waiting for the slowest DHT node.

hivemind's ``store`` first traverses the DHT for the nodes nearest the key and only then
stores, and the traversal waits for every node of its beam to answer. In a run of a few
peers every node is in the beam, so one node behind a saturated link (a straggler whose
uplink carries a long exchange) holds every peer's publish for seconds: at 10× T the
fast hosts' own round records took over 5 s to publish (bench/results/network_stragglers
logs, "DHT publish did not finish within 5 s"), their peers saw them a round or more
behind and paced on them, and the fast hosts spent most of their rounds filling instead
of exchanging.

:func:`direct_store` runs inside the DHT process. It stores the signed entry on our own
node and sends it at once, in parallel, to the nodes our routing table already holds
nearest the key, so a fast peer's record reaches the other fast peers in one round trip,
whatever the slow one does. It waits for those stores a bounded moment only, and leaves
them and one regular (traversing) store running in the background: the traversal still
finds nearer nodes our table lacks, in a large run. Every receiver validates the entry as
it would any store (same signature, same validators); this changes who is asked first,
not what is accepted.

That traversal runs once per record lifetime (the entry's time to expiry), not per
heartbeat: each traversal asks every node of its beam for the key, and each answers with
the whole roster. Four nodes heartbeating every ttl/3 sent 12.3 kB/s each, 9.4 of them
for the traversals (netns, no reads; 2.9 kB/s without them): as much as a 0.1 Mbit/s
link, most of the 10× straggler's in bench/stragglers_net.py. The direct stores still go
to every known neighbour at each heartbeat, and a withdrawal always traverses (a
tombstone must reach every replica that may hold the record).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from hivemind.dht.crypto import DHTRecord
from hivemind.dht.routing import DHTID
from hivemind.utils import get_dht_time

log = logging.getLogger(__name__)

DIRECT_WAIT_S = 1.0  # fast neighbours answer in milliseconds; a slow one is left running
_BACKGROUND: set[asyncio.Task[Any]] = set()  # keeps the DHT process's tasks alive
_TRAVERSING: dict[bytes, asyncio.Task[Any]] = {}  # at most one regular store per key
_TRAVERSED: dict[bytes, float] = {}  # when each key's latest regular store began (monotonic)
TRAVERSALS: dict[bytes, int] = {}  # regular stores begun per key (read by tests)


def _keep(task: asyncio.Task[Any]) -> None:
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def direct_store(
    key: str,
    subkey: bytes,
    value: Any,
    expiration: float,
    _dht: Any,
    node: Any,
    wait_s: float = DIRECT_WAIT_S,
    *,
    traverse: bool = False,
) -> bool:
    """Store ``value`` under (``key``, ``subkey``) on our node and its known neighbours.

    Called by ``DHT.run_coroutine(partial(direct_store, key, subkey, value, expiration))``.
    Returns whether our own node accepted it (the entry then is in the DHT, and every
    quick read of ours sees it); the neighbours' answers only bound how long this waits.
    ``traverse``: also start a regular store even if one began within the entry's lifetime.
    """
    protocol = node.protocol
    key_id = DHTID.generate(source=key)
    record = DHTRecord(
        key_id.to_bytes(), protocol.serializer.dumps(subkey), protocol.serializer.dumps(value),
        expiration,
    )  # fmt: skip
    validator = protocol.record_validator
    if validator is not None:
        record = DHTRecord(record.key, record.subkey, validator.sign_value(record), expiration)
    stored = (validator is None or validator.validate(record)) and bool(
        protocol.storage.store(key_id, record.value, expiration, subkey=subkey)
    )
    neighbours = protocol.routing_table.get_nearest_neighbors(
        key_id, node.num_replicas, exclude=node.node_id
    )
    sends = [
        asyncio.create_task(
            protocol.call_store(peer, [key_id], [record.value], [expiration], [subkey])
        )
        for _, peer in neighbours
    ]
    for task in sends:
        _keep(task)
    running = _TRAVERSING.get(record.key)
    now, lifetime = time.monotonic(), expiration - get_dht_time()
    due = traverse or now - _TRAVERSED.get(record.key, -lifetime) >= lifetime
    if (running is None or running.done()) and due:  # never stacked per heartbeat
        task = asyncio.create_task(node.store(key, value, expiration, subkey=subkey))
        _TRAVERSING[record.key], _TRAVERSED[record.key] = task, now
        TRAVERSALS[record.key] = TRAVERSALS.get(record.key, 0) + 1
        _keep(task)
    if sends:
        await asyncio.wait(sends, timeout=wait_s)
    acks = sum(1 for t in sends if t.done() and not t.cancelled() and t.result())
    log.debug("direct store: own node %s, %d of %d neighbours answered", stored, acks, len(sends))
    return stored


async def traversal_counts(_dht: Any, _node: Any) -> dict[bytes, int]:
    """The regular stores begun per key in this DHT process (``DHT.run_coroutine``)."""
    return dict(TRAVERSALS)
