"""What the parts of a running daemon share, built once by the lifecycle.

The lifecycle (:mod:`gaslocd.daemon.lifecycle`) starts things and stops them; membership,
the round driver and the mixers only use them. Passing one small object keeps each part
honest about what it touches, without each constructor taking ten arguments.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gaslocd.config import AlgoConfig, DaemonConfig, TrainConfig, WireConfig
from gaslocd.daemon.telemetry import Telemetry
from gaslocd.daemon.worker import TrainingThread
from gaslocd.net.auth import CallAuth
from gaslocd.net.discovery import Discovery
from gaslocd.net.roster_auth import peer_id_of_owner
from gaslocd.net.server import ExchangeServer
from gaslocd.protocol.plan import LinkEstimates
from gaslocd.protocol.policy import RoundPolicy
from gaslocd.protocol.sitout import SitOut
from gaslocd.train.worker import Worker

_T = TypeVar("_T")


def call_auth(run_id: str, token: str, discovery: Discovery) -> CallAuth:
    """The wire's credentials: our DHT key signs our calls, the roster's verified keys
    (or a newcomer's own key, if it is its peer id) check others' (docs/design.md §3)."""
    return CallAuth(
        run_id,
        token,
        discovery.peer_id,
        discovery.private_key,
        discovery.public_key_of,
        peer_id_of_key=peer_id_of_owner,
    )


def monotonic() -> float:
    """The daemon's ``now`` for the protocol's rules (the simulator passes its own)."""
    return time.monotonic()


@dataclass
class Runtime:
    cfg: DaemonConfig
    algo: AlgoConfig
    train: TrainConfig
    wire: WireConfig
    role: str
    me: str
    state: Worker  # θ, m, the inner trainer: touched only on ``thread``
    thread: TrainingThread
    server: ExchangeServer
    discovery: Discovery
    telemetry: Telemetry
    policy: RoundPolicy
    progress: Callable[[str], None]
    links: LinkEstimates = field(default_factory=LinkEstimates)
    message_bytes: int = 0
    address: str = ""
    active_from: int = 0
    sit: SitOut = field(
        default_factory=SitOut
    )  # our sit-out schedule (a slow link: gaslocd.protocol.sitout)
    reachable: bool = True  # others can dial our gRPC port (daemon/reach.py decides)
    dht_serving: bool = True  # our DHT node serves others (not behind NAT)
    stopping: bool = False
    clock: Callable[[], float] = monotonic
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        """Run ``coro`` in the background; the lifecycle cancels what is left at exit."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task
