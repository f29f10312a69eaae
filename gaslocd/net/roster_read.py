"""The roster key's entries as one read found them, and a quick read that needs no network.

A full roster read (hivemind ``get(latest=True)``) asks every DHT node nearest the key
and waits for the slowest answer. A node behind a saturated link (a straggler's, its
uplink full with a long exchange) answers in seconds, so a round that waits for a full
read waits for the straggler: 14–23% of the fast hosts' wall-clock at 10× T
(bench/results/network_stragglers.md), although their own node already holds the roster.

A *quick* read asks our own node only (``latest=False``: hivemind looks in the node's
storage first and stops at the first unexpired copy, with no network call when it is a
replica, as every node of a run of up to ``num_replicas`` peers is). It sees every
record stored to us within a ttl. What it can lack are the stores that reached other
replicas but not us, so it is merged, entry by entry (the later expiration wins, as in
hivemind's own merge), with the entries of the last full read, which :class:`FullRead`
keeps from the DHT future itself: a full read whose caller stopped waiting still lands.
Expired entries are dropped, so the merge never revives a record its ttl ended.

A quick read may also stand in for the full read itself (:meth:`FullRead.trusted`),
when the last full read found nothing our node's own storage lacked and the run is small
enough that every node is a replica of the key (fewer entries than ``num_replicas``):
every publish then reaches our node directly (:mod:`gaslocd.net.direct_store`), and a
full read learns nothing a quick one does not. Each full read asks every node, and each
answers with the whole roster: with one per round and host, the answers to the fast
hosts' reads were a large part of a 10× straggler's non-θ̃ traffic
(bench/stragglers_net.py). A full read is still made every half record lifetime.

"Lacked" is judged on our copy as it was *before* that read: hivemind's search merges
what it finds into the first copy it looked at, which is our node's stored dictionary
itself (``_SearchState.add_candidate``), so after any full read our copy looks complete.
An entry found newer than ours by more than the read's duration and a heartbeat is a
lapse (a store that missed us, a run grown past the replicas, a neighbour whose stores
stopped reaching us). A lapse while quick reads were trusted makes every read full for
two record lifetimes, twice that after the next one, up to 32: an insider that stores
its record (or tombstone) to some nodes and not to ours can make our roster differ from
theirs for at most half a record lifetime, ever more rarely. At start-up, lacking what
was published before we joined is no lapse (nothing was trusted yet). A node in client
mode (behind NAT, or a joiner until its probe found it dialable) is sent no stores and
always reads in full. A peer on a sit-out schedule publishes over the link its long
exchange fills, so its stores reach every node seconds late: its entry only needs to be
in our copy, however old (beside a 10× straggler the fast hosts lapsed on it two or three
times in two minutes, and then read in full, each read answered over that very link).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from collections.abc import Collection
from typing import Any

from hivemind.dht.routing import DHTID

from gaslocd.net.roster_auth import check_entry, owner_key
from gaslocd.protocol.records import PeerRecord
from gaslocd.protocol.sitout import SitOut

log = logging.getLogger(__name__)
Entries = dict[Any, Any]  # subkey -> hivemind ValueWithExpiration


def entries_of(found: object) -> Entries:
    """The subkey entries of what a DHT get returned (empty for nothing or a plain value)."""
    value = getattr(found, "value", None)
    return dict(value) if isinstance(value, dict) else {}


DISTRUST = 4  # after our copy lacked an entry: full reads only, for this many trust spans
MAX_DISTRUST = 64  # each further time twice as many, up to this many


class FullRead:
    """The entries of the newest full read that finished, whoever awaited it.

    "Newest" by when it started: reads overlap (the lobby, the prefetch, pacing, the
    reachability probe), and one that started before another can finish after it (a
    node slow to answer, an awaiter that gave up at its timeout while hivemind went on).
    Its entries are older news: kept, they would take back a record the later read had
    (a newcomer's, whose first rounds then paired it with peers that did not see it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the future's callback runs in hivemind's thread
        self._entries: Entries | None = None
        self._started = 0  # full reads numbered as they start
        self._kept = 0  # the number of the read whose entries these are
        self._trusted_until = -math.inf  # DHT time until which quick reads suffice
        self._distrusted_until = -math.inf  # and before which they never do again
        self._distrust = DISTRUST  # trust spans of full reads after the next lapse
        self.lapses = 0  # full reads that found our copy behind while it was trusted

    @property
    def known(self) -> bool:
        return self._entries is not None

    def watch(self, future: concurrent.futures.Future[Any]) -> int:
        """Number a full read as it starts and keep its entries when it finishes
        (cancelled or failed: nothing); its number, for :meth:`keep`."""
        with self._lock:
            self._started += 1
            number = self._started

        def done(f: concurrent.futures.Future[Any]) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            self.keep(entries_of(f.result()), number)

        future.add_done_callback(done)
        return number

    def keep(self, entries: Entries, number: int) -> None:
        """Keep read ``number``'s entries unless a later-started read's are kept. Its
        awaiter calls this too: hivemind may wake the awaiter before it runs the future's
        callbacks, and a quick read right after a full one must not find nothing to merge
        with."""
        with self._lock:
            if number >= self._kept:
                self._entries, self._kept = dict(entries), number

    def check_own(
        self,
        entries: Entries,
        own: tuple[int, dict[Any, float]],
        now: float,
        for_s: float,
        late_s: float,
        sitting: Collection[Any] = (),
    ) -> int:
        """After a full read found ``entries``: trust quick reads for ``for_s`` if our
        node's storage before the read (``own``: the key's replica count, subkey ->
        expiration, from ``own_copy``) held each live entry, at most ``late_s`` older
        (the read's duration and a heartbeat: a publish during the read, or one store
        that reached us late, is as current as a prefetched roster may be), and the run
        is within the key's replicas. The entries of peers on a sit-out schedule
        (``sitting``) only need to be there, however old: such a peer publishes over
        the link its long exchange fills, so its stores reach every node seconds late
        (their lateness says nothing about our node). Returns how many entries it lacked."""
        replicas, stored = own
        live = {k: e for k, e in entries.items() if e.expiration_time > now}
        held = {k for k in sitting if stored.get(k, -math.inf) > now}  # late but there
        behind = [
            0.0 if k in held else e.expiration_time - stored.get(k, -math.inf)
            for k, e in live.items()
        ]
        lacking = sum(b > late_s for b in behind)
        with self._lock:
            if lacking and self._trusted_until > -math.inf:  # our quick reads were stale
                self._distrusted_until = now + self._distrust * for_s
                log.info(
                    "our DHT node's copy lacked %d of %d roster entries (by up to %.1f s): "
                    "full roster reads only, for %.0f s",
                    lacking, len(live), max(behind), self._distrust * for_s,
                )  # fmt: skip
                self._distrust = min(MAX_DISTRUST, 2 * self._distrust)
                self.lapses += 1
            ok = not lacking and len(live) < replicas and now >= self._distrusted_until
            self._trusted_until = now + for_s if ok else -math.inf
        return lacking

    def trusted(self, now: float) -> bool:
        """Whether a quick read may stand in for a full one now (see the module doc)."""
        with self._lock:
            return now < self._trusted_until

    def merged(self, local: Entries, now: float) -> Entries:
        """``local`` with each of the last full read's entries that expires later."""
        with self._lock:
            full = dict(self._entries or {})
        out = {k: e for k, e in local.items() if e.expiration_time > now}
        for subkey, entry in full.items():
            mine = out.get(subkey)
            if entry.expiration_time > now and (
                mine is None or entry.expiration_time > mine.expiration_time
            ):
                out[subkey] = entry
        return out


async def own_copy(key: str, _dht: Any, node: Any) -> tuple[int, dict[Any, float]]:
    """In the DHT process (``DHT.run_coroutine``): the key's replica count and the
    expiration of each subkey our node stores for the run: its storage, not the cache of
    our own reads (which holds what the last full read found)."""
    found = node.protocol.storage.get(DHTID.generate(source=key))
    value: Any = getattr(found, "value", None)
    items = value.items() if hasattr(value, "items") else ()
    replicas = 0 if node.protocol.client_mode else node.num_replicas  # nobody stores to it
    return replicas, {subkey: item.expiration_time for subkey, item in items}


def parse_entries(
    run_key: bytes, entries: Entries, now: float
) -> tuple[dict[str, PeerRecord], dict[str, bytes], int, set[Any]]:
    """The unexpired, signed, plausible records among ``entries`` by peer id, their
    owners' keys, how many entries were refused (each one logged with why), and the
    subkeys of the records on a sit-out schedule (:meth:`FullRead.check_own`)."""
    records: dict[str, PeerRecord] = {}
    keys: dict[str, bytes] = {}
    sitting: set[Any] = set()
    refused = 0
    for subkey, entry in entries.items():
        if entry.expiration_time <= now:
            continue
        try:
            if not isinstance(subkey, bytes):
                raise ValueError("subkey is not signed bytes")
            record = check_entry(run_key, subkey, entry.value, now)
        except ValueError as error:
            refused += 1
            log.debug("skipping a roster entry: %s", error)
            continue
        if record is not None:
            records[record.peer_id] = record
            keys[record.peer_id] = owner_key(subkey)
            if SitOut.of(record).periodic:
                sitting.add(subkey)
    return records, keys, refused, sitting
