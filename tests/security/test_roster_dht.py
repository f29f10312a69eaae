"""Outsiders with their own DHT nodes against live Discovery nodes of a run with a token.

Two honest nodes publish; an outsider runs a plain hivemind DHT node (RSA-signed subkeys,
no run key) joined through them, and an insider holds the token. ``exclude_self=True``
asks the honest nodes alone: False means every one of them refused the store (hivemind
reports the last replica's answer, so only an all-honest answer is deterministic).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey

from gaslocd.net.children import scratch_event_loop
from gaslocd.net.discovery import Discovery, DiscoveryError
from gaslocd.net.roster_auth import owner_key, run_key, sign_entry
from gaslocd.protocol.records import PeerRecord

pytestmark = [pytest.mark.net]
T = TypeVar("T")
RUN, TOKEN = "sec", "s3cret"
SLOW_START_S = 120.0  # a loaded 2-core CI machine can take over 30 s to start a node


def _record(peer_id: str, **changes: Any) -> PeerRecord:
    fields: dict[str, Any] = dict(
        peer_id=peer_id,
        address="127.0.0.1:50051",
        fingerprint="fp",
        round=3,
        inner_steps=30,
        step_time_s=0.25,
        bandwidth_bytes_per_s=1e9,
        version="0.1.0",
        started_at=time.time(),
    )
    fields.update(changes)
    return PeerRecord(**fields)


class Outsider:
    """A plain hivemind DHT node: signs its own subkey, holds no run key."""

    def __init__(self, bootstrap: list[str]) -> None:
        self.signer = RSASignatureValidator(RSAPrivateKey())
        with scratch_event_loop():
            self.dht = DHT(initial_peers=bootstrap, start=True, record_validators=[self.signer])
            self.peer_id = str(self.dht.peer_id.to_base58())

    async def store(self, key: str, value: object, subkey: bytes | None, *, alone: bool) -> bool:
        future = self.dht.store(
            key,
            value,
            time.time() + 600,  # long after any honest record
            subkey=subkey,
            exclude_self=alone,
            return_future=True,
        )
        return bool(await asyncio.wait_for(future, 10))


@pytest.fixture
def pair() -> Iterator[list[Discovery]]:
    """Two honest nodes of the run, both holding the token."""
    nodes = [Discovery(RUN, token=TOKEN, record_ttl_s=60.0, start_timeout_s=SLOW_START_S)]
    try:
        nodes[0].start()
        joiner = Discovery(
            RUN,
            token=TOKEN,
            initial_peers=nodes[0].bootstrap_addresses(),
            start_timeout_s=SLOW_START_S,
        )
        nodes.append(joiner)
        nodes[1].start()
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


@pytest.fixture
def run(pair: list[Discovery]) -> Iterator[tuple[list[Discovery], Outsider]]:
    """The honest pair and an outsider's node joined through them."""
    outsider = Outsider(pair[0].bootstrap_addresses())
    try:
        yield pair, outsider
    finally:
        outsider.dht.shutdown()


async def _poll(probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], limit_s: float) -> T:
    end = time.monotonic() + limit_s
    while True:
        value = await probe()
        if done(value):
            return value
        assert time.monotonic() < end, f"not reached within {limit_s} s: {value}"
        await asyncio.sleep(0.05)


async def _publish_all(nodes: list[Discovery]) -> list[PeerRecord]:
    records = [_record(node.peer_id) for node in nodes]
    for node, record in zip(nodes, records, strict=True):
        await node.publish(record)
    for node in nodes:
        await _poll(node.roster, lambda r: len(r) == len(nodes), 10.0)
    return sorted(records, key=lambda r: r.peer_id)


def test_outsiders_records_are_refused_and_never_listed(
    run: tuple[list[Discovery], Outsider],
) -> None:
    nodes, outsider = run

    async def body() -> None:
        honest = await _publish_all(nodes)
        key, sub = nodes[0].key, outsider.signer.local_public_key
        forged = _record(outsider.peer_id, round=0).to_wire()
        guessed = {**forged, "auth": "0" * 64}  # a tag of the right shape
        for value in (forged, guessed):
            assert not await outsider.store(key, value, sub, alone=True)
            await outsider.store(key, value, sub, alone=False)  # its own node keeps it
        # Other keys too: a matchmaking key of DiLoCo mode takes no untagged value.
        assert not await outsider.store(f"{RUN}-diloco.0b0", 1.0, b"x", alone=True)
        for node in nodes:
            assert await node.roster() == honest
            assert node.stats.malformed_records == 0  # refused inside the DHT
            assert node.public_key_of(outsider.peer_id) is None
            assert node.public_key_of(nodes[1].peer_id) == owner_key(nodes[1].subkey)

    asyncio.run(body())


def test_a_tag_moved_to_another_key_is_refused(run: tuple[list[Discovery], Outsider]) -> None:
    nodes, outsider = run

    async def body() -> None:
        honest = await _publish_all(nodes)
        found = await asyncio.wait_for(
            outsider.dht.get(nodes[0].key, latest=True, return_future=True), 10
        )
        assert found is not None
        entry = found.value[nodes[0].subkey].value  # honest, with its run tag
        assert "auth" in entry
        sub = outsider.signer.local_public_key
        for value in (entry, {**entry, "peer_id": outsider.peer_id}):
            assert not await outsider.store(nodes[0].key, value, sub, alone=True)
        assert await nodes[1].roster() == honest

    asyncio.run(body())


def test_a_plain_value_over_the_roster_key_leaves_it_whole(
    run: tuple[list[Discovery], Outsider],
) -> None:
    nodes, outsider = run

    async def body() -> None:
        honest = await _publish_all(nodes)
        assert not await outsider.store(nodes[0].key, "gone", None, alone=True)
        await outsider.store(nodes[0].key, "gone", None, alone=False)  # kept by its own node
        for node in nodes:
            await node.publish(_record(node.peer_id))  # a heartbeat after the attack
            assert [r.peer_id for r in await node.roster()] == [r.peer_id for r in honest]

    asyncio.run(body())


def test_an_insider_cannot_publish_an_absurd_round(pair: list[Discovery]) -> None:
    nodes = pair

    async def body() -> None:
        honest = await _publish_all(nodes)
        insider = nodes[1]  # holds the token
        absurd = _record(insider.peer_id, round=2**60)
        with pytest.raises(DiscoveryError, match="would be refused: round"):
            await insider.publish(absurd)  # the API refuses it first, with the reason
        # Past the API, with a valid tag: the other honest node refuses it too.
        tagged = sign_entry(run_key(TOKEN, RUN), owner_key(insider.subkey), absurd.to_wire())
        future = insider.dht.store(
            insider.key,
            tagged,
            time.time() + 600,
            subkey=insider.subkey,
            exclude_self=True,
            return_future=True,
        )
        assert not await asyncio.wait_for(future, 10)
        assert await nodes[0].roster() == honest  # its last honest record stays

    asyncio.run(body())


def test_a_joiner_with_another_token_is_told_at_start(pair: list[Discovery]) -> None:
    nodes = pair
    asyncio.run(_publish_all(nodes))
    stranger = Discovery(
        RUN,
        token="guess",
        initial_peers=nodes[0].bootstrap_addresses(),
        start_timeout_s=SLOW_START_S,
    )
    try:
        with pytest.raises(DiscoveryError, match="refused our join token"):
            stranger.start()
    finally:
        stranger.shutdown()
