"""One line per claim of the paper, with the numbers, and a verdict by a stated rule.

The rules are deliberately simple and printed with the verdicts, so a reader can disagree
with a threshold without re-deriving a number: "beats" means lower by more than the
seed spread (half-range) of both; "comparable" means within ``TOLERANCE`` nats.
"""

from __future__ import annotations

from typing import Any

from .analysis import Stat, stat
from .grid import Mode

TOLERANCE = 0.02  # nats of validation loss: ~1% of the losses reached here


def _fmt(s: Stat | None) -> str:
    return "—" if s is None else s.fmt()


def _always_below(deltas: list[float]) -> bool:
    return bool(deltas) and all(d < 0 for d in deltas)


def claim1(h1: dict[Any, Any]) -> str:
    names = ("GASLoC-1peer", "GASLoC-2peer", "DAdam-1peer", "DAdam-2peer", "DAdam-ring")
    if any(n not in h1 for n in (*names, "DAdam-complete")):
        return "(1) H=1: incomplete (runs missing)."
    g1, g2 = h1[("GASLoC-1peer", "vs same topology")], h1[("GASLoC-2peer", "vs same topology")]
    beats_dadam = _always_below(g1) and _always_below(g2)
    best = min(h1["GASLoC-1peer"].mean, h1["GASLoC-2peer"].mean)
    matches = best <= min(h1["DAdam-ring"].mean, h1["DAdam-complete"].mean) + TOLERANCE
    verdict = (
        "held"
        if beats_dadam and matches
        else "held in part"
        if beats_dadam or matches
        else "did not hold"
    )
    return (
        f"(1) H=1, {verdict}: final val loss GASLoC-1peer {_fmt(h1['GASLoC-1peer'])} vs "
        f"DAdam-1peer {_fmt(h1['DAdam-1peer'])} (paired Δ {stat(g1).mean:+.3f}); GASLoC-2peer "
        f"{_fmt(h1['GASLoC-2peer'])} vs DAdam-2peer {_fmt(h1['DAdam-2peer'])} (paired Δ "
        f"{stat(g2).mean:+.3f}); DAdam on a ring {_fmt(h1['DAdam-ring'])}, complete "
        f"{_fmt(h1['DAdam-complete'])} (rule: below DAdam on the same topology on every seed, "
        f"and the better GASLoC within {TOLERANCE} of ring/complete or below)."
    )


def claim2(mode: Mode, main: dict[Any, Any]) -> str:
    parts, comparable, local_worse = [], [], []
    for n in mode.workers:
        di = main.get(("DiLoCo", n))
        deltas = {
            m: main.get((m, n, "delta"))
            for m in ("GASLoC-1peer", "GASLoC-2peer", "Local-DAdam-2peer")
        }
        if di is None or any(not d for d in deltas.values()):
            continue
        gap = {m: stat(d).mean for m, d in deltas.items() if d}
        best = min(("GASLoC-1peer", "GASLoC-2peer"), key=lambda m: gap[m])
        comparable.append(gap[best] <= TOLERANCE)
        local_worse.append(gap["Local-DAdam-2peer"] > TOLERANCE)
        parts.append(
            f"n={n}: DiLoCo {di.mean:.3f}, {best} {gap[best]:+.3f}, "
            f"Local-DAdam-2peer {gap['Local-DAdam-2peer']:+.3f}"
        )
    if not parts:
        return "(2) H>1: incomplete (runs missing)."
    verdict = (
        "held"
        if all(comparable) and all(local_worse)
        else "did not hold"
        if not any(comparable) and not any(local_worse)
        else "held in part"
    )
    return (
        f"(2) H={mode.h_main}, {verdict}: "
        + "; ".join(parts)
        + f" (paired differences to DiLoCo; rule: the better GASLoC within {TOLERANCE} of "
        f"DiLoCo or below, and Local-DAdam more than {TOLERANCE} above it)."
    )


MUCH_SOONER = 1.5  # "reaches a given loss much sooner": at least this speed-up over DiLoCo


def claim3(mode: Mode, numbers: dict[Any, Any]) -> str:
    parts, speeds = [], []
    for f in mode.straggler_fractions:
        di = numbers.get(("DiLoCo", f), {})
        ad = numbers.get(("GASLoC-1peer +adapt-H", f), {})
        fx = numbers.get(("GASLoC-1peer", f), {})
        if not ad.get("speed"):
            parts.append(f"{f:.0%}: adaptive-H GASLoC did not reach target A")
            speeds.append(0.0)
            continue
        speeds.append(ad["speed"].mean)
        extra = []
        if fx.get("speed"):
            extra.append(f"fixed-H GASLoC-1peer {fx['speed'].mean:.2f}×")
        strict = ad.get("speed_strict")
        longer = numbers.get((f"GASLoC-1peer +adapt-H ({mode.long_scale}× rounds)", f), {})
        if strict is None and longer.get("speed_strict"):
            b = f"with {mode.long_scale}× rounds {longer['speed_strict'].mean:.2f}×, seed 0"
        else:
            b = "not reached" if strict is None else f"{strict.mean:.2f}×"
        parts.append(
            f"{f:.0%}: adaptive-H GASLoC-1peer reaches target A {ad['speed'].mean:.2f}× sooner "
            f"than DiLoCo (DiLoCo's final loss, target B: {b})"
            f"{'; ' + ', '.join(extra) if extra else ''}; idle {100 * ad['idle'].mean:.1f}% vs "
            f"DiLoCo {100 * di.get('idle', stat([float('nan')])).mean:.1f}%"
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
