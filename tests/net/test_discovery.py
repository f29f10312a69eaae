"""Discovery: records on the wire, and real hivemind DHT nodes on 127.0.0.1.

Every wait polls with a deadline; DHT nodes are shut down and child processes reaped
even when a test fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hivemind.utils.timed_storage import get_dht_time

from gaslocd.net.discovery import (
    Discovery,
    DiscoveryError,
    PeerRecord,
    parse_bootstrap,
)
from gaslocd.net.roster_auth import owner_key, run_key, sign_entry

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).with_name("disc_peer.py")
A_PEER_ID = "QmXfYh5vBz1vQyFJzXXm1vVJ8E8v7a1j4iDfAqYmPaLwTn"


def _record(peer_id: str, fingerprint: str = "fp", **changes: Any) -> PeerRecord:
    fields: dict[str, Any] = dict(
        peer_id=peer_id,
        address="127.0.0.1:50051",
        fingerprint=fingerprint,
        round=3,
        inner_steps=30,
        step_time_s=0.25,
        bandwidth_bytes_per_s=1e9,
        version="0.1.0",
        started_at=1.7e9,
    )
    fields.update(changes)
    return PeerRecord(**fields)


async def _poll(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], deadline_s: float
) -> T:
    """Call ``probe`` until ``done`` holds for its result; fail after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while True:
        value = await probe()
        if done(value):
            return value
        assert time.monotonic() < end, f"condition not reached within {deadline_s} s: {value}"
        await asyncio.sleep(0.05)


# -- records on the wire (no network) ---------------------------------------------------


def test_record_round_trips_through_the_wire() -> None:
    record = _record(A_PEER_ID)
    wire = record.to_wire()
    assert wire["v"] == 1 and all(type(v) in (int, float, str, bool) for v in wire.values())
    assert PeerRecord.from_wire(wire) == record
    assert PeerRecord.from_wire({**wire, "new_field": [1, 2]}) == record  # newer peers
    assert PeerRecord.from_wire({**wire, "step_time_s": 1}).step_time_s == 1.0


@pytest.mark.parametrize("garbage", [None, "peer", [1, 2], {}, {"v": 1}])
def test_non_records_raise_value_error(garbage: Any) -> None:
    with pytest.raises(ValueError):
        PeerRecord.from_wire(garbage)


@pytest.mark.parametrize(
    "patch",
    [
        {"v": 2},
        {"round": -1},
        {"round": True},
        {"round": 1.5},
        {"inner_steps": 0},
        {"step_time_s": float("nan")},
        {"bandwidth_bytes_per_s": -1.0},
        {"bandwidth_bytes_per_s": "fast"},
        {"address": "no-port"},
        {"address": "host:99999"},
        {"peer_id": ""},
        {"fingerprint": "x" * 10_000},
        {"version": "bad\nline"},
        {"fingerprint": None},
    ],
)
def test_malformed_wire_records_raise_value_error(patch: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PeerRecord.from_wire({**_record(A_PEER_ID).to_wire(), **patch})


@pytest.mark.parametrize(
    "address",
    [
        "garbage",
        "127.0.0.1:31337",
        "/ip4/127.0.0.1/tcp/31337",  # no /p2p/ part: we would not know whom we reach
        "/ip4/127.0.0.1/tcp/31337/p2p/not-base58-0OIl",
        "/ip4/300.0.0.1/tcp/31337/p2p/" + A_PEER_ID,
    ],
)
def test_bad_bootstrap_address_is_refused_with_a_hint(address: str) -> None:
    with pytest.raises(ValueError, match=r"bad bootstrap address.*gaslocd start"):
        parse_bootstrap(address)
    with pytest.raises(ValueError, match="bad bootstrap address"):
        Discovery("run", initial_peers=[address])  # refused before anything starts


def test_announcing_needs_an_explicit_port() -> None:
    with pytest.raises(ValueError, match="explicit DHT port"):
        Discovery("run", announce_host="203.0.113.5")


# -- real DHT nodes ---------------------------------------------------------------------


@pytest.fixture
def trio() -> Iterator[list[Discovery]]:
    """Three DHT nodes of one run: the first is the bootstrap of the other two."""
    nodes = [Discovery("trio", record_ttl_s=30.0)]
    try:
        nodes[0].start()
        for _ in range(2):
            nodes.append(Discovery("trio", initial_peers=nodes[0].bootstrap_addresses()))
            nodes[-1].start()
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


@pytest.mark.net
def test_three_nodes_discover_each_other_and_filter_by_fingerprint(trio: list[Discovery]) -> None:
    async def body() -> None:
        ids = sorted(node.peer_id for node in trio)
        assert len(set(ids)) == 3
        assert all(node.bootstrap_addresses()[0].endswith(node.peer_id) for node in trio)
        for node, fingerprint in zip(trio, ["fp", "fp", "other"], strict=True):
            await node.publish(_record(node.peer_id, fingerprint))
        for node in trio:
            roster = await _poll(node.roster, lambda r: len(r) == 3, 10.0)
            assert [r.peer_id for r in roster] == ids
            same = await node.roster(fingerprint="fp")
            assert [r.peer_id for r in same] == sorted(n.peer_id for n in trio[:2])
            assert node.stats.malformed_records == 0
        # A heartbeat replaces the record instead of adding one.
        await trio[1].publish(_record(trio[1].peer_id, round=4))
        roster = await _poll(
            trio[2].roster, lambda r: any(x.round == 4 for x in r), deadline_s=10.0
        )
        assert len(roster) == 3

    asyncio.run(body())


@pytest.mark.net
def test_malformed_forged_and_impersonating_entries_are_refused(trio: list[Discovery]) -> None:
    """Every such store is refused by every node (tests/security has outsiders' nodes)."""
    victim, attacker, observer = trio
    key = victim.key

    async def body() -> None:
        genuine = _record(victim.peer_id)
        await victim.publish(genuine)
        later = time.time() + 20  # later than the genuine record's expiry would win
        dht = attacker.dht
        tagged = sign_entry(
            run_key("", "trio"), owner_key(victim.subkey), _record(victim.peer_id).to_wire()
        )
        forged = {**tagged, "fingerprint": "evil"}  # a tag does not survive an edit
        # 1. Overwrite the victim's subkey: unsigned for that key, so every node refuses.
        assert not await dht.store(
            key, tagged, later + 20, subkey=victim.subkey, return_future=True
        )
        # 2. Garbage, an edited record and an impersonation (the victim's tagged record)
        # under the attacker's own subkey, and an entry under a subkey without a key.
        garbage = {"v": 1, "round": "x"}
        for value, subkey in [
            (garbage, attacker.subkey),
            (forged, attacker.subkey),
            (tagged, attacker.subkey),
            (tagged, b"plain"),
        ]:
            assert not await dht.store(key, value, later, subkey=subkey, return_future=True)
        assert await observer.roster() == [genuine]
        assert observer.stats.malformed_records == 0  # never even reached the roster
        # Publishing someone else's record through the API is refused outright.
        with pytest.raises(ValueError, match="not this node"):
            await attacker.publish(genuine)

    asyncio.run(body())


@pytest.mark.net
def test_withdraw_removes_the_record_from_other_rosters(trio: list[Discovery]) -> None:
    async def body() -> None:
        for node in trio:
            await node.publish(_record(node.peer_id))
        await _poll(trio[2].roster, lambda r: len(r) == 3, 10.0)
        await trio[1].withdraw()
        await trio[1].withdraw()  # idempotent
        for node in (trio[0], trio[2]):
            roster = await node.roster()
            assert trio[1].peer_id not in [r.peer_id for r in roster]
            assert node.stats.malformed_records == 0  # a tombstone is not garbage
        # Coming back after a withdraw works: a new heartbeat outlives the tombstone.
        await trio[1].publish(_record(trio[1].peer_id))
        await _poll(trio[0].roster, lambda r: len(r) == 3, 10.0)

    asyncio.run(body())


@pytest.mark.net
def test_a_withdraw_outlives_a_publish_that_the_stop_cancelled(trio: list[Discovery]) -> None:
    """A stop cancels the heartbeat and the round's publishes; one the DHT process had
    begun still stores its record, later than the last publish we saw end. The tombstone
    must outlive that one too (bench: 3 of 4 hosts' tombstones refused at every stop)."""

    async def body() -> None:
        node = trio[1]
        await node.publish(_record(node.peer_id))
        seen = node._published  # what the daemon knew when the stop came ...
        await node.publish(_record(node.peer_id))  # ... and the publish it cancelled
        node._published = seen
        await node.withdraw()  # the old tombstone, just after `seen`, was refused here
        for other in (trio[0], trio[2]):
            assert node.peer_id not in [r.peer_id for r in await other.roster()]

    asyncio.run(body())


class _Forget:
    """In a DHT process: drop one subkey of the roster from this node's own copy (a
    store that reached the other replicas, not this one)."""

    def __init__(self, key: str, subkey: bytes) -> None:
        self.key, self.subkey = key, subkey

    async def __call__(self, _dht: Any, node: Any) -> int:
        from hivemind.dht.routing import DHTID

        dropped = 0
        for storage in (node.protocol.storage, node.protocol.cache):
            found = storage.get(DHTID.generate(source=self.key))
            if found is not None and self.subkey in dict(found.value.items()):
                del found.value[self.subkey]
                dropped += 1
        return dropped


@pytest.mark.net
def test_a_quick_read_is_our_nodes_copy_merged_with_the_last_full_read(
    trio: list[Discovery],
) -> None:
    """The round-start read that waits for no other node (gaslocd.net.roster_read): it
    sees what was stored to us since, and what only the last full read found."""
    first, second, third = trio

    async def body() -> None:
        assert not first.quick  # nothing to merge with before a full read ended
        for node in trio:
            await node.publish(_record(node.peer_id))
        full = await _poll(first.roster, lambda r: len(r) == 3, 10.0)
        assert first.quick
        assert await first.roster(quick=True) == full
        # A heartbeat stored to us shows in the quick read at once.
        await second.publish(_record(second.peer_id, round=7))
        quick = await first.roster(quick=True)
        assert {r.peer_id: r.round for r in quick}[second.peer_id] == 7
        # Our node lost third's record (its store never reached us): the last full read
        # still has it; the quick read keeps it, with no network call needed for it.
        await _poll(first.roster, lambda r: len(r) == 3, 10.0)
        assert first.dht.run_coroutine(_Forget(first.key, third.subkey)) >= 1
        quick = await first.roster(quick=True)
        assert sorted(r.peer_id for r in quick) == sorted(n.peer_id for n in trio)
        # A withdrawal (its tombstone expires later than the record) wins the merge.
        await second.withdraw()
        quick = await _poll(
            lambda: first.roster(quick=True),
            lambda r: second.peer_id not in [x.peer_id for x in r],
            10.0,
        )
        assert third.peer_id in [r.peer_id for r in quick]
        assert first.stats.malformed_records == 0

    asyncio.run(body())


class _StoreHere:
    """In a DHT process: store a peer's signed record on this node only (a publish whose
    sends to the neighbours were lost), dated as a publish two heartbeats from now."""

    def __init__(self, node: Discovery, record: PeerRecord) -> None:
        self.key, self.subkey = node.key, node.subkey
        self.value = sign_entry(node._run_key, node._owner, record.to_wire())
        self.expiration = get_dht_time() + node._ttl_s + 20.0  # two heartbeats (ttl/3)

    async def __call__(self, _dht: Any, node: Any) -> bool:
        from hivemind.dht.crypto import DHTRecord
        from hivemind.dht.routing import DHTID

        key_id, protocol = DHTID.generate(source=self.key), node.protocol
        dumps = protocol.serializer.dumps
        record = DHTRecord(
            key_id.to_bytes(), dumps(self.subkey), dumps(self.value), self.expiration
        )
        value = protocol.record_validator.sign_value(record)
        return bool(protocol.storage.store(key_id, value, self.expiration, subkey=self.subkey))


@pytest.mark.net
def test_a_full_read_is_skipped_only_while_our_nodes_copy_had_everything(
    trio: list[Discovery],
) -> None:
    """The daemon's reads (quick=None) ask no other node while the last full read found
    our node's storage complete (a straggler's node answered every host's full read, each
    with the whole roster); a store that missed our node makes them full again."""
    first, second, third = trio

    async def reads() -> tuple[int, int]:
        return first.stats.full_reads, first.stats.quick_reads

    async def body() -> None:
        for node in trio:
            await node.publish(_record(node.peer_id))
        full = await _poll(first.roster, lambda r: len(r) == 3, 10.0)
        before = await reads()
        assert await first.roster(quick=None) == full
        await second.publish(_record(second.peer_id, round=7))  # reaches us directly
        auto = await first.roster(quick=None)
        assert {r.peer_id: r.round for r in auto}[second.peer_id] == 7
        assert await reads() == (before[0], before[1] + 2)  # no other node was asked
        # third's next record reaches the other replicas, not us: the next full read
        # finds it there.
        assert third.dht.run_coroutine(_StoreHere(third, _record(third.peer_id, round=9)))
        assert {r.peer_id: r.round for r in await first.roster()}[third.peer_id] == 9
        # Our copy looks complete after that read (the search merged into it), yet the
        # reads stay full for a while.
        for _ in range(3):
            assert len(await first.roster(quick=None)) == 3
        assert (await reads())[0] == before[0] + 4
        assert first._full.lapses == 1
        assert first.stats.malformed_records == 0

    asyncio.run(body())


@pytest.mark.net
def test_a_sitters_record_late_at_our_node_keeps_quick_reads_trusted(
    trio: list[Discovery],
) -> None:
    """A peer on a sit-out schedule publishes over its saturated link: its newer record
    is found elsewhere before it reaches us, and that is no lapse (a non-sitter's is)."""
    first, second, third = trio

    async def body() -> None:
        for node in trio:
            await node.publish(_record(node.peer_id))
        await third.publish(_record(third.peer_id, sit_every=4, free_from=8, sit_from=4))
        await _poll(first.roster, lambda r: len(r) == 3, 10.0)
        assert await first.roster() and first._full.trusted(get_dht_time())
        sitter = _record(third.peer_id, round=9, sit_every=4, free_from=8, sit_from=4)
        assert third.dht.run_coroutine(_StoreHere(third, sitter))  # not yet at our node
        assert {r.peer_id: r.round for r in await first.roster()}[third.peer_id] == 9
        assert first._full.lapses == 0 and first._full.trusted(get_dht_time())
        assert second.dht.run_coroutine(_StoreHere(second, _record(second.peer_id, round=9)))
        assert {r.peer_id: r.round for r in await first.roster()}[second.peer_id] == 9
        assert first._full.lapses == 1 and not first._full.trusted(get_dht_time())

    asyncio.run(body())


@pytest.mark.net
def test_a_read_that_finds_news_sends_nothing_and_schedules_no_reads() -> None:
    """hivemind would cache what a full read found newer than our copy, push it to
    another node and re-read the key over the network before it expires: RPCs no roster
    read asked for (a 10× straggler's node answered most of its finds for them)."""
    trio = [Discovery("news", record_ttl_s=6.0)]

    async def calls() -> dict[str, int]:
        await first.count_rpcs()
        return {k: v[0] for k, v in first.stats.rpc_traffic.items()}

    async def body() -> None:
        for node in trio:
            await node.publish(_record(node.peer_id))
        await _poll(first.roster, lambda r: len(r) == 3, 10.0)
        # news on one node only, expiring soon: hivemind would re-read 5 s before that
        news = _StoreHere(second, _record(second.peer_id, round=9))
        news.expiration = get_dht_time() + 6.5
        assert second.dht.run_coroutine(news)
        before = await calls()
        assert {r.peer_id: r.round for r in await first.roster()}[second.peer_id] == 9
        after_read = await calls()
        assert after_read.get("store/called", 0) == before.get("store/called", 0)
        end = time.monotonic() + 3.0  # past the refresh hivemind would have scheduled
        while time.monotonic() < end:
            assert len(await first.roster(quick=True)) == 3
            await asyncio.sleep(0.2)
        assert (await calls()).get("find/called", 0) == after_read.get("find/called", 0)

    try:
        trio[0].start()
        for _ in range(2):
            joiner = Discovery(
                "news", initial_peers=trio[0].bootstrap_addresses(), record_ttl_s=6.0
            )
            trio.append(joiner)
            trio[-1].start()
        first, second, _third = trio
        asyncio.run(body())
    finally:
        for node in trio:
            node.shutdown()


@pytest.mark.net
def test_each_node_counts_the_rpcs_it_serves_and_calls(trio: list[Discovery]) -> None:
    """gasloc_dht_rpc_bytes_total's source: a publish is a store our node calls and
    every other node serves, a full read a find; sizes are the messages' own."""
    first, second, third = trio

    async def body() -> None:
        for node in trio:
            await node.count_rpcs()
        before = {id(n): dict(n.stats.rpc_traffic) for n in trio}
        record = _record(first.peer_id)
        await first.publish(record)
        await _poll(second.roster, lambda r: len(r) == 1, 10.0)  # a full read: finds
        await _poll(third.roster, lambda r: len(r) == 1, 10.0)

        def grown(node: Discovery, key: str) -> list[int]:
            old = before[id(node)].get(key, [0, 0, 0])
            new = node.stats.rpc_traffic.get(key, [0, 0, 0])
            return [a - b for a, b in zip(new, old, strict=True)]

        for node in trio:
            await node.count_rpcs()
        called = grown(first, "store/called")
        wire = len(json.dumps(record.to_wire()))
        assert called[0] >= 2 and called[1] > 2 * wire  # the signed record, out to both
        for other in (second, third):
            served = grown(other, "store/served")
            assert served[0] >= 1 and served[2] > wire  # and in
            assert grown(other, "find/called")[0] >= 1
        assert sum(grown(first, "find/served")[:1]) >= 1  # it answered their reads

    asyncio.run(body())


async def _forget_everyone(_dht: Any, node: Any) -> int:
    """In a DHT process: what a minute-long cut leaves behind (every neighbour dropped
    from the routing table and banned from searches, nothing stored or cached)."""
    from hivemind.dht.routing import RoutingTable

    table = node.protocol.routing_table
    for peer_id in list(table.peer_id_to_uid):
        for _ in range(6):  # bans double: 5 s, 10 s, ... 160 s
            node.blacklist.register_failure(peer_id)
    node.protocol.routing_table = RoutingTable(node.node_id, table.bucket_size, table.depth_modulo)
    node.protocol.storage.clear()
    node.protocol.cache.clear()
    return len(node.blacklist.banned_peers)


@pytest.mark.net
def test_a_node_that_lost_every_neighbour_finds_the_run_again(trio: list[Discovery]) -> None:
    """hivemind never re-dials on its own: after a cut the node would stay alone."""
    lost = trio[2]

    async def body() -> None:
        for node in trio:
            await node.publish(_record(node.peer_id))
        await _poll(lost.roster, lambda r: len(r) == 3, 10.0)
        assert not lost.alone
        banned = await lost.dht.run_coroutine(_forget_everyone, return_future=True)
        assert banned == 2
        assert [r.peer_id for r in await lost.roster()] == [lost.peer_id]
        assert lost.alone
        assert await lost.redial() == 2  # the bootstrap and the peer seen in rosters
        roster = await _poll(lost.roster, lambda r: len(r) == 3, 10.0)
        assert not lost.alone and len(roster) == 3
        # And the others see its next heartbeat again.
        await lost.publish(_record(lost.peer_id, round=9))
        await _poll(trio[0].roster, lambda r: any(x.round == 9 for x in r), 10.0)

    asyncio.run(body())


@pytest.mark.net
def test_unreachable_bootstrap_fails_fast_with_a_clear_message() -> None:
    with Discovery("run") as alive:
        address = alive.bootstrap_addresses()[0]
    # The node is gone now: its address is well-formed but nobody answers there.
    began = time.monotonic()
    node = Discovery("run", initial_peers=[address], start_timeout_s=10.0)
    with pytest.raises(DiscoveryError, match=r"could not join the run through /ip4/127\.0\.0\.1"):
        node.start()
    assert time.monotonic() - began < 12.0
    node.shutdown()


@pytest.mark.net
@pytest.mark.slow
def test_sigkilled_peer_expires_from_rosters_and_its_dht_child_exits(
    reaper: list[subprocess.Popen[bytes]],
) -> None:
    ttl_s = 3.0
    with Discovery("expiry", record_ttl_s=ttl_s) as survivor:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, str(PEER_SCRIPT), "expiry"]
        command += [survivor.bootstrap_addresses()[0], str(ttl_s)]
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, env=env, start_new_session=True, cwd=ROOT
        )
        reaper.append(proc)
        assert proc.stdout is not None
        with proc.stdout:
            line = proc.stdout.readline()  # bounded by the global test timeout
        assert line, f"peer exited early with {proc.wait()}"
        hello = json.loads(line)
        own = _record(survivor.peer_id)

        async def heartbeat_and_roster() -> list[PeerRecord]:
            await survivor.publish(own)  # the survivor's own record must stay fresh
            return await survivor.roster()

        async def body() -> float:
            await _poll(heartbeat_and_roster, lambda r: len(r) == 2, 10.0)
            os.kill(proc.pid, signal.SIGKILL)  # only the main process, as the OOM killer does
            killed = time.monotonic()
            roster = await _poll(heartbeat_and_roster, lambda r: len(r) == 1, ttl_s + 5.0)
            assert roster == [own]
            return time.monotonic() - killed

        gone_after_s = asyncio.run(body())
        assert gone_after_s <= ttl_s + 5.0
        # The orphaned DHT process notices its parent is gone and exits.
        end = time.monotonic() + 10.0
        while _alive(hello["dht_pid"]):
            assert time.monotonic() < end, "the DHT child outlived its parent"
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too
        return stat.read().split(")")[-1].split()[0] != "Z"
