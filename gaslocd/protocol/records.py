"""A peer's record in the run's roster: what every peer reads to plan a round.

Hivemind-free on purpose: the simulator builds the same records for its workers that
daemons publish in the DHT (``gaslocd.net.discovery``), so both plan from one type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

WIRE_VERSION = 1
_MAX_STR = 256  # generous for an address or a digest, small enough that garbage stays cheap
_MAX_INT = 2**62
_OPTIONAL = ("started_at", "active_from")  # fields added after version 1 was first used


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class PeerRecord:
    """What one daemon tells the run about itself (docs/design.md §3); validated on construction."""

    peer_id: str  # base58 libp2p peer id of the daemon's DHT node, stable for its life
    address: str  # gRPC "host:port" that others dial (the announced one, if any)
    fingerprint: str  # digest of model architecture, parameter shapes and dtype
    round: int
    inner_steps: int  # H this daemon used in its last round
    step_time_s: float  # measured inner step time
    bandwidth_bytes_per_s: float  # measured link bandwidth (0 = not measured yet)
    version: str  # gaslocd software version
    started_at: float = 0.0  # unix time the daemon started (tie-breaks, uptime display)
    # First round this peer takes part in: a newcomer announces itself a few rounds ahead
    # so that every peer counts it from the same round and computes the same pairing.
    active_from: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str":
                ok = isinstance(value, str) and 0 < len(value) <= _MAX_STR and value.isprintable()
                want = f"a printable string of 1..{_MAX_STR} characters"
            elif f.type == "int":
                low = 1 if f.name == "inner_steps" else 0
                ok = type(value) is int and low <= value < _MAX_INT
                want = f"an int >= {low}"
            else:
                ok = type(value) is float and math.isfinite(value) and value >= 0.0
                want = "a finite float >= 0"
            _check(ok, f"{f.name} must be {want}, got {value!r}")
        host, _, port = self.address.rpartition(":")
        _check(
            bool(host) and port.isdigit() and 0 < int(port) < 65536,
            f"address must be 'host:port' with a port in 1..65535, got {self.address!r}",
        )

    def to_wire(self) -> dict[str, Any]:
        """A msgpack-friendly dict of plain types, tagged with the wire version."""
        return {"v": WIRE_VERSION, **asdict(self)}

    @classmethod
    def from_wire(cls, obj: object) -> PeerRecord:
        """Parse what a peer stored; raise ``ValueError`` on anything malformed.

        Unknown keys are ignored so that a newer daemon may add fields without making older
        ones drop its record; a different ``v`` means an incompatible format.
        """
        if not isinstance(obj, Mapping):
            raise ValueError(f"record must be a dict, got {type(obj).__name__}")
        _check(obj.get("v") == WIRE_VERSION, f"unsupported record version {obj.get('v')!r}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in obj:
                _check(f.name in _OPTIONAL, f"record lacks {f.name!r}")
                continue
            value = obj[f.name]
            # msgpack may return a whole-number float as an int; accept it, never a bool.
            if f.type == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            values[f.name] = value
        return cls(**values)
