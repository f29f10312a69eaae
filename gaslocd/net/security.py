"""gRPC channel and server options, and TLS credentials, from a :class:`WireConfig`.

Message limits are set *just above* the largest chunk we accept, not raised to the model
size: a peer cannot make us buffer one huge message, and a sender that ignores chunking
fails loudly instead of slowly (docs/design.md §3: one 256 MiB message is ~10× slower anyway).

Keepalive pings detect a peer whose machine vanished without closing its sockets; the
per-call deadline is still what bounds a round (a ping interval is not a deadline).
``so_reuseport`` is off so that two servers on one machine never share a port by accident.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from gaslocd.config import WireConfig


def channel_options(config: WireConfig) -> list[tuple[str, int | str]]:
    options: list[tuple[str, int | str]] = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        # A peer that went away should be retried quickly in the next round, not after
        # gRPC's default reconnect backoff of up to two minutes.
        ("grpc.max_reconnect_backoff_ms", 2000),
        ("grpc.enable_retries", 0),  # an exchange is not idempotent: never replay it
    ]
    if config.tls_server_name:
        options.append(("grpc.ssl_target_name_override", config.tls_server_name))
    return options


def server_options(config: WireConfig) -> list[tuple[str, int | str]]:
    return [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        # accept the clients' pings (same interval as ours) instead of calling them abusive
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.keepalive_time_s * 500)),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.so_reuseport", 0),
    ]


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def server_credentials(config: WireConfig) -> grpc.ServerCredentials | None:
    """TLS for the server, or None for plaintext. With a CA, clients must present a cert."""
    if not config.tls:
        return None
    key, cert, ca = _read(config.tls_key), _read(config.tls_cert), _read(config.tls_ca)
    assert key is not None and cert is not None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def channel_credentials(config: WireConfig) -> grpc.ChannelCredentials | None:
    """TLS for dialing peers (our cert as client identity), or None for plaintext."""
    if not config.tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(config.tls_ca),
        private_key=_read(config.tls_key),
        certificate_chain=_read(config.tls_cert),
    )
