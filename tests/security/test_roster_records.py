"""The run credential and the plausibility bounds on roster records, without a network.

The DHT tests (test_roster_dht.py) show every honest node applies these; here each rule
is shown to refuse exactly what it should and to pass what honest daemons publish.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey

from gaslocd.net.identity import load_or_create_identity
from gaslocd.net.roster_auth import (
    RunRecordValidator,
    WrongCredential,
    check_entry,
    peer_id_of_owner,
    roster_key,
    run_key,
    sign_entry,
)
from gaslocd.protocol.records import PeerRecord

KEY = run_key("s3cret", "run")


def _owner() -> bytes:
    return bytes(RSAPrivateKey().get_public_key().to_bytes())


OWNER, OTHER = _owner(), _owner()
SUBKEY = b"[owner:" + OWNER + b"]"


def _record(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        peer_id=peer_id_of_owner(OWNER),
        address="127.0.0.1:7070",
        fingerprint="fp",
        round=3,
        inner_steps=30,
        step_time_s=0.25,
        bandwidth_bytes_per_s=1e9,
        version="0.1.0",
        started_at=time.time() - 60,
    )
    fields.update(changes)
    return PeerRecord(**fields).to_wire()


def test_run_key_depends_on_token_and_run() -> None:
    keys = {run_key(t, r) for t in ("", "a", "b") for r in ("run", "other")}
    assert len(keys) == 6  # no token: still one key per run, but anyone can compute it


def test_an_honest_entry_passes_and_a_tombstone_is_none() -> None:
    record = check_entry(KEY, SUBKEY, sign_entry(KEY, OWNER, _record()), time.time())
    assert record is not None and record.round == 3
    left = {"v": 1, "left": True, "peer_id": peer_id_of_owner(OWNER)}
    assert check_entry(KEY, SUBKEY, sign_entry(KEY, OWNER, left), time.time()) is None


@pytest.mark.parametrize(
    "case",
    ["no-tag", "other-token", "edited", "moved", "other-peer-id", "plain", "tombstone-of-other"],
)
def test_entries_without_a_valid_credential_are_refused(case: str) -> None:
    value: object = sign_entry(KEY, OWNER, _record())
    subkey = SUBKEY
    if case == "no-tag":
        value = _record()
    elif case == "other-token":
        value = sign_entry(run_key("guess", "run"), OWNER, _record())
    elif case == "edited":
        value = {**sign_entry(KEY, OWNER, _record()), "round": 4}
    elif case == "moved":  # a valid tag, stored under another key's subkey
        subkey = b"[owner:" + OTHER + b"]"
    elif case == "other-peer-id":  # a holder tagging a record that names someone else
        value = sign_entry(KEY, OTHER, _record())
        subkey = b"[owner:" + OTHER + b"]"
    elif case == "plain":
        value, subkey = "x", MSGPackSerializer.dumps(None)
    else:
        other = {"v": 1, "left": True, "peer_id": peer_id_of_owner(OTHER)}
        value = sign_entry(KEY, OWNER, other)
    with pytest.raises(ValueError):
        check_entry(KEY, subkey, value, time.time())


def test_a_wrong_tag_is_told_apart_from_garbage() -> None:
    with pytest.raises(WrongCredential):
        check_entry(KEY, SUBKEY, sign_entry(run_key("", "run"), OWNER, _record()), time.time())


@pytest.mark.parametrize(
    "changes",
    [
        {"round": 2**60},
        {"active_from": 2**60},
        {"started_at": time.time() + 3600},  # in the future beyond clock skew
        {"started_at": 1.0},  # 1970
        {"inner_steps": 10**9},
        {"step_time_s": 1e7},
        {"bandwidth_bytes_per_s": 1e15},
        {"address": "evil host:80"},
        {"address": "[not-v6]:80"},
        {"address": "-x:80"},
    ],
)
def test_absurd_records_are_refused_even_with_the_credential(changes: dict[str, Any]) -> None:
    entry = sign_entry(KEY, OWNER, _record(**changes))
    with pytest.raises(ValueError):
        check_entry(KEY, SUBKEY, entry, time.time())


@pytest.mark.parametrize(
    "changes",
    [
        {"round": 10**7, "active_from": 10**7 + 2, "started_at": time.time()},  # a joiner
        {"address": "[::1]:7070"},
        {"address": "peer-3.example.org:7070"},
        {"address": "0.0.0.0:7070"},
        {"step_time_s": 0.0, "bandwidth_bytes_per_s": 0.0},  # not measured yet
    ],
)
def test_honest_records_stay_plausible(changes: dict[str, Any]) -> None:
    assert check_entry(KEY, SUBKEY, sign_entry(KEY, OWNER, _record(**changes)), time.time())


def _dht_record(key: str, value: object, subkey: bytes = SUBKEY) -> DHTRecord:
    return DHTRecord(
        DHTID.generate(source=key).to_bytes(),
        MSGPackSerializer.dumps(subkey),
        MSGPackSerializer.dumps(value),
        time.time() + 10,
    )


def test_validator_checks_roster_entries_in_the_value() -> None:
    validator = RunRecordValidator("run", "s3cret")
    good = _dht_record(roster_key("run"), sign_entry(KEY, OWNER, _record()))
    assert validator.sign_value(good) == good.value  # the tag is already inside
    assert validator.validate(good) and validator.strip_value(good) == good.value
    assert not validator.validate(_dht_record(roster_key("run"), _record()))
    plain = DHTRecord(good.key, MSGPackSerializer.dumps(None), b"\xa1x", good.expiration_time)
    assert not validator.validate(plain)
    wrong = _dht_record(roster_key("run"), sign_entry(run_key("x", "run"), OWNER, _record()))
    assert not validator.validate(wrong) and validator.wrong_credential.value == 1


def test_validator_tags_every_other_key() -> None:
    validator = RunRecordValidator("run", "s3cret")
    record = _dht_record("run-diloco.0b01", 1.5, subkey=b"peer")
    signed = validator.sign_value(record)
    tagged = DHTRecord(record.key, record.subkey, signed, record.expiration_time)
    assert validator.validate(tagged)
    assert validator.strip_value(tagged) == record.value
    assert not validator.validate(record)  # untagged: an outsider's value
    assert not RunRecordValidator("run", "other").validate(tagged)
    later = DHTRecord(record.key, record.subkey, signed, record.expiration_time + 1)
    assert not validator.validate(later)  # the tag covers the expiration too


def test_identity_file_is_created_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "identity.key"
    first = load_or_create_identity(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = load_or_create_identity(str(path))
    assert again.get_public_key().to_bytes() == first.get_public_key().to_bytes()
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="does not hold a key"):
        load_or_create_identity(str(path))
