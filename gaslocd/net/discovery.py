"""Peer discovery over hivemind's DHT: who is in the run, where to reach them, what they train.

Every daemon writes one :class:`PeerRecord` under the key ``gaslocd/<run_id>/peers``, in a
subkey of its own that carries its RSA public key (hivemind's ``RSASignatureValidator``).
Every DHT node checks the signature on store, so nobody can overwrite or forge another
peer's subkey. The same RSA key is also the node's libp2p identity, so a peer id in a
record can be checked against the key that signed it: a peer cannot pose as another one
under its own subkey either (it could otherwise duplicate a victim in everyone's roster).
Only holders of the run's credential can write at all: every value carries an HMAC under
the run key, checked by every honest DHT node on store and again here on read
(:mod:`gaslocd.net.roster_auth`), with the record's plausibility.

Records are heartbeats: each expires ``record_ttl_s`` after it was published, so a peer
that dies without a word leaves the roster within one ttl. hivemind cannot delete a
value, so a graceful exit stores a signed tombstone that :meth:`Discovery.roster` skips.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import tempfile
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.timed_storage import get_dht_time

from gaslocd.net import dht_traffic
from gaslocd.net.children import DHTProcess, scratch_event_loop, stop_process
from gaslocd.net.direct_store import direct_store
from gaslocd.net.identity import load_or_create_identity, write_identity
from gaslocd.net.maddr import host_maddr, parse_bootstrap
from gaslocd.net.rejoin import redial, remember
from gaslocd.net.roster_auth import (
    RunRecordValidator,
    check_entry,
    owner_key,
    peer_id_of_owner,
    roster_key,
    run_key,
    sign_entry,
)
from gaslocd.net.roster_read import FullRead, entries_of, own_copy, parse_entries
from gaslocd.protocol.records import WIRE_VERSION, PeerRecord

logger = logging.getLogger(__name__)
T = TypeVar("T")


class DiscoveryError(RuntimeError):
    """The DHT could not be started, joined or reached in time; the message is for a user."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass
class DiscoveryStats:
    """Counters for metrics: what went wrong without stopping the daemon."""

    # entries skipped by roster(): bad value, unsigned, forged id, no run credential, absurd
    malformed_records: int = 0
    publish_failures: int = 0  # publish() calls that were rejected or timed out
    roster_timeouts: int = 0
    full_reads: int = 0  # roster reads that asked every node (get latest=True)
    quick_reads: int = 0  # those that read our node's copy (roster_read)
    rpc_traffic: dict[str, list[int]] = field(default_factory=dict)  # dht_traffic.tally


class Discovery:
    """One daemon's view of the run through a hivemind DHT node (a child process).

    :meth:`start` forks the DHT process (which runs the p2pd binary). Call it before the
    daemon creates any gRPC object, CUDA context or extra thread: a fork copies those in
    a broken state. The async methods may then be called from one asyncio event loop; each
    one is bounded by ``request_timeout_s`` and never blocks the loop on the network.
    """

    def __init__(
        self,
        run_id: str,
        *,
        initial_peers: Sequence[str] = (),
        host: str = "127.0.0.1",
        dht_port: int = 0,
        announce_host: str | None = None,
        record_ttl_s: float = 30.0,
        request_timeout_s: float = 5.0,
        start_timeout_s: float = 60.0,
        token: str = "",
        identity_path: str | None = None,
        client_mode: bool = False,
        heartbeat_s: float | None = None,
    ) -> None:
        """``client_mode``: a node behind NAT, which nobody can dial, reads and stores
        records through the others and serves none itself (hivemind's client mode).
        ``heartbeat_s``: how often peers publish (default ttl/3); our node's copy may be
        that far behind before quick reads stop standing in for full ones."""
        _check(
            bool(run_id) and len(run_id) <= 64 and run_id.isprintable() and " " not in run_id,
            f"run id must be 1..64 printable characters without spaces, got {run_id!r}",
        )
        _check(0 <= dht_port < 65536, f"DHT port must be in 0..65535, got {dht_port}")
        _check(
            announce_host is None or dht_port != 0,
            "announcing a DHT host needs an explicit DHT port (others cannot dial port 0)",
        )
        for name, value in (
            ("record ttl", record_ttl_s),
            ("request timeout", request_timeout_s),
            ("start timeout", start_timeout_s),
        ):
            _check(math.isfinite(value) and value > 0, f"{name} must be > 0 seconds, got {value}")
        self.run_id = run_id
        self.key = roster_key(run_id)
        # The run's credential (empty token: loopback only, derived from the run id alone).
        self._token, self._run_key = token, run_key(token, run_id)
        self._identity_path = identity_path
        self._run_validator = RunRecordValidator(run_id, token)
        self.private_key: RSAPrivateKey | None = None  # this peer's key, set by start()
        self.stats = DiscoveryStats()
        self._initial_peers = [parse_bootstrap(address) for address in initial_peers]
        self._host_maddrs = [host_maddr(host, dht_port)]
        self._announce = None if announce_host is None else [host_maddr(announce_host, dht_port)]
        self._ttl_s, self._timeout_s = record_ttl_s, request_timeout_s
        self._heartbeat_s = record_ttl_s / 3 if heartbeat_s is None else heartbeat_s
        self._start_timeout_s = start_timeout_s
        self._client_mode = client_mode
        self._dht: DHT | None = None
        self._subkey = b""
        self._peer_id = ""
        self._maddrs: list[str] = []
        self._published: tuple[PeerRecord, float] | None = None  # last record and its expiry
        self._owner = b""  # our OpenSSH public key, what our run tags are bound to
        self._keys: dict[str, bytes] = {}  # peer id -> owner key, from the last roster read
        self._known: dict[str, None] = {}  # peers seen in rosters, to re-dial after a cut
        self._full = FullRead()  # the last full roster read, for quick ones (roster_read)
        self.alone = False  # the last roster read found no other peer (or failed)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Fork the DHT process and join the run; blocks for about half a second.

        Raises :class:`DiscoveryError` when no bootstrap peer answers or the node does not
        come up within ``start_timeout_s``.
        """
        _check(self._dht is None, "Discovery.start() was already called")
        began = time.monotonic()
        if self._identity_path is None:
            private_key = RSAPrivateKey()
        else:
            try:
                private_key = load_or_create_identity(self._identity_path)
            except (OSError, ValueError) as error:
                raise DiscoveryError(f"cannot use identity file: {error}") from error
        validator = RSASignatureValidator(private_key)
        with scratch_event_loop(), tempfile.TemporaryDirectory(prefix="gaslocd-") as folder:
            identity = os.path.join(folder, "identity.key")
            write_identity(identity, private_key)  # p2pd reads it once, at start-up
            dht = DHTProcess(
                initial_peers=self._initial_peers,
                start=False,
                record_validators=[validator, self._run_validator],
                host_maddrs=self._host_maddrs,
                announce_maddrs=self._announce,
                identity_path=identity,
                check_if_identity_free=False,  # ours alone; checking costs a second p2pd
                wait_timeout=self._timeout_s,
                startup_timeout=self._start_timeout_s,
                ensure_bootstrap_success=True,
                client_mode=self._client_mode,
                cache_nearest=0,
                cache_refresh_before_expiry=0,  # see dht_traffic.py
            )
            try:
                dht.run_in_background(await_ready=True, timeout=self._start_timeout_s)
                peer_id = str(dht.peer_id.to_base58())
                self._maddrs = [str(maddr) for maddr in dht.get_visible_maddrs()]
            except Exception as error:
                stop_process(dht)
                raise DiscoveryError(self._start_failure(error)) from error
            self._check_credential(dht)
        self._dht, self._peer_id, self._subkey = dht, peer_id, validator.local_public_key
        self.private_key, self._owner = private_key, owner_key(self._subkey)
        # If this ever fails, roster() would reject our own record as forged: fail loudly now.
        assert peer_id == peer_id_of_owner(self._owner)
        logger.info(
            "DHT node %s up in %.2f s at %s", peer_id, time.monotonic() - began, self._maddrs
        )

    def _check_credential(self, dht: DHT) -> None:
        """A joiner with another token refuses every record it finds and would wait for
        peers it never sees: say so now (exit 3). Nothing refused: the roster polls go on."""
        if not self._initial_peers:
            return
        try:
            found = dht.get(self.key, latest=True, return_future=True).result(self._timeout_s)
        except Exception:  # slow or failing: the daemon's roster polls will tell
            return
        if found is None and self._run_validator.wrong_credential.value:
            stop_process(dht)
            raise DiscoveryError(
                f"the peers of run {self.run_id!r} refused our join token: their records "
                "carry another one (check --token)"
            )

    def _start_failure(self, error: BaseException) -> str:
        if isinstance(error, concurrent.futures.TimeoutError):
            reason = f"the DHT node did not come up within {self._start_timeout_s:g} s"
        else:
            reason = str(error).strip() or type(error).__name__
        if self._initial_peers:
            return (
                f"could not join the run through {', '.join(self._initial_peers)}: {reason}. "
                "Check that the address is current and that its host and port are reachable."
            )
        return f"could not start the DHT node on {self._host_maddrs[0]}: {reason}"

    def shutdown(self, *, quick: bool = False) -> None:
        """Stop the DHT process (idempotent). Call :meth:`withdraw` first on a graceful exit."""
        dht, self._dht = self._dht, None
        if dht is not None:
            stop_process(dht, quick=quick)

    def __enter__(self) -> Discovery:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.shutdown()

    # -- identity ------------------------------------------------------------------------

    @property
    def dht(self) -> DHT:
        """The running hivemind DHT (for :class:`gaslocd.net.allreduce.HivemindAllReduce`)."""
        _check(self._dht is not None, "Discovery is not started")
        assert self._dht is not None
        return self._dht

    @property
    def peer_id(self) -> str:
        """This node's base58 libp2p peer id; also what its records must carry."""
        _check(bool(self._peer_id), "Discovery is not started")
        return self._peer_id

    @property
    def subkey(self) -> bytes:
        """The signed subkey this peer writes under (holds its RSA public key)."""
        return self._subkey

    def bootstrap_addresses(self) -> list[str]:
        """Multiaddrs that others pass as ``--bootstrap`` to join through this node."""
        _check(bool(self._maddrs), "Discovery is not started")
        return list(self._maddrs)

    def public_key_of(self, peer_id: str) -> bytes | None:
        """A peer's OpenSSH public key from the last verified roster read (ours too), or
        ``None``: what the wire checks call signatures against."""
        if peer_id == self._peer_id and self._owner:
            return self._owner
        return self._keys.get(peer_id)

    async def redial(self) -> int:
        """After a cut: ping the peers we joined through or saw (:mod:`gaslocd.net.rejoin`)."""
        joined = [Multiaddr(address)["p2p"] for address in self._initial_peers]
        known = [p for p in [*joined, *self._known] if p != self._peer_id]
        return await redial(self.dht, known, self._timeout_s)

    async def count_rpcs(self) -> None:
        """Refresh ``stats.rpc_traffic`` from the DHT process (:mod:`gaslocd.net.dht_traffic`)."""
        future = self.dht.run_coroutine(dht_traffic.tally, return_future=True)
        self.stats.rpc_traffic = await self._bounded(future, "RPC tally")

    # -- records -------------------------------------------------------------------------

    async def _bounded(self, future: Awaitable[T], what: str) -> T:
        try:
            async with asyncio.timeout(self._timeout_s):  # wait_for may swallow a cancel
                return await future
        except TimeoutError:
            raise DiscoveryError(f"DHT {what} did not end within {self._timeout_s:g} s") from None

    async def publish(self, record: PeerRecord) -> None:
        """Store (or refresh) this peer's record until now + ``record_ttl_s``.

        Meant as a heartbeat every ttl/3; never waits for the slowest node (direct_store).
        Raises :class:`DiscoveryError` when our node refused it or did not answer in time
        (``stats.publish_failures``); the daemon logs that and retries at the next heartbeat.
        """
        _check(
            record.peer_id == self.peer_id,
            f"record peer id {record.peer_id} is not this node's ({self.peer_id})",
        )
        expiration = get_dht_time() + self._ttl_s
        value = sign_entry(self._run_key, self._owner, record.to_wire())
        try:  # what every honest node would refuse, refused here with the reason
            check_entry(self._run_key, self._subkey, value, get_dht_time())
        except ValueError as error:
            self.stats.publish_failures += 1
            raise DiscoveryError(f"our record would be refused: {error}") from None
        store = partial(direct_store, self.key, self._subkey, value, expiration)
        future = self.dht.run_coroutine(store, return_future=True)
        try:
            stored = await self._bounded(future, "publish")
        except DiscoveryError:
            self.stats.publish_failures += 1
            raise
        if not stored and not await self._stored(expiration):
            self.stats.publish_failures += 1
            raise DiscoveryError("publishing our record failed: no DHT node accepted it")
        self._published = (record, expiration)

    async def _stored(self, expiration: float) -> bool:
        """Whether our record of ``expiration`` is in the DHT after all.

        hivemind answers a store with the last replica's answer, so one hostile node among
        the replicas (holding a far-future plain value there) makes a store that every
        honest node took look refused; reading back tells the truth.
        """
        found = await self._bounded(self.dht.get(self.key, latest=True, return_future=True), "get")
        entries = found.value if found is not None and isinstance(found.value, dict) else {}
        entry = entries.get(self._subkey)
        if entry is None or entry.expiration_time < expiration:
            return False
        try:  # our node may cache what a hostile replica accepted: check it as roster() does
            check_entry(self._run_key, self._subkey, entry.value, get_dht_time())
        except ValueError:
            return False
        return True

    async def withdraw(self) -> None:
        """Tell the run that this peer left, so that peers stop pairing with it at once.

        hivemind keeps the value with the latest expiration per subkey and cannot delete,
        so this stores a signed tombstone that expires after any record of ours could (a
        stop cancels publishes in flight, but one the DHT process had begun still stores
        its record): it wins over every replica and then disappears by itself.
        """
        published, self._published = self._published, None
        if published is None or self._dht is None or published[1] <= get_dht_time():
            return
        left = {"v": WIRE_VERSION, "left": True, "peer_id": self.peer_id}
        tombstone = sign_entry(self._run_key, self._owner, left)
        expiration = max(published[1], get_dht_time() + self._ttl_s) + 1e-3
        store = partial(direct_store, self.key, self._subkey, tombstone, expiration, traverse=True)
        if not await self._bounded(self.dht.run_coroutine(store, return_future=True), "withdraw"):
            raise DiscoveryError("the DHT rejected our tombstone; our record expires by itself")

    @property
    def quick(self) -> bool:
        """Whether a quick roster read can be had (a full read finished before)."""
        return self._full.known

    async def roster(
        self, fingerprint: str | None = None, quick: bool | None = False
    ) -> list[PeerRecord]:
        """Fresh, valid records of the run (this peer's included once published), by peer id.

        ``fingerprint`` keeps only peers that train the same model. Malformed, unsigned,
        forged, implausible entries and those without the run's credential are skipped and
        counted in ``stats.malformed_records`` (our DHT node refused them already; this is
        the second check, on exactly what we plan from); a slow DHT raises
        :class:`DiscoveryError` after ``request_timeout_s``. ``quick``: our own node's
        copy merged with the last full read's (:mod:`gaslocd.net.roster_read`), no wait
        for other nodes; None: quick while the last full read vouches for our copy.
        """
        if quick is None:
            quick = self._full.trusted(get_dht_time())
        began, own = get_dht_time(), None
        try:
            if not quick:  # our node's copy as it was: the read merges what it finds into it
                own = await self._bounded(
                    self.dht.run_coroutine(partial(own_copy, self.key), return_future=True),
                    "read of our node's copy",
                )
            # latest=True merges the subkeys found on every replica; without it the first
            # (possibly cached, partial) copy of the dictionary would do.
            future = self.dht.get(self.key, latest=not quick, return_future=True)
            number = 0 if quick else self._full.watch(future)
            found = await self._bounded(future, "roster")
        except DiscoveryError:
            self.stats.roster_timeouts += 1
            self.alone = True
            raise
        now = get_dht_time()
        entries = entries_of(found)
        if own is None:
            self.stats.quick_reads += 1
            entries = self._full.merged(entries, now)
        records, keys, malformed, sitting = parse_entries(self._run_key, entries, now)
        if own is not None:
            self.stats.full_reads += 1
            self._full.keep(entries, number)
            late_s = now - began + self._heartbeat_s  # a publish during the read is no lapse
            self._full.check_own(entries, own, now, self._ttl_s / 2, late_s, sitting)
        self.stats.malformed_records += malformed
        self._keys = keys
        remember(self._known, keys)
        self.alone = not set(keys) - {self.peer_id}
        # Our own node stores our record too, so this only fills a gap (a racing get).
        if self._published is not None and self._published[1] > now:
            records.setdefault(self.peer_id, self._published[0])
        return sorted(
            (r for r in records.values() if fingerprint is None or r.fingerprint == fingerprint),
            key=lambda r: r.peer_id,
        )
