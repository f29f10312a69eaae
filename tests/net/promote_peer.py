"""A DHT node that starts as a client and is promoted to a server, in its own process,
for tests/net/test_probe.py.

Discovery forks its DHT process, which must not happen in a process that already ran
gRPC (the test session has); so this runs alone and prints one JSON line of what it saw:
whether a newcomer could join through the node before and after ``become_dht_server``,
and whether the node reads the DHT and is found by others afterwards.
"""

from __future__ import annotations

import asyncio
import json

from gaslocd.net.discovery import Discovery, DiscoveryError
from gaslocd.net.probe import become_dht_server


def joins_through(addresses: list[str]) -> bool:
    node = Discovery("probe-dht", initial_peers=addresses, start_timeout_s=10.0)
    try:
        node.start()
    except DiscoveryError:
        return False
    finally:
        node.shutdown()
    return True


def main() -> None:
    with (
        Discovery("probe-dht") as first,
        Discovery(
            "probe-dht", initial_peers=first.bootstrap_addresses(), client_mode=True
        ) as second,
    ):
        through = second.bootstrap_addresses()
        before = joins_through(through)
        promoted = asyncio.run(become_dht_server(second.dht))
        again = asyncio.run(become_dht_server(second.dht))  # idempotent
        after = joins_through(through)
        roster = asyncio.run(second.roster())
    seen = {"before": before, "promoted": promoted, "again": again, "after": after}
    print(json.dumps({**seen, "roster": len(roster)}))


if __name__ == "__main__":
    main()
