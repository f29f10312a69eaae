"""Peer records for the protocol's unit tests: only what a test varies is an argument."""

from __future__ import annotations

from gaslocd.protocol.records import PeerRecord


def record(
    peer_id: str,
    round_: int = 0,
    *,
    step: float = 0.1,
    bandwidth: float = 1e6,
    active_from: int = 0,
    free_from: int = 0,
    sit_every: int = 0,
) -> PeerRecord:
    return PeerRecord(
        peer_id=peer_id,
        address=f"{peer_id}:1",
        fingerprint="fp",
        round=round_,
        inner_steps=10,
        step_time_s=step,
        bandwidth_bytes_per_s=bandwidth,
        version="0",
        active_from=active_from,
        free_from=free_from,
        sit_every=sit_every,
    )
