"""One line per claim of the paper, with the numbers, and a verdict by a stated rule.

The rules are deliberately simple and printed with the verdicts, so a reader can disagree
with a threshold without re-deriving a number: "beats" means lower by more than the
seed spread (half-range) of both; "comparable" means within ``TOLERANCE`` nats.
"""

from __future__ import annotations

from typing import Any

from .analysis import Stat
from .grid import Mode

TOLERANCE = 0.02  # nats of validation loss: ~1% of the losses reached here


def _beats(a: Stat, b: Stat) -> bool:
    return a.mean < b.mean - max(a.half_range, b.half_range)


def _fmt(s: Stat | None) -> str:
    return "—" if s is None else s.fmt()


def claim1(h1: dict[str, Stat]) -> str:
    g1, g2 = h1.get("GASLoC-1peer"), h1.get("GASLoC-2peer")
    d1, d2 = h1.get("DAdam-1peer"), h1.get("DAdam-2peer")
    ring, full = h1.get("DAdam-ring"), h1.get("DAdam-complete")
    if None in (g1, g2, d1, d2, ring, full):
        return "(1) H=1: incomplete (runs missing)."
    assert g1 and g2 and d1 and d2 and ring and full
    beats_dadam = _beats(g1, d1) and _beats(g2, d2)
    best_g = min(g1.mean, g2.mean)
    matches = best_g <= min(ring.mean, full.mean) + TOLERANCE
    verdict = (
        "held" if beats_dadam and matches else "did not hold" if not beats_dadam else "held in part"
    )
    return (
        f"(1) H=1, {verdict}: GASLoC-1peer {_fmt(g1)} vs DAdam-1peer {_fmt(d1)}; "
        f"GASLoC-2peer {_fmt(g2)} vs DAdam-2peer {_fmt(d2)}; DAdam on a ring {_fmt(ring)}, "
        f"complete {_fmt(full)} (rule: beats DAdam on the same topology by more than the "
        f"seed spread, and the better GASLoC within {TOLERANCE} of ring/complete or below)."
    )


def claim2(mode: Mode, main: dict[Any, Stat]) -> str:
    parts, comparable, local_worse = [], [], []
    for n in mode.workers:
        di = main.get(("DiLoCo", n))
        gs = [main.get((m, n)) for m in ("GASLoC-1peer", "GASLoC-2peer")]
        ld = main.get(("Local-DAdam-2peer", n))
        if di is None or None in gs or ld is None:
            continue
        best = min((g for g in gs if g is not None), key=lambda s: s.mean)
        gap = best.mean - di.mean
        comparable.append(gap <= TOLERANCE)
        local_worse.append(ld.mean - di.mean > TOLERANCE)
        parts.append(
            f"n={n}: DiLoCo {di.mean:.3f}, best GASLoC {best.mean:.3f} ({gap:+.3f}), "
            f"Local-DAdam-2peer {ld.mean:.3f} ({ld.mean - di.mean:+.3f})"
        )
    if not parts:
        return "(2) H>1: incomplete (runs missing)."
    verdict = (
        "held"
        if all(comparable) and all(local_worse)
        else "did not hold"
        if not any(comparable)
        else "held in part"
    )
    return (
        f"(2) H={mode.h_main}, {verdict}: " + "; ".join(parts) + f" (rule: best GASLoC within "
        f"{TOLERANCE} of DiLoCo, and Local-DAdam more than {TOLERANCE} worse than DiLoCo)."
    )


MUCH_SOONER = 1.5  # "reaches a given loss much sooner": at least this speed-up over DiLoCo


def claim3(mode: Mode, numbers: dict[Any, Any]) -> str:
    parts, speeds = [], []
    for f in mode.straggler_fractions:
        di = numbers.get(("DiLoCo", f), {})
        ad = numbers.get(("GASLoC-1peer +adapt-H", f), {})
        fx = numbers.get(("GASLoC-1peer", f), {})
        if not di.get("time") or not ad.get("time"):
            parts.append(f"{f:.0%}: a method did not reach the target")
            speeds.append(0.0)
            continue
        speed = di["time"].mean / ad["time"].mean
        speeds.append(speed)
        fixed = (
            f", fixed-H GASLoC-1peer {di['time'].mean / fx['time'].mean:.2f}×"
            if fx.get("time")
            else ""
        )
        parts.append(
            f"{f:.0%}: adaptive-H GASLoC-1peer reaches {numbers['target']:.2f} "
            f"{speed:.2f}× sooner than DiLoCo{fixed}; idle {100 * ad['idle'].mean:.1f}% "
            f"vs DiLoCo {100 * di['idle'].mean:.1f}%"
        )
    verdict = (
        "held"
        if speeds and min(speeds) >= MUCH_SOONER
        else "held in part"
        if speeds and max(speeds) > 1
        else "did not hold"
    )
    return (
        f"(3) stragglers, {verdict}: "
        + "; ".join(parts)
        + f" (rule: at least {MUCH_SOONER}× sooner than DiLoCo at every bandwidth)."
    )


def claim4(outer: dict[str, tuple[float, float]], h: dict[Any, float], mode: Mode) -> str:
    parts, ranges = [], {}
    for method, (lo, hi) in outer.items():
        ranges[method] = hi - lo
        parts.append(f"{method} η×μ range {hi - lo:.3f} (best {lo:.3f})")
    h_ranges = {}
    for method in ("GASLoC-1peer", "DiLoCo"):
        values = [h[(method, x)] for x in mode.h_sweep if (method, x) in h]
        if values:
            h_ranges[method] = max(values) - min(values)
            parts.append(
                f"{method} over H∈{{{', '.join(map(str, mode.h_sweep))}}}: "
                + ", ".join(f"{v:.3f}" for v in values)
            )
    pairs = [(ranges, "η×μ"), (h_ranges, "H")]
    if all(len(r) == 2 for r, _ in pairs):
        ok = [r["GASLoC-1peer"] <= r["DiLoCo"] + TOLERANCE for r, _ in pairs]
        verdict = "held" if all(ok) else "did not hold" if not any(ok) else "held in part"
    else:
        verdict = "incomplete"
    return (
        f"(4) sensitivity, {verdict}: "
        + "; ".join(parts)
        + f" (rule: GASLoC's range over each grid at most DiLoCo's + {TOLERANCE})."
    )
