"""PNG plots: validation loss against rounds and simulated wall-clock, consensus against rounds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt

from .analysis import Run, Timed

Series = tuple[str, Sequence[tuple[float, float]]]


_PALETTE = [f"C{k}" for k in range(10)]  # matplotlib's default cycle
_colors: dict[str, object] = {}


def style(label: str) -> dict[str, object]:
    """One colour per base method across every plot; the line style marks the variant
    (solid: fixed H, dashed: adaptive H)."""
    base = label.split(" +")[0].split(" (")[0]
    color = _colors.setdefault(base, _PALETTE[len(_colors) % len(_PALETTE)])
    dash = "--" if "adapt" in label else "-"
    return {"color": color, "linestyle": dash}


def _panel(
    ax: plt.Axes, series: Sequence[Series], xlabel: str, ylabel: str, *, log: bool = False
) -> None:
    for label, points in series:
        if points:
            xs, ys = zip(*points, strict=True)
            marker = "." if len(points) < 30 else None
            ax.plot(xs, ys, label=label, marker=marker, **style(label))  # type: ignore[arg-type]
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def _loss_points(run: Run, skip_initial: bool) -> list[tuple[float, float]]:
    curve = run.val_curve[1:] if skip_initial else run.val_curve
    return [(r, v) for r, _, v in curve]


def loss_and_consensus(runs: Sequence[Run], title: str, path: Path) -> None:
    """Three panels for one comparison: loss vs rounds, loss vs wall-clock, consensus vs rounds."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    labels = [r.spec.method for r in runs]
    _panel(
        axes[0],
        [(lab, _loss_points(r, True)) for lab, r in zip(labels, runs, strict=True)],
        "outer round",
        "validation loss",
    )
    _panel(
        axes[1],
        [
            (lab, [(t, v) for _, t, v in r.val_curve[1:]])
            for lab, r in zip(labels, runs, strict=True)
        ],
        "simulated wall-clock (s)",
        "validation loss",
    )
    consensus = [
        (lab, [(x, c) for x, c in r.consensus_curve if c > 1e-6])
        for lab, r in zip(labels, runs, strict=True)
    ]
    _panel(axes[2], consensus, "outer round", "consensus error (rel. RMS)", log=True)
    axes[2].set_title("identical replicas (DiLoCo, < 1e-6) draw no line", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def loss_vs_time(
    panels: Sequence[tuple[str, Sequence[tuple[str, Timed]]]], target: float | None, path: Path
) -> None:
    """One panel per network: validation loss against simulated wall-clock."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels, strict=True):
        _panel(
            ax,
            [(lab, [(t, v) for _, t, v in c.curve[1:]]) for lab, c in curves],
            "simulated wall-clock (s)",
            "validation loss",
        )
        if target is not None:
            ax.axhline(
                target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.2f}"
            )
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
