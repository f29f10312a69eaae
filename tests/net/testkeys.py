"""Peer keys for wire tests: one RSA key per peer id, shared by every test process.

A daemon takes its peers' public keys from the DHT roster; the wire tests have no DHT, so
each peer id's key lives in a file here instead, created once (the first process to ask
wins an exclusive ``os.link``; a racing one reads the winner's) and reused across runs.
A peer id nobody has asked a key for is *unknown* (``public_key_of`` gives None), which is
what the tests use for strangers.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from hivemind.utils.crypto import RSAPrivateKey

from gaslocd.net.auth import CallAuth

KEYS_DIR = Path(tempfile.gettempdir()) / f"gaslocd-test-keys-{os.getuid()}"
_cache: dict[str, RSAPrivateKey] = {}


def _path(peer: str) -> Path:
    return KEYS_DIR / (hashlib.sha256(peer.encode()).hexdigest()[:32] + ".der")


def _load(raw: bytes) -> RSAPrivateKey:
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": raw})
    return key


def private_key(peer: str) -> RSAPrivateKey:
    """``peer``'s key, created on first use."""
    key = _cache.get(peer)
    if key is not None:
        return key
    path = _path(peer)
    if not path.exists():
        KEYS_DIR.mkdir(parents=True, exist_ok=True)
        fresh = RSAPrivateKey()
        fd, tmp = tempfile.mkstemp(dir=KEYS_DIR)
        with os.fdopen(fd, "wb") as f:
            f.write(fresh.to_bytes())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    key = _cache[peer] = _load(path.read_bytes())
    return key


def public_key_of(peer: str) -> bytes | None:
    """``peer``'s OpenSSH public key, or None for a peer that has no key yet."""
    if peer not in _cache and not _path(peer).exists():
        return None
    return private_key(peer).get_public_key().to_bytes()


def auth_for(run_id: str, peer: str, token: str = "tok", **kwargs: object) -> CallAuth:
    """Credentials of ``peer`` in ``run_id``, knowing every test peer's key."""
    return CallAuth(run_id, token, peer, private_key(peer), public_key_of, **kwargs)  # type: ignore[arg-type]
