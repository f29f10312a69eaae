"""An outsider's DHT client in its own process, for tests/security/test_roster_daemons.py.

Usage: roster_attacker.py RUN_ID BOOTSTRAP. Joins the run's DHT with a plain hivemind node
(its own RSA key, no join token) and stores, over and over until killed, what the audit
found harmful without a credential: a record at round 0 (pacing waits for it), one at a
huge round with a guessed tag (catch-up), one pointing at a dead address, and a plain
value over the roster key. After the first batch it prints one JSON line: how many of
those stores the run's nodes accepted when asked alone (``exclude_self``).
"""

from __future__ import annotations

import json
import sys
import time

from hivemind import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils.crypto import RSAPrivateKey

from gaslocd.net.roster_auth import roster_key
from gaslocd.protocol.records import PeerRecord


def forged(peer_id: str, round_: int, address: str, fingerprint: str) -> dict[str, object]:
    return PeerRecord(
        peer_id=peer_id,
        address=address,
        fingerprint=fingerprint,
        round=round_,
        inner_steps=1,
        step_time_s=0.1,
        bandwidth_bytes_per_s=1e9,
        version="0.0.0",
        started_at=time.time(),
    ).to_wire()


def batch(dht: DHT, key: str, subkey: bytes, values: list[object], *, alone: bool) -> int:
    """Store every value (the plain one without a subkey); how many stores were taken."""
    taken = 0
    for value in values:
        plain = not isinstance(value, dict)
        taken += bool(
            dht.store(
                key,
                value,
                time.time() + 600,
                subkey=None if plain else subkey,
                exclude_self=alone,
            )
        )
    return taken


def honest_fingerprint(dht: DHT, key: str) -> str:
    """Reading is open to anyone: copy the model fingerprint from an honest record."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = dht.get(key, latest=True)
        for entry in (found.value if found is not None else {}).values():
            if isinstance(entry.value, dict) and "fingerprint" in entry.value:
                return str(entry.value["fingerprint"])
        time.sleep(0.2)  # polling the DHT, bounded by the deadline
    raise SystemExit("no honest record found within 60 s")


def main() -> None:
    run_id, bootstrap = sys.argv[1], sys.argv[2]
    signer = RSASignatureValidator(RSAPrivateKey())
    dht = DHT(initial_peers=[bootstrap], start=True, record_validators=[signer])
    me, key, subkey = str(dht.peer_id.to_base58()), roster_key(run_id), signer.local_public_key
    fingerprint = honest_fingerprint(dht, key)
    values: list[object] = [
        forged(me, 0, "127.0.0.1:7070", fingerprint),
        {**forged(me, 2**61, "127.0.0.1:7070", fingerprint), "auth": "0" * 64},
        forged(me, 1, "203.0.113.1:9", fingerprint),  # a dead address
        "gone",  # over the roster key itself
    ]
    try:
        accepted = batch(dht, key, subkey, values, alone=True)
        print(json.dumps({"peer_id": me, "accepted": accepted}), flush=True)
        while True:  # until killed
            batch(dht, key, subkey, values, alone=False)
            time.sleep(0.05)  # a steady stream, not a CPU hog on a 2-core test machine
    finally:
        dht.shutdown()


if __name__ == "__main__":
    main()
