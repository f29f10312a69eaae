"""A DHT node demoted to a client, in its own process, for tests/net/test_probe.py.

Discovery forks its DHT process, which must not happen in a process that already ran
gRPC (the test session has); so this runs alone and prints one JSON line of what it saw:
whether a newcomer could join through the node before and after ``become_dht_client``,
and whether the node still reads the DHT afterwards.
"""

from __future__ import annotations

import asyncio
import json

from gaslocd.net.discovery import Discovery, DiscoveryError
from gaslocd.net.probe import become_dht_client


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
        Discovery("probe-dht", initial_peers=first.bootstrap_addresses()) as second,
    ):
        through = second.bootstrap_addresses()
        before = joins_through(through)
        demoted = asyncio.run(become_dht_client(second.dht))
        after = joins_through(through)
        roster = asyncio.run(second.roster())
    print(json.dumps({"before": before, "demoted": demoted, "after": after, "roster": len(roster)}))


if __name__ == "__main__":
    main()
