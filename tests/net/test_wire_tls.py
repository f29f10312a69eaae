"""TLS (mutual: each peer's cert is also its client identity) between two real processes;
a plaintext caller to a TLS peer fails cleanly and fast."""

from __future__ import annotations

import datetime
import ipaddress
import time
from pathlib import Path

import grpc
import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from wire_control import start_peers
from wire_peer import theta_of
from wire_raw import data_messages, header, raw_exchange

from gaslocd.net.frames import frame_header

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(directory: Path) -> dict[str, Path]:
    """A throwaway CA and one leaf cert for 127.0.0.1 (shared by both test peers)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("gaslocd test CA"))
        .issuer_name(_name("gaslocd test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("gaslocd peer"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = {
        "ca": directory / "ca.pem",
        "cert": directory / "peer.pem",
        "key": directory / "peer.key",
    }
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def test_tls_exchange_and_plaintext_refused(tmp_path: Path, reaper: list) -> None:
    pki = make_pki(tmp_path)
    numel = 100_000
    args = [
        "--numel", str(numel),
        "--tls-cert", str(pki["cert"]),
        "--tls-key", str(pki["key"]),
        "--tls-ca", str(pki["ca"]),
    ]  # fmt: skip
    peers = start_peers(tmp_path, {"a-tls": args, "b-tls": args})
    reaper.extend(p.proc for p in peers.values())
    a, b = peers["a-tls"], peers["b-tls"]
    a.start_round(1, {"b-tls": b.address}, deadline_s=30, codec="bf16")
    b.start_round(1, {"a-tls": a.address}, deadline_s=30, codec="bf16")
    for peer, other in ((a, "b-tls"), (b, "a-tls")):
        outcome = peer.expect("round", 60)["outcomes"][other]
        assert outcome["ok"] and outcome["rel_err"] < 3e-3, outcome

    messages = [
        frame_header(header(numel, 1 << 20)),
        *data_messages(theta_of("a", numel, 0), 1 << 20),
    ]
    start = time.monotonic()
    plain = uvloop.run(raw_exchange(b.address, messages, timeout_s=10))
    assert plain.status == grpc.StatusCode.UNAVAILABLE, plain
    assert time.monotonic() - start < 8  # a clean failure, not a wait for the deadline

    # TLS without a client certificate: the server requires one (mutual TLS).
    no_client_cert = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
    anon = uvloop.run(raw_exchange(b.address, messages, timeout_s=10, credentials=no_client_cert))
    assert anon.status == grpc.StatusCode.UNAVAILABLE, anon
    assert b.stats()["exchanges_ok"] == 1
    a.quit()
    b.quit()
