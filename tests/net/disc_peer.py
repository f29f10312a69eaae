"""A peer in its own process for tests/net/test_discovery.py: join, publish, heartbeat.

Usage: disc_peer.py RUN_ID BOOTSTRAP TTL_S. Prints one JSON line (its peer id and the pid
of its DHT child) once its record is published, then refreshes it every ttl/3 until
killed. The test kills it with SIGKILL, as the OOM killer would.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from gaslocd.net.discovery import Discovery, PeerRecord


async def heartbeat(discovery: Discovery, ttl_s: float) -> None:
    record = PeerRecord(
        peer_id=discovery.peer_id,
        address="127.0.0.1:1",
        fingerprint="fp",
        round=0,
        inner_steps=1,
        step_time_s=0.1,
        bandwidth_bytes_per_s=0.0,
        version="test",
        started_at=time.time(),
    )
    await discovery.publish(record)
    print(json.dumps({"peer_id": discovery.peer_id, "dht_pid": discovery.dht.pid}), flush=True)
    while True:
        await asyncio.sleep(ttl_s / 3)  # the heartbeat period, not a synchronization
        await discovery.publish(record)


def main() -> None:
    run_id, bootstrap, ttl_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    discovery = Discovery(run_id, initial_peers=[bootstrap], record_ttl_s=ttl_s)
    discovery.start()
    try:
        asyncio.run(heartbeat(discovery, ttl_s))
    finally:
        discovery.shutdown()
        print(f"exiting {os.getpid()}", file=sys.stderr)


if __name__ == "__main__":
    main()
