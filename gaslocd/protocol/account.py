"""Where a peer's time goes, in categories that add up to the wall-clock.

An operator pays for accelerator time; the question is what share of it trains. So a
round's wall-clock is split into a bounded set of activities, the same in the daemon
(measured), the simulator (modelled) and the benchmarks, and "idle" means every second
that is not training — not only the wait for a partner's bytes.

- ``train``: the planned inner steps; ``fill``: extra steps while partners get ready.
- ``wait_ready``: waiting for partners to start exchanging (late, or dead until the
  deadline).
- ``transfer``: moving one's own bytes at one's own link speed; ``slow_link``: the rest
  of the exchange, spent at a partner's slower link.
- ``roster``: reading the roster, pacing, catching up, resynchronising, and the pause
  that makes a partnerless round last T.
- ``eval``, ``checkpoint``; ``other``: what remains (the outer step, bookkeeping).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ACTIVITIES = (
    "train",
    "fill",
    "wait_ready",
    "transfer",
    "slow_link",
    "roster",
    "eval",
    "checkpoint",
    "other",
)
TRAINING = ("train", "fill")


def split_exchange(
    wait_s: float, receive_s: float, nbytes: int, own_rate: float
) -> dict[str, float]:
    """One exchange's time as waiting, own transfer and a partner's slower link.

    ``receive_s`` is the time from the partner's first bytes to its last; at our own
    best measured rate ``own_rate`` (bytes/s) the bytes would have taken ``nbytes /
    own_rate``, and the rest was the partner's link (or the path between us).
    """
    own = min(receive_s, nbytes / own_rate) if own_rate > 0 else receive_s
    return {"wait_ready": max(0.0, wait_s), "transfer": own, "slow_link": receive_s - own}


@dataclass
class TimeAccount:
    """Seconds per activity, for one round or accumulated over many."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ACTIVITIES, 0.0))

    def add(self, activity: str, seconds: float) -> None:
        if activity not in self.seconds:
            raise ValueError(f"unknown activity {activity!r} (known: {', '.join(ACTIVITIES)})")
        self.seconds[activity] += max(0.0, seconds)

    def add_all(self, parts: Mapping[str, float]) -> None:
        for activity, seconds in parts.items():
            self.add(activity, seconds)

    def close(self, wall_s: float) -> None:
        """Book what the categories do not explain as ``other``, so they sum to ``wall_s``.

        Measured parts can overlap by a few microseconds of clock reads; any excess is
        taken from ``other`` first, never making a category negative.
        """
        gap = wall_s - self.total()
        self.seconds["other"] = max(0.0, self.seconds["other"] + gap)

    def merge(self, other: TimeAccount) -> None:
        for activity, seconds in other.seconds.items():
            self.seconds[activity] += seconds

    def total(self) -> float:
        return sum(self.seconds.values())

    def training_s(self) -> float:
        return sum(self.seconds[a] for a in TRAINING)

    def training_share(self) -> float:
        total = self.total()
        return self.training_s() / total if total > 0 else 0.0

    def idle_s(self) -> float:
        """Wall-clock not spent training (the figure the ``idle`` metrics report)."""
        return self.total() - self.training_s()
