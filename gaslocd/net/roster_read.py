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
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any

from gaslocd.net.roster_auth import check_entry, owner_key
from gaslocd.protocol.records import PeerRecord

log = logging.getLogger(__name__)
Entries = dict[Any, Any]  # subkey -> hivemind ValueWithExpiration


def entries_of(found: object) -> Entries:
    """The subkey entries of what a DHT get returned (empty for nothing or a plain value)."""
    value = getattr(found, "value", None)
    return dict(value) if isinstance(value, dict) else {}


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


def parse_entries(
    run_key: bytes, entries: Entries, now: float
) -> tuple[dict[str, PeerRecord], dict[str, bytes], int]:
    """The unexpired, signed, plausible records among ``entries`` by peer id, their
    owners' keys, and how many entries were refused (each one logged with why)."""
    records: dict[str, PeerRecord] = {}
    keys: dict[str, bytes] = {}
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
    return records, keys, refused
