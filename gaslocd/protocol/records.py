"""A peer's record in the run's roster: what every peer reads to plan a round.

Hivemind-free on purpose: the simulator builds the same records for its workers that
daemons publish in the DHT (``gaslocd.net.discovery``), so both plan from one type.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

WIRE_VERSION = 1
_MAX_STR = 256  # generous for an address or a digest, small enough that garbage stays cheap
_MAX_INT = 2**62
# Added after v1 was in use: a record without them is read with their defaults.
_OPTIONAL = ("started_at", "active_from", "free_from", "reachable", "sit_every", "sit_from")

# Plausibility bounds for records read from a network (check_plausible). Generous: an
# honest record must never fail them, an absurd one (round 2**60) must.
EPOCH = 1_600_000_000.0  # 2020-09-13 UTC: no gaslocd run started before
MIN_ROUND_S = 0.01  # no round (local steps + an exchange) is faster; loopback does ~0.2 s
MAX_CLOCK_SKEW_S = 300.0
MAX_INNER_STEPS = 1_000_000
MAX_SIT_EVERY = 1024  # rounds between a slow peer's pairings (the protocol caps k far lower)
MAX_STEP_TIME_S = 3600.0  # one inner step
MAX_BANDWIDTH_BYTES_PER_S = 1e12  # 8 Tbit/s
_HOST_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


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
    # A peer whose link cannot carry a model in a round sits out of the pairings until
    # this round while its long exchange runs, and from it is paired every ``sit_every``
    # rounds (gaslocd.protocol.sitout: the schedule every peer reads alike).
    free_from: int = 0
    # False: behind a NAT or firewall that takes no inbound calls. It dials its partners
    # (gaslocd.algorithm.topology.dialer) and is never paired with another such peer.
    reachable: bool = True
    sit_every: int = 0  # 0 or 1: paired every round from free_from
    sit_from: int = 0  # the round after the one that decided the schedule (sitout.py)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                ok, want = type(value) is bool, "a bool"
            elif f.type == "str":
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

    def check_plausible(self, now: float) -> None:
        """``ValueError`` unless an honest daemon could have published this at ``now``.

        Kept out of ``__post_init__`` because it needs a wall clock (the simulator's
        records live in simulated time). Rounds cannot be bounded by ``started_at``: a
        newcomer started a second ago already holds the network's round. So the bound
        is what any run could have reached since :data:`EPOCH` at one round per
        :data:`MIN_ROUND_S` (about 2**34 in 2026); it only grows, so a round that was
        plausible once stays so. Everything else here is a unit-sane range.
        """
        horizon = now + MAX_CLOCK_SKEW_S
        max_round = int((horizon - EPOCH) / MIN_ROUND_S)
        _check(
            EPOCH <= self.started_at <= horizon,
            f"started_at {self.started_at!r} is before {EPOCH:.0f} or in the future",
        )
        _check(self.round <= max_round, f"round {self.round} is beyond any run (> {max_round})")
        _check(self.active_from <= max_round, f"active_from {self.active_from} is beyond any run")
        _check(self.free_from <= max_round, f"free_from {self.free_from} is beyond any run")
        _check(self.sit_from <= max_round, f"sit_from {self.sit_from} is beyond any run")
        _check(self.sit_every <= MAX_SIT_EVERY, f"sit_every {self.sit_every} is absurd")
        _check(self.inner_steps <= MAX_INNER_STEPS, f"inner_steps {self.inner_steps} is absurd")
        _check(self.step_time_s <= MAX_STEP_TIME_S, f"step time {self.step_time_s} s is absurd")
        _check(
            self.bandwidth_bytes_per_s <= MAX_BANDWIDTH_BYTES_PER_S,
            f"bandwidth {self.bandwidth_bytes_per_s} B/s is absurd",
        )
        host = self.address.rpartition(":")[0]
        if host.startswith("[") and host.endswith("]"):
            try:
                ok = ipaddress.ip_address(host[1:-1]).version == 6
            except ValueError:
                ok = False
        else:
            ok = _HOST_RE.fullmatch(host) is not None
        _check(ok, f"address host {host!r} is not a host name, IPv4 or [IPv6] address")

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
