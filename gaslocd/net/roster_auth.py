"""The run's credential on DHT records: only holders of the join token can be in a roster.

hivemind's ``RSASignatureValidator`` proves who wrote a subkey, not that the writer belongs
to the run: anyone who reaches the DHT can make a key and store records (a round-0 record
stalls pacing, a huge round drags everyone, a plain value over the roster key empties it).
So every record also carries a tag under the **run key**::

    run key = HMAC-SHA256(key=token, msg="gaslocd/run-key/" + run_id)

(the same key the gRPC wire uses). With no token, allowed on loopback only, the key comes
from the run id alone: it keeps other runs apart and protects nothing from strangers.

* Roster records (key ``gaslocd/<run_id>/peers``) hold the tag in their value, as the
  field ``auth`` = HMAC(run key, owner public key, canonical record bytes): a tag cannot be
  moved to another key, and :meth:`Discovery.roster` checks it again on read. The owner's
  RSA signature (over the value with its tag) still says which holder wrote it.
* Every other key of the DHT (hivemind's DiLoCo matchmaking, ``<run_id>-diloco...``) gets
  a suffix tag over (key id, subkey, value, expiration), added and removed by
  :class:`RunRecordValidator` itself, so outsiders cannot store anything on our nodes.

:class:`RunRecordValidator` runs in every honest DHT node, on store and on every record a
remote node returns: a plain value over the roster key, a record without the tag, a record
that does not parse or is implausible (:meth:`PeerRecord.check_plausible`) is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import multiprocessing
import re
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from gaslocd.net.auth import run_key
from gaslocd.protocol.records import PeerRecord

AUTH_FIELD = "auth"
_OWNER_RE = re.compile(RSASignatureValidator.PUBLIC_KEY_REGEX)
_SUFFIX_HEAD, _SUFFIX_TAIL = b"[gaslocd-run:", b"]"
_SUFFIX_LEN = len(_SUFFIX_HEAD) + 64 + len(_SUFFIX_TAIL)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


class WrongCredential(ValueError):
    """A well-formed tag under another key: another token (or a forger); worth a hint."""


def roster_key(run_id: str) -> str:
    """The DHT key of a run's roster; one subkey per peer."""
    return f"gaslocd/{run_id}/peers"


def owner_key(subkey: bytes) -> bytes:
    """The OpenSSH public key in a signed subkey (``[owner:ssh-rsa ...]``), or ``ValueError``."""
    owners = _OWNER_RE.findall(subkey)
    _check(len(owners) == 1, "subkey does not carry exactly one owner key (unsigned)")
    return bytes(owners[0])


@functools.lru_cache(maxsize=4096)
def peer_id_of_owner(owner: bytes) -> str:
    """The libp2p peer id of an OpenSSH RSA public key; ``ValueError`` on garbage.

    libp2p's rule: sha2-256 multihash of the protobuf PublicKey holding the DER key.
    """
    try:
        public_key = serialization.load_ssh_public_key(owner)
    except Exception as error:  # cryptography raises several types on garbage
        raise ValueError(f"owner key does not parse: {error}") from None
    _check(isinstance(public_key, rsa.RSAPublicKey), "owner key is not an RSA key")
    der = public_key.public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    message = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    return str(PeerID(b"\x12\x20" + hashlib.sha256(message).digest()).to_base58())


def record_tag(key: bytes, owner: bytes, value: Mapping[str, Any]) -> str:
    """HMAC of a roster value (all fields but the tag) bound to its owner's public key.

    Canonical bytes are sorted-key JSON: msgpack round-trips keep str/int/float types, so
    the writer and every reader hash the same text. A value JSON cannot hold (bytes, NaN)
    raises ``ValueError``, and such a value is refused anyway.
    """
    body = {k: v for k, v in value.items() if k != AUTH_FIELD}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"record is not plain data: {error}") from None
    message = b"gaslocd/record/v1\0" + len(owner).to_bytes(4, "big") + owner + text.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign_entry(key: bytes, owner: bytes, value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` with its run tag, ready to store under ``owner``'s subkey."""
    return {**value, AUTH_FIELD: record_tag(key, owner, value)}


def check_entry(key: bytes, subkey: bytes, value: object, now: float) -> PeerRecord | None:
    """A roster entry's record, ``None`` for a tombstone, or ``ValueError`` (with why).

    ``subkey`` may be the raw subkey or its msgpack bytes (the owner key is found in both).
    """
    owner = owner_key(subkey)
    _check(isinstance(value, Mapping), "value is not a record")
    assert isinstance(value, Mapping)
    tag = value.get(AUTH_FIELD)
    _check(isinstance(tag, str) and len(tag) == 64, "record carries no run credential")
    assert isinstance(tag, str)
    want = record_tag(key, owner, value)
    if not hmac.compare_digest(tag.encode(), want.encode()):
        raise WrongCredential("run credential is wrong (another join token?)")
    owner_id = peer_id_of_owner(owner)
    if value.get("left") is True:
        _check(value.get("peer_id") == owner_id, "tombstone for another peer")
        return None
    record = PeerRecord.from_wire(value)
    _check(
        record.peer_id == owner_id,
        f"record claims peer id {record.peer_id} but is signed by {owner_id}",
    )
    record.check_plausible(now)
    return record


class RunRecordValidator(RecordValidatorBase):
    """Refuses, in a DHT node, every record not written by a holder of the run key.

    Priority 5, below ``RSASignatureValidator`` (10): on store the run tag is added first
    and the owner signs the value with it; on validation the signature is checked and
    stripped first, so :meth:`validate` sees the value with our tag.
    """

    def __init__(self, run_id: str, token: str) -> None:
        self._key = run_key(token, run_id)
        self._roster_id = DHTID.generate(source=roster_key(run_id)).to_bytes()
        # Roster entries refused for a wrong tag, in memory shared with the forked DHT
        # process: a daemon with a mistyped --token sees an empty roster, and says why.
        self.wrong_credential = multiprocessing.get_context("fork").RawValue("Q", 0)

    @property
    def priority(self) -> int:
        return 5

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False  # two runs' validators in one DHT would both apply

    def validate(self, record: DHTRecord) -> bool:
        try:
            if record.key == self._roster_id:
                value = MSGPackSerializer.loads(record.value)
                try:
                    check_entry(self._key, record.subkey, value, get_dht_time())
                except WrongCredential:
                    self.wrong_credential.value += 1
                    return False
                return True
            body, suffix = record.value[:-_SUFFIX_LEN], record.value[-_SUFFIX_LEN:]
            want = self._suffix(dataclasses.replace(record, value=body))
            return hmac.compare_digest(suffix, want)
        except Exception:  # anything malformed: refused, never an error in the DHT
            return False

    def sign_value(self, record: DHTRecord) -> bytes:
        if record.key == self._roster_id:
            return record.value  # the tag is in the value (Discovery.publish)
        return record.value + self._suffix(record)

    def strip_value(self, record: DHTRecord) -> bytes:
        value = record.value
        tagged = value.endswith(_SUFFIX_TAIL) and value[-_SUFFIX_LEN:].startswith(_SUFFIX_HEAD)
        return value[:-_SUFFIX_LEN] if tagged and record.key != self._roster_id else value

    def _suffix(self, record: DHTRecord) -> bytes:
        signed = MSGPackSerializer.dumps(dataclasses.astuple(record))
        mac = hmac.new(self._key, b"gaslocd/dht/v1\0" + signed, hashlib.sha256).hexdigest()
        return _SUFFIX_HEAD + mac.encode() + _SUFFIX_TAIL
