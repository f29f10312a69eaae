"""Robust mixing: bound how far one partner's θ̃ can move a worker (docs/design.md §1).

The wire refuses a θ̃_j farther than the norm bound (‖θ̃_j − θ̃_i‖ > 1.0 · ‖θ̃_i‖), but
that bound is a sanity check, not a defence: an insider holding the join token can send
θ̃ at 0.9 of it every round, and W_ij = 1/2 then moves the receiver by 0.45 ‖θ̃_i‖ per
round, which wrecks the model within a few rounds. Honest partners are never that far:
their distance is a few local updates plus the consensus gap.

So each partner's contribution is *centered-clipped* to a trust radius τ before mixing::

    θ̃_j ← θ̃_i + clip(θ̃_j − θ̃_i, τ)          clip(d, τ) = d · min(1, τ / ‖d‖)

W is not touched (it stays doubly stochastic); only what is mixed changes, so an
attacker's pull on worker i is at most W_ij · τ per round, however far it sends. An
honest partner inside τ is mixed exactly as before. What clipping altered does not go
through the outer step: it moves θ once, beside it (:func:`split_mix`), so the outer
momentum cannot multiply a pull that an insider repeats every round.

**τ comes from what partners looked like recently.** ``factor`` × the median of the last
``window`` distances, a clipped one entering *capped at τ*. An attacker far away then
adds entries at τ, the top of the history: as a minority of one's recent partners (a
fraction f < 1/2) it moves the median only to the honest distances' 1/(2(1 − f))
quantile, however far it is; only as the majority of them, which no robust rule
survives, can it raise τ, by at most ``factor`` per ⌈window/2⌉ of its distances. The
cap is what keeps honest peers that legitimately drifted apart from being clipped for
good: when a few rounds of random 1-peer pairings happen to keep the same pairs (a
streak of 6 in a 4-peer run, bench/results/network_stragglers.md, 1× T), the two pairs
drift apart, their first cross distances are several τ of the within-pair history, and
a history of accepted distances alone would then never admit them again (every later
distance clipped, the clipped pull too weak to close the gap: the run stopped mixing).
Two more guards:

- **warm-up**: before ``warmup`` distances were accepted, τ = ``warmup_factor`` × ‖Δ_i‖,
  with Δ_i = θ_i − θ̃_i this worker's own pseudo-gradient of the round. In the first
  rounds replicas differ by their local updates only, so a few times one's own update is
  the natural scale, and it needs no history;
- **floor**: τ is never below ``floor`` × ‖Δ_i‖, so a run whose replicas legitimately
  drift apart (a longer H, a healed partition) still mixes at least a local update's
  worth per partner per round, and the distances shrink back under τ.

Everything is arithmetic on tensors the caller owns; the distances are computed in
slices so that a 551M-parameter model needs no model-sized temporary, and a clipped θ̃
costs one new tensor (``torch.lerp``), only for the partners that were clipped.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gaslocd.algorithm.outer import mix, pairwise_consensus

SLICE = 1 << 22  # elements per slice of a distance computation (16 MiB of float32)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class TrustConfig:
    """How the trust radius is set (the defaults were measured: bench/security_mixing.py)."""

    enabled: bool = True
    factor: float = 2.0  # τ = factor × median of the recent accepted distances
    window: int = 32  # accepted distances remembered
    warmup: int = 4  # accepted distances needed before the history sets τ
    warmup_factor: float = 4.0  # τ during warm-up, in units of one's own ‖Δ_i‖
    floor: float = 1.0  # τ is never below floor × ‖Δ_i‖
    radial_factor: float = 4.0  # ρ = radial_factor × median of recent accepted norm gaps

    def __post_init__(self) -> None:
        for name in ("factor", "warmup_factor", "floor", "radial_factor"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value > 0, f"{name} must be > 0, got {value!r}")
        _check(self.window >= 1, f"window must be >= 1, got {self.window}")
        _check(
            1 <= self.warmup <= self.window,
            f"warmup must be in 1..window ({self.window}), got {self.warmup}",
        )


@dataclass(frozen=True)
class ClipReport:
    """What robust mixing did to one round's partners."""

    radius: float  # τ of the round (inf: robust mixing is off)
    radial_radius: float  # ρ: the largest |‖θ̃_j‖ − ‖θ̃_i‖| mixed (inf: no limit yet)
    distances: dict[str, float]  # ‖θ̃_j − θ̃_i‖ per partner, before clipping
    clipped: tuple[str, ...]  # partners whose θ̃ was pulled in to τ, sorted
    # Partners within τ whose norm gap alone was cut to ρ: common between honest peers
    # (their norm gaps are heavy-tailed) and a light touch, so counted apart.
    rescaled: tuple[str, ...] = ()


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ over flat tensors, slice by slice (no model-sized temporary), in float64."""
    if a.numel() != b.numel():
        raise ValueError(f"distance between {a.numel()} and {b.numel()} values")
    a, b = a.reshape(-1), b.reshape(-1)
    total = 0.0
    for start in range(0, a.numel(), SLICE):
        d = a[start : start + SLICE] - b[start : start + SLICE]
        total += float(torch.linalg.vector_norm(d, dtype=torch.float64)) ** 2
    return math.sqrt(total)


class TrustRadius:
    """One worker's trust radii and the history of honest partners that sets them.

    Lives with the worker's other between-round state (the outer momentum) and is
    checkpointed with it: a restarted worker keeps its radius instead of warming up again
    (the warm-up's looser τ is a window an insider could time).
    """

    def __init__(self, cfg: TrustConfig | None = None) -> None:
        self.cfg = cfg or TrustConfig()
        self.accepted: deque[float] = deque(maxlen=self.cfg.window)  # distances
        self.radial: deque[float] = deque(maxlen=self.cfg.window)  # |‖θ̃_j‖ − ‖θ̃_i‖|
        self.clipped_total = 0  # partners pulled in to τ since start (a counter for reports)
        self.rescaled_total = 0  # partners whose norm gap alone was cut to ρ

    def state_dict(self) -> dict[str, list[float]]:
        return {"accepted": list(self.accepted), "radial": list(self.radial)}

    def load_state_dict(self, state: object) -> bool:
        """Take a checkpoint's history; False (and nothing changed) when it is not lists
        of finite distances ≥ 0, so a damaged entry costs the warm-up, not the run."""
        if not isinstance(state, dict):
            return False
        accepted, radial = state.get("accepted"), state.get("radial")
        for values in (accepted, radial):
            if not isinstance(values, list) or not all(
                isinstance(x, float) and math.isfinite(x) and x >= 0 for x in values
            ):
                return False
        assert isinstance(accepted, list) and isinstance(radial, list)
        self.accepted.clear()
        self.accepted.extend(accepted[-self.cfg.window :])
        self.radial.clear()
        self.radial.extend(radial[-self.cfg.window :])
        return True

    def radius(self, progress: float) -> float:
        """τ for a round whose own pseudo-gradient has norm ``progress`` (‖Δ_i‖)."""
        cfg = self.cfg
        if not cfg.enabled:
            return math.inf
        if len(self.accepted) < cfg.warmup:
            return cfg.warmup_factor * progress
        return max(cfg.factor * statistics.median(self.accepted), cfg.floor * progress)

    def radial_radius(self, own_norm_change: float) -> float:
        """ρ: the largest radial part a partner's difference may have (inf during
        warm-up), never below this round's own norm change |‖θ̃_i‖ − ‖θ_i‖|."""
        cfg = self.cfg
        if not cfg.enabled or len(self.radial) < cfg.warmup:
            return math.inf
        return max(cfg.radial_factor * statistics.median(self.radial), own_norm_change)

    def clip(
        self,
        own: torch.Tensor,
        received: Mapping[str, torch.Tensor],
        progress: float,
        own_norm_change: float = 0.0,
    ) -> tuple[dict[str, torch.Tensor], ClipReport]:
        """The partners' θ̃ as they enter the mix, and what was clipped.

        First centered clipping, d = θ̃_j − θ̃_i scaled to at most τ; then the norm:
        if the result's norm differs from ‖θ̃_i‖ by more than ρ, its radial part (along
        θ̃_i) is moved so that it differs by ρ, and the whole is pulled back within τ if
        that made it longer. The norm limit exists because honest replicas grow alike
        (their norms differ by a small fraction of their distance), while a scaled θ̃ is
        all radial: the cheapest damaging message, which the distance clip alone would
        let shrink a model by τ per round. Distances and radial parts of
        unclipped partners are remembered after the whole round, so the order of the
        partners does not matter.
        """
        radius, rho = self.radius(progress), self.radial_radius(own_norm_change)
        own_norm = norm_of(own)
        out: dict[str, torch.Tensor] = {}
        distances: dict[str, float] = {}
        radial: dict[str, float] = {}
        clipped: list[str] = []
        rescaled: list[str] = []
        for peer in sorted(received):
            theirs = received[peer]
            dist = distances[peer] = distance(own, theirs)
            d_r = (_dot(theirs, own) - own_norm**2) / own_norm if own_norm else 0.0
            d_t = math.sqrt(max(dist * dist - d_r * d_r, 0.0))
            radial[peer] = abs(norm_of(theirs) - own_norm)
            a = min(1.0, radius / dist) if dist > 0 else 1.0  # centered clipping
            c = _radial_part(own_norm, a * d_r, a * d_t, rho)
            total = math.hypot(a * d_t, c)
            if a < 1.0 or c != a * d_r or total > radius:
                theirs = torch.lerp(own, theirs, a).add_(own, alpha=(c - a * d_r) / own_norm)
                if total > radius:
                    theirs = torch.lerp(own, theirs, radius / total)
                (clipped if a < 1.0 or total > radius else rescaled).append(peer)
            out[peer] = theirs
        for p in distances:
            if p not in clipped and p not in rescaled:
                self.accepted.append(distances[p])
                self.radial.append(abs(radial[p]))
            else:  # capped at τ: honest drift cannot starve τ; far partners cannot inflate it
                self.accepted.append(min(distances[p], radius))
        self.clipped_total += len(clipped)
        self.rescaled_total += len(rescaled)
        return out, ClipReport(radius, rho, distances, tuple(clipped), tuple(rescaled))


def split_mix(
    weights: Mapping[str, float],
    own: torch.Tensor,
    used: Mapping[str, torch.Tensor],
    report: ClipReport,
    me: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The round's mix for the outer step, and the pull of the partners that robust mixing
    altered, to be added to θ outside it (None when no partner was altered).

    An altered partner enters the outer step as our own θ̃ (its weight does not move the
    outer gradient) and its clipped difference W_ij (θ̃'_j − θ̃_i) moves θ once, directly.
    Through the outer step it would move θ by η(1 + μ) = 1.33 times that in the round and
    η/(1 − μ) = 7 times in all as the momentum carries it on (η = 0.7, μ = 0.9): an
    insider that pulls the same way every round (a scaled θ̃ is all radial, always
    towards 0) would have its bounded pull multiplied by 7. Honest partners are rarely
    altered, and are then mixed without momentum: measured, the cost is within seed noise
    (bench/results/security_mixing.md).
    """
    altered = set(report.clipped) | set(report.rescaled)
    if not altered:
        return mix(weights, {**used, me: own}), None
    mixed = mix(weights, {**{p: own if p in altered else t for p, t in used.items()}, me: own})
    direct = torch.zeros_like(own)
    for p in sorted(altered):
        direct.add_(used[p] - own, alpha=weights[p])
    return mixed, direct


def robust_mix(
    trust: TrustRadius,
    tilde: torch.Tensor,
    base: torch.Tensor,
    weights: Mapping[str, float],
    received: Mapping[str, torch.Tensor],
    me: str,
    gossip: str = "momentum",
) -> tuple[torch.Tensor, torch.Tensor | None, float, ClipReport]:
    """A round's mix as :class:`~gaslocd.train.worker.Worker` applies it: each partner's
    θ̃ clipped to the trust radius of the round that went from ``base`` to ``tilde``,
    then :func:`split_mix`; and the consensus distance to the partners as received.
    The partners' θ̃ (host tensors off the wire) are mixed on ``tilde``'s device.

    ``gossip="direct"`` (``OuterConfig.gossip``) hands the outer step our own θ̃ and
    moves the whole mix, Σ_j W_ij θ̃_j − θ̃_i, into the direct part: the momentum then
    sees only our own pseudo-gradient, and the consensus step is taken once, unscaled,
    instead of η(1 + μ) now and again through m in later rounds (with a new random
    partner each round those later echoes point at the wrong partner)."""
    received = {p: t.to(tilde.device, non_blocking=True) for p, t in received.items()}
    consensus = pairwise_consensus(tilde, received)
    change = abs(float(tilde.norm()) - float(base.norm()))
    used, report = trust.clip(tilde, received, distance(base, tilde), change)
    mixed, direct = split_mix(weights, tilde, used, report, me)
    if gossip == "direct":
        moved = mixed - tilde
        direct = moved if direct is None else direct.add_(moved)
        mixed = tilde.clone()  # the live vector itself, which the outer step overwrites
    return mixed, direct, consensus, report


def _radial_part(own_norm: float, d_r: float, tangential: float, rho: float) -> float:
    """The radial part to mix: ``d_r``, or the one that puts the mixed θ̃'s norm at
    ‖θ̃_i‖ ± ρ when the norm gap would be larger."""
    gap = math.hypot(own_norm + d_r, tangential) - own_norm
    if abs(gap) <= rho:
        return d_r
    target = own_norm + math.copysign(rho, gap)
    return math.sqrt(max(target * target - tangential * tangential, 0.0)) - own_norm


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """⟨a, b⟩ in float64, slice by slice."""
    a, b = a.reshape(-1), b.reshape(-1)
    return math.fsum(
        float(torch.dot(a[i : i + SLICE].double(), b[i : i + SLICE].double()))
        for i in range(0, a.numel(), SLICE)
    )


def norm_of(t: torch.Tensor) -> float:
    """‖t‖ in float64, slice by slice."""
    t = t.reshape(-1)
    total = 0.0
    for start in range(0, t.numel(), SLICE):
        total += float(torch.linalg.vector_norm(t[start : start + SLICE], dtype=torch.float64)) ** 2
    return math.sqrt(total)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of a flat tensor is finite, slice by slice (no model-sized
    boolean temporary)."""
    t = t.reshape(-1)
    return all(
        bool(torch.isfinite(t[start : start + SLICE]).all()) for start in range(0, t.numel(), SLICE)
    )
