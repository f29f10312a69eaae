"""Choosing H_i,t so that a slow link or a slow GPU never makes anyone wait (docs/design.md §1).

The pairing for round t is known at its start, so a worker knows which links it will
use and can trade compute for communication: it picks H so that compute plus this
round's expected transfer matches the network's target round time T::

    T      = H_base · median(step times) + median(transfer times)
    H_i,t  = clamp(round((T − transfer_i,t) / s_i), H_min, H_max)

A slow GPU (large s_i) takes fewer steps; a worker paired with a slow link this round
takes fewer steps; everyone arrives at the exchange at about the same time. Every input
is a measurement passed in: this module reads no clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def _finite_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def target_round_time(
    h_base: int, step_times_s: Sequence[float], transfer_times_s: Sequence[float]
) -> float:
    """T: what a typical worker spends on H_base steps plus one typical exchange.

    Medians, not means, so that one straggler does not drag the whole network's target
    (the point is that the straggler adapts, not everyone else).
    """
    if h_base < 1:
        raise ValueError(f"H_base must be >= 1, got {h_base}")
    if not step_times_s:
        raise ValueError("target round time needs at least one step time")
    for s in step_times_s:
        _finite_positive("step time", s)
    for x in transfer_times_s:
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"transfer time must be finite and >= 0, got {x!r}")
    transfer = statistics.median(transfer_times_s) if transfer_times_s else 0.0
    return h_base * statistics.median(step_times_s) + transfer


def choose_inner_steps(
    target_round_s: float, transfer_s: float, step_time_s: float, h_min: int, h_max: int
) -> int:
    """H for this round: fill the target round time with compute, clamped to [h_min, h_max]."""
    _finite_positive("step time", step_time_s)
    if not math.isfinite(target_round_s) or not math.isfinite(transfer_s):
        raise ValueError("target round time and transfer time must be finite")
    if not 1 <= h_min <= h_max:
        raise ValueError(f"need 1 <= h_min <= h_max, got {h_min}, {h_max}")
    budget = (target_round_s - transfer_s) / step_time_s
    return max(h_min, min(h_max, round(budget)))
