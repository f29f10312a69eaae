"""A codec per link: the most faithful codec whose message crosses the link within budget.

A round waits for its slowest exchange. When one link cannot carry the configured codec's
message within the round's budget, the choice is between stalling everyone on that link,
dropping the partner, or sending it a smaller message. This module makes that choice, per
link and round, from numbers the caller measured (the link's rate and latency) and the
budget it allows: walk the *ladder* from the configured codec down to the strongest
compression and take the first codec that fits. When none fits, the strongest is named
with ``fits=False`` and the caller sits that peer out rather than wait for it.

Fidelity order (and size order): fp32 (4 bytes per value) → fp16 / bf16 (2) → int8
(≈ 1) → q4 (≈ 0.56). fp16 and bf16 are one rung: the same size, so stepping from one to
the other never makes a message fit; fp16 is preferred below fp32 (more mantissa bits for
weights, whose range fp16 covers).

Pure: no clock, no I/O, no torch, no grpc. The protocol layer may not import the wire
(``gaslocd.net``, a lower layer), so the encoded sizes are restated here;
``tests/protocol/test_linkcodec.py`` checks them against the codecs themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Rungs of the ladder, most faithful first; members of one rung have the same size.
RUNGS: tuple[tuple[str, ...], ...] = (("fp32",), ("fp16", "bf16"), ("int8",), ("q4",))
FIDELITY: tuple[str, ...] = tuple(name for rung in RUNGS for name in rung)

_INT8_BLOCK, _Q4_BLOCK, _SCALE_BYTES = 1024, 64, 4  # as gaslocd.net.codecs / .q4


def _rung(name: str) -> int:
    for k, rung in enumerate(RUNGS):
        if name in rung:
            return k
    raise ValueError(f"unknown codec {name!r}; known: {', '.join(FIDELITY)}")


def message_bytes(codec: str, numel: int) -> int:
    """Exact encoded size of ``numel`` values in ``codec`` (what goes on the wire)."""
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    rung = _rung(codec)
    if rung == 0:
        return 4 * numel
    if rung == 1:
        return 2 * numel
    if codec == "int8":
        return numel + _SCALE_BYTES * -(-numel // _INT8_BLOCK)
    full, rem = divmod(numel, _Q4_BLOCK)
    tail = _SCALE_BYTES + (rem + 1) // 2 if rem else 0
    return full * (_SCALE_BYTES + _Q4_BLOCK // 2) + tail


def codec_ladder(best: str, allowed: Sequence[str]) -> tuple[str, ...]:
    """The codecs to try, from ``best`` down to the strongest compression.

    One codec per rung below ``best`` (fp16 before bf16 when both are allowed), and only
    codecs in ``allowed`` (what the run accepts; ``best`` too is dropped when it is not
    allowed). ``ValueError`` for an unknown name or when nothing is left.
    """
    for name in (best, *allowed):
        _rung(name)
    ok = set(allowed)
    top = _rung(best)
    ladder = [best] if best in ok else []
    for rung in RUNGS[top + 1 :]:
        ladder += [name for name in rung if name in ok][:1]
    if not ladder:
        raise ValueError(f"no codec from {best!r} down is allowed (allowed: {list(allowed)})")
    return tuple(ladder)


def transfer_s(codec: str, numel: int, rate_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Seconds to move one ``codec`` message of ``numel`` values over a link.

    ``latency_s`` is the link's fixed cost per message (round trip, stream set-up);
    ``rate_bytes_per_s`` its measured throughput, > 0 (inf: only the latency counts).
    """
    if not rate_bytes_per_s > 0:  # also refuses NaN
        raise ValueError(f"rate must be a number > 0, got {rate_bytes_per_s!r}")
    if not (math.isfinite(latency_s) and latency_s >= 0):
        raise ValueError(f"latency must be a finite number >= 0, got {latency_s!r}")
    return latency_s + message_bytes(codec, numel) / rate_bytes_per_s


@dataclass(frozen=True)
class LinkChoice:
    """The codec for one link and round.

    ``transfer_s`` is the expected transfer time of its message, None while the link has
    no measured rate. ``fits`` is False when even the strongest codec misses the budget:
    the caller then sits the peer out this round instead of waiting for it.
    """

    codec: str
    transfer_s: float | None
    fits: bool


def choose_codec(
    ladder: Sequence[str],
    numel: int,
    rate_bytes_per_s: float | None,
    budget_s: float,
    latency_s: float = 0.0,
) -> LinkChoice:
    """The most faithful codec of ``ladder`` whose transfer fits within ``budget_s``.

    ``ladder`` runs from the most faithful codec to the smallest (:func:`codec_ladder`).

    An unknown rate (None, ≤ 0 or NaN: nothing measured yet) gives the ladder's best
    codec: the first exchange measures the link, and guessing a compression without a
    measurement would throw fidelity away on links that are fine. A budget of 0 or less
    (no time left) fits no non-empty message.
    """
    if not ladder:
        raise ValueError("the ladder is empty: at least one codec is needed")
    rungs = [_rung(name) for name in ladder]
    if rungs != sorted(rungs):
        raise ValueError(f"the ladder must run from most faithful to smallest, got {ladder}")
    if math.isnan(budget_s):
        raise ValueError("budget_s must be a number, got NaN")
    if rate_bytes_per_s is None or not rate_bytes_per_s > 0:
        return LinkChoice(ladder[0], None, True)
    seconds = 0.0
    for name in ladder:
        seconds = transfer_s(name, numel, rate_bytes_per_s, latency_s)
        if seconds <= budget_s:
            return LinkChoice(name, seconds, True)
    return LinkChoice(ladder[-1], seconds, False)
