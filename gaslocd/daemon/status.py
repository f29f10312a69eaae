"""``gaslocd status [ADDR]``: one Status call to a running daemon, printed for a person.

An operator tool with no roster and no peer key: the call carries the run credential
(HMAC under the run key, from ``--token``) but no signature, and a daemon answers only
``Status`` to such a call (docs/design.md §3).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc

from gaslocd.config import WireConfig
from gaslocd.net.auth import CallAuth
from gaslocd.net.client import PeerClient
from gaslocd.net.validation import Identity, WireStats


async def _status(
    address: str, wire: WireConfig, run_id: str, timeout_s: float
) -> dict[str, object]:
    with ThreadPoolExecutor(1) as executor:
        me = Identity(run_id, "gaslocd-status", "")
        auth = CallAuth(run_id, wire.token, me.peer_id, None, lambda _peer: None)
        client = PeerClient(wire, me, executor, WireStats(), auth)
        try:
            reply = await client.status(address, timeout_s)
        finally:
            await client.close()
    return {
        "peer_id": reply.peer_id,
        "run_id": reply.run_id,
        "version": reply.version,
        **dict(reply.fields),
    }


def query_status(
    address: str, *, run_id: str, wire: WireConfig, timeout_s: float, as_json: bool
) -> int:
    """Print the daemon's status; 0 when it answered, 1 when it did not (with why)."""
    import asyncio

    try:
        fields = asyncio.run(_status(address, wire, run_id, timeout_s))
    except grpc.aio.AioRpcError as exc:
        print(
            f"gaslocd: {address} did not answer: {exc.code().name}: {exc.details()}",
            file=sys.stderr,
        )
        return 1
    if as_json:
        print(json.dumps(fields, indent=1))
    else:
        width = max(len(k) for k in fields)
        for key, value in fields.items():
            print(f"{key:<{width}}  {value}")
    return 0
