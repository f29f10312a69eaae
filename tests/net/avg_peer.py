"""One all-reduce peer in its own process for tests/net/test_allreduce.py.

Usage: avg_peer.py RUN_ID BOOTSTRAP NUMEL GROUP_SIZE MATCHMAKING_S [NEXT_CHUNK_S]
(BOOTSTRAP "-": none; NEXT_CHUNK_S, how long a silent member is waited for, 2 s by default).

Starts a DHT node (gaslocd.net.discovery.Discovery) and a HivemindAllReduce on it, then
prints one JSON line: its pid, its DHT and averager children's pids and the node's
bootstrap addresses. It then reads one JSON command a line from stdin and answers each
with one JSON line on stdout:

* ``{"round": R, "input": PATH, "output": PATH, "timeout_s": T, "kill_at": STAGE|null}``
  averages the tensor saved at ``input`` for round R; on success it saves the mean to
  ``output`` and answers ``{"ok": true, "group_size": N, "elapsed_s": S}``, otherwise
  ``{"ok": false, "error": TYPE, "message": ..., "elapsed_s": S}``. With ``kill_at``, the
  peer SIGKILLs its whole process group (itself, its DHT and averager children and their
  p2pd) as soon as its step reaches that stage: a machine losing power. With
  ``"freeze": [STAGE, SECONDS]`` the peer SIGSTOPs its averager child for that long once
  its step reaches the stage: a machine that stalls (swapping, a laptop lid) and comes back.
* ``{"quit": true}`` (or the end of stdin) shuts the peer down; it exits 0.

hivemind's children share their parent's ``MPFuture`` lock, so a peer killed while one of
them held it could wedge every process forked from the same parent. One process per peer
means a killed peer takes only itself down.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import torch

from gaslocd.net.allreduce import AllReduceFailed, HivemindAllReduce
from gaslocd.net.discovery import Discovery

_STAGE_POLL_S = 0.005  # how often the peer looks at its step's stage when told to die


def _say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


async def _reached(stage: str, peer: HivemindAllReduce, limit_s: float) -> bool:
    """Whether the peer's step reached ``stage`` within ``limit_s`` (if not, the test sees
    the missing fault in the outcome)."""
    end = time.monotonic() + limit_s
    while peer.stage != stage:
        if time.monotonic() > end:
            return False
        await asyncio.sleep(_STAGE_POLL_S)
    return True


async def _die_at(stage: str, peer: HivemindAllReduce, limit_s: float) -> None:
    if await _reached(stage, peer, limit_s):
        os.killpg(os.getpgid(0), signal.SIGKILL)


async def _freeze_at(stage: str, seconds: float, peer: HivemindAllReduce, limit_s: float) -> None:
    if not await _reached(stage, peer, limit_s):
        return
    child = peer._averager.pid  # type: ignore[union-attr]
    os.kill(child, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)  # the stall's length is the fault being injected
    finally:
        os.kill(child, signal.SIGCONT)


async def _average(peer: HivemindAllReduce, command: dict[str, Any]) -> dict[str, Any]:
    tensor = torch.load(command["input"])
    killer = None
    if command.get("kill_at"):
        killer = asyncio.create_task(_die_at(command["kill_at"], peer, command["timeout_s"]))
    elif command.get("freeze"):
        stage, seconds = command["freeze"]
        killer = asyncio.create_task(_freeze_at(stage, seconds, peer, command["timeout_s"]))
    began = time.monotonic()
    try:
        result, group_size = await peer.average(
            command["round"], tensor, timeout_s=command["timeout_s"]
        )
    except (AllReduceFailed, ValueError) as error:
        elapsed = time.monotonic() - began
        failure = {"ok": False, "error": type(error).__name__, "message": str(error)}
        return {**failure, "elapsed_s": elapsed}
    finally:
        if killer is not None:
            killer.cancel()  # a stall still under way ends here (its SIGCONT)
    elapsed = time.monotonic() - began
    torch.save(result, command["output"])
    return {"ok": True, "group_size": group_size, "elapsed_s": elapsed}


async def _serve(peer: HivemindAllReduce) -> None:
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        command = json.loads(line)
        if command.get("quit"):
            return
        _say(await _average(peer, command))


def main() -> None:
    run_id, bootstrap, numel, group_size, matchmaking_s = sys.argv[1:6]
    next_chunk_s = float(sys.argv[6]) if len(sys.argv) > 6 else 2.0
    if os.getpgid(0) != os.getpid():
        sys.exit("avg_peer.py must lead its own process group (start_new_session=True)")
    node = Discovery(run_id, initial_peers=[] if bootstrap == "-" else [bootstrap])
    node.start()
    peer = HivemindAllReduce(
        node,
        prefix=f"{run_id}_avg",
        numel=int(numel),
        target_group_size=int(group_size),
        matchmaking_time_s=float(matchmaking_s),
        request_timeout_s=0.5,
        next_chunk_timeout_s=next_chunk_s,
        allreduce_timeout_s=10.0,
    )
    try:
        peer.start()
        _say(
            {
                "pid": os.getpid(),
                "dht_pid": node.dht.pid,
                "averager_pid": peer._averager.pid,  # type: ignore[union-attr]
                "bootstrap": node.bootstrap_addresses(),
            }
        )
        asyncio.run(_serve(peer))
    finally:
        peer.shutdown()
        node.shutdown()


if __name__ == "__main__":
    main()
