"""A publish does not wait for the slowest DHT node (gaslocd.net.direct_store).

Real hivemind DHT nodes on 127.0.0.1. The slow node is a frozen one (its DHT process
stopped with SIGSTOP: its p2pd still takes connections, nothing answers), the limit of a
node behind a saturated link. Every wait is bounded; the frozen node is thawed and every
node shut down even when the test fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from gaslocd.net.direct_store import traversal_counts
from gaslocd.net.discovery import Discovery, DiscoveryError
from tests.net.test_discovery import _record

TIMEOUT_S = 4.0  # each DHT request's bound: a wait on the frozen node lasts this long


@pytest.fixture
def trio() -> Iterator[list[Discovery]]:
    nodes = [Discovery("direct", request_timeout_s=TIMEOUT_S)]
    try:
        nodes[0].start()
        for _ in range(2):
            boot = nodes[0].bootstrap_addresses()
            nodes.append(Discovery("direct", initial_peers=boot, request_timeout_s=TIMEOUT_S))
            nodes[-1].start()
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


async def _rounds(node: Discovery, quick: bool) -> dict[str, int]:
    return {r.peer_id: r.round for r in await node.roster(quick=quick)}


@pytest.mark.net
def test_a_frozen_node_holds_neither_a_publish_nor_its_arrival_at_the_others(
    trio: list[Discovery],
) -> None:
    """hivemind's own store traverses the DHT first and waits for the frozen node's
    answer, so the publish (and a stop's withdrawal) timed out; now our node and the live
    neighbour have the record at once, and the quick read of the neighbour shows it."""
    first, second, frozen = trio
    frozen_pid = frozen.dht.pid
    assert frozen_pid is not None

    async def body() -> None:
        for node in trio:
            await node.publish(_record(node.peer_id, round=1))
        end = time.monotonic() + 15.0
        while len(await _rounds(second, quick=False)) < 3 or len(await _rounds(first, False)) < 3:
            assert time.monotonic() < end, "the three records never met"
            await asyncio.sleep(0.05)
        os.kill(frozen_pid, signal.SIGSTOP)
        try:
            for round_ in (2, 3):  # a second publish too: nothing stacks on the frozen node
                try:
                    await first.publish(_record(first.peer_id, round=round_))
                except DiscoveryError as error:
                    pytest.fail(f"the publish waited for the frozen node: {error}")
                # Stored to the live neighbour before publish returned: its own copy has it.
                assert (await _rounds(second, quick=True))[first.peer_id] == round_
                assert (await _rounds(first, quick=True))[first.peer_id] == round_
            assert first.stats.publish_failures == 0
            await second.withdraw()  # the tombstone goes the same way, at a stop
            assert second.peer_id not in await _rounds(first, quick=True)
        finally:
            os.kill(frozen_pid, signal.SIGCONT)
        # Thawed, the frozen node gets the record too (the stores left running).
        end = time.monotonic() + 3 * TIMEOUT_S
        while (await _rounds(frozen, quick=True)).get(first.peer_id) != 3:
            assert time.monotonic() < end, "the frozen node never got the record"
            await asyncio.sleep(0.05)

    asyncio.run(body())


@pytest.mark.net
def test_a_heartbeat_traverses_the_dht_once_per_record_lifetime(trio: list[Discovery]) -> None:
    """Each traversal asks every node for the key and each answers with the whole roster
    (9.4 of a heartbeating node's 12.3 kB/s, measured): the heartbeats within a record's
    lifetime go to the known neighbours directly; a withdrawal always traverses."""
    first, second, _ = trio

    def traversals() -> int:
        counts = first.dht.run_coroutine(traversal_counts)
        return sum(counts.values())

    async def body() -> None:
        began = traversals()
        for round_ in (1, 2, 3):  # three heartbeats well within the 30 s ttl
            await first.publish(_record(first.peer_id, round=round_))
            assert (await _rounds(second, quick=True))[first.peer_id] == round_
        assert traversals() == began + 1
        await first.withdraw()
        assert traversals() == began + 2
        assert first.peer_id not in await _rounds(second, quick=True)

    asyncio.run(body())
