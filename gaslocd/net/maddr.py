"""The multiaddrs a volunteer types (``--bootstrap``) and a DHT node listens on."""

from __future__ import annotations

import ipaddress

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr


def host_maddr(host: str, port: int) -> str:
    """The TCP multiaddr of ``host`` (an IP literal, else a DNS name) and ``port``."""
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        return f"/dns/{host}/tcp/{port}"
    return f"/ip{version}/{host}/tcp/{port}"


def parse_bootstrap(address: str) -> str:
    """Check one ``--bootstrap`` multiaddr; ``ValueError`` with a message a volunteer can act on."""
    try:
        PeerID.from_base58(Multiaddr(address)["p2p"])
    except Exception as error:  # the multiaddr library raises several unrelated types
        raise ValueError(
            f"bad bootstrap address {address!r}: {error}; expected a multiaddr such as "
            "/ip4/203.0.113.5/tcp/31337/p2p/12D3KooW... (printed by `gaslocd start`)"
        ) from None
    return address
