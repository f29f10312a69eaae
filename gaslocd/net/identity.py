"""A peer's RSA key: its DHT peer id, the owner of its roster subkey, its call signatures.

Kept in a file (``--identity``, by default ``<checkpoint-dir>/identity.key``) so that a
restarted daemon keeps its peer id and the bootstrap address others were given. The file
is libp2p's own format (a protobuf ``PrivateKey`` around the DER key), which p2pd reads
as it is; it is created with mode 0600 and never overwritten.
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey


def identity_bytes(key: RSAPrivateKey) -> bytes:
    """``key`` as a libp2p identity file's content."""
    return bytes(
        crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=key.to_bytes()).SerializeToString()
    )


def write_identity(path: str, key: RSAPrivateKey) -> None:
    """Write ``key`` as a libp2p identity file (for p2pd, which reads it at start-up)."""
    with open(path, "wb") as file:
        file.write(identity_bytes(key))


def _parse(path: str, raw: bytes) -> RSAPrivateKey:
    message = crypto_pb2.PrivateKey()
    try:
        message.ParseFromString(raw)
        key = serialization.load_der_private_key(message.data, password=None)
    except Exception as error:  # protobuf and cryptography raise several types
        raise ValueError(f"identity file {path} does not hold a key: {error}") from None
    if message.key_type != crypto_pb2.RSA or not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError(f"identity file {path} does not hold an RSA key")
    result = RSAPrivateKey.__new__(RSAPrivateKey)  # hivemind has no loader; this is unpickling
    result.__setstate__({"_private_key": message.data})
    return result


def load_or_create_identity(path: str) -> RSAPrivateKey:
    """The key in ``path``; a new one written there (0600) if the file does not exist.

    ``ValueError`` (a message for the user) when it holds something else: never replace
    a key silently, the peer id would change under the operator's feet.
    """
    try:
        with open(path, "rb") as file:
            return _parse(path, file.read())
    except FileNotFoundError:
        pass
    key = RSAPrivateKey()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it meanwhile: use theirs
        with open(path, "rb") as file:
            return _parse(path, file.read())
    with os.fdopen(fd, "wb") as file:
        file.write(identity_bytes(key))
    return key
