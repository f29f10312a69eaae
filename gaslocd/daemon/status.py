"""``gaslocd status [ADDR]``: one Status call to a running daemon, printed for a person.

An operator tool with no roster and no peer key: the call carries the run credential
(HMAC under the run key, from ``--token``) but no signature, and a daemon answers only
``Status`` to such a call (docs/design.md §3).
"""

from __future__ import annotations

import json
import sys

import grpc

from gaslocd.config import WireConfig
from gaslocd.net.auth import CallAuth
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.security import channel_credentials, channel_options

# Not the client module: it imports torch (codecs, streams), which a health check every
# 30 s must not pay for (seconds and hundreds of MB on each call). tests/test_cli.py
# checks that `gaslocd status` imports neither torch nor hivemind.
_STATUS = f"/{pb.DESCRIPTOR.services_by_name['Peer'].full_name}/Status"


async def _status(
    address: str, wire: WireConfig, run_id: str, timeout_s: float
) -> dict[str, object]:
    auth = CallAuth(run_id, wire.token, "gaslocd-status", None, lambda _peer: None)
    credentials = channel_credentials(wire)
    options = channel_options(wire)
    if credentials is None:
        channel = grpc.aio.insecure_channel(address, options=options)
    else:
        channel = grpc.aio.secure_channel(address, credentials, options=options)
    try:
        call = channel.unary_unary(
            _STATUS,
            request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusReply.FromString,
        )
        metadata, _ = auth.metadata("", "Status")
        reply: pb.StatusReply = await call(
            pb.StatusRequest(run_id=run_id), timeout=timeout_s, metadata=metadata
        )
    finally:
        await channel.close()
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
