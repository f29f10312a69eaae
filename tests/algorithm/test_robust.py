"""Robust mixing (gaslocd/algorithm/robust.py): what one partner can do to a worker."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from gaslocd.algorithm.outer import mix
from gaslocd.algorithm.robust import TrustConfig, TrustRadius, all_finite, distance, split_mix

N = 4096


def _warm(trust: TrustRadius, own: torch.Tensor, spread: float, rounds: int = 8) -> None:
    """Feed honest partners at about ``spread`` from ``own`` until the history is set."""
    gen = torch.Generator().manual_seed(7)
    for _ in range(rounds):
        step = torch.randn(N, generator=gen)
        trust.clip(own, {"h": own + step * (spread / float(step.norm()))}, progress=spread)


def _own(seed: int = 0) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed))


def test_an_honest_partner_inside_the_radius_is_mixed_untouched() -> None:
    own, trust = _own(), TrustRadius()
    _warm(trust, own, spread=1.0)
    honest = own + 0.5 * torch.randn(N, generator=torch.Generator().manual_seed(3)) / math.sqrt(N)
    out, report = trust.clip(own, {"h": honest}, progress=1.0)
    assert out["h"] is honest and report.clipped == ()
    assert report.distances["h"] == pytest.approx(distance(own, honest))


@pytest.mark.parametrize("attack", ["far", "shrink", "grow", "direction"])
def test_an_attackers_pull_is_bounded_by_its_weight_times_the_radius(attack: str) -> None:
    own, trust = _own(), TrustRadius()
    _warm(trust, own, spread=1.0)
    big = 0.9 * float(own.norm())  # at 0.9 of the wire's norm bound
    poison = {
        "far": own + big * torch.ones(N) / math.sqrt(N),
        "shrink": own * 0.1,
        "grow": own * 1.9,
        "direction": own + big * torch.randn(N, generator=torch.Generator().manual_seed(5)) / 64,
    }[attack]
    tau = trust.radius(progress=1.0)
    out, report = trust.clip(own, {"x": poison}, progress=1.0)
    assert report.clipped == ("x",)
    w = {"me": 0.5, "x": 0.5}
    moved = distance(mix(w, {"me": own, **out}), own)
    assert moved <= w["x"] * tau * (1 + 1e-5)
    # The radial part (how much it rescales θ̃_i) is bounded too: ρ, not τ.
    assert abs(float(out["x"].norm()) - float(own.norm())) <= report.radial_radius + 1e-3


def _far(own: torch.Tensor, at: float, seed: int = 11) -> torch.Tensor:
    step = torch.randn(N, generator=torch.Generator().manual_seed(seed))
    return own + step * (at / float(step.norm()))


def test_far_partners_as_a_minority_do_not_raise_the_radius() -> None:
    own, trust = _own(), TrustRadius()
    _warm(trust, own, spread=1.0, rounds=32)
    before = trust.radius(progress=0.0)
    for k in range(100):  # every round two honest partners and one attacker, far away
        partners = {"h1": _far(own, 1.0, 2 * k), "h2": _far(own, 1.0, 2 * k + 1)}
        trust.clip(own, {**partners, "x": own * 0.1}, progress=0.0)
    assert trust.radius(progress=0.0) == pytest.approx(before)
    assert trust.clipped_total == 100


def test_an_eclipse_raises_the_radius_at_most_factor_per_half_window() -> None:
    """An attacker as every partner adds distances capped at τ: the median (half a
    window of honest distances) holds for 15 of them, then τ grows by ≤ factor."""
    own, trust = _own(), TrustRadius()
    _warm(trust, own, spread=1.0, rounds=32)
    before = trust.radius(progress=0.0)
    for _ in range(15):
        trust.clip(own, {"x": own * 0.1}, progress=0.0)
    assert trust.radius(progress=0.0) == pytest.approx(before)
    for _ in range(16):
        trust.clip(own, {"x": own * 0.1}, progress=0.0)
        assert trust.radius(progress=0.0) <= trust.cfg.factor * before * (1 + 1e-6)


def test_honest_peers_that_drifted_apart_are_mixed_again() -> None:
    """A streak of equal 1-peer pairings splits a run into pairs that drift apart; their
    cross distances are then several τ of the within-pair history. They must come back
    under τ (before, a history of unclipped distances alone clipped them for good)."""
    own, trust = _own(), TrustRadius()
    _warm(trust, own, spread=1.0, rounds=32)
    assert trust.radius(progress=0.5) == pytest.approx(2.0)
    for k in range(64):
        _, report = trust.clip(own, {"other-pair": _far(own, 8.0, k)}, progress=0.5)
        if not report.clipped:
            break
    assert report.clipped == (), f"still clipped after 64 rounds (τ {report.radius:.3g})"
    assert k >= 15  # and not at once: the honest half of the history holds τ a while


def test_warm_up_uses_own_progress_and_cannot_starve() -> None:
    own, trust = _own(), TrustRadius(TrustConfig(warmup=3, warmup_factor=2.0))
    assert trust.radius(progress=1.5) == 3.0  # no history: 2 × ‖Δ_i‖
    # Honest partners all beyond the warm-up radius are clipped, but counted (capped at τ),
    # so warm-up ends and the radius follows what partners look like.
    for _ in range(3):
        trust.clip(own, {"h": own + 10.0 * torch.ones(N) / math.sqrt(N)}, progress=1.5)
    assert trust.radius(progress=1.5) == pytest.approx(2.0 * 3.0)


def test_the_floor_keeps_a_diverged_run_mixing() -> None:
    own, trust = _own(), TrustRadius()
    _warm(trust, own, spread=0.01)
    assert trust.radius(progress=5.0) == 5.0  # floor × own progress, not 2 × 0.01


def test_w_is_applied_unchanged_and_equal_radii_preserve_the_pair_mean() -> None:
    """Clipping changes what is mixed, never W: with the same τ at both ends (and no
    radial limit yet) the clipped differences are opposite, so a pair's mean is kept."""
    cfg = TrustConfig(warmup=8, warmup_factor=1.0)
    a, b = _own(1), _own(2)
    ta, tb = TrustRadius(cfg), TrustRadius(cfg)
    out_a, rep_a = ta.clip(a, {"b": b}, progress=1.0)
    out_b, rep_b = tb.clip(b, {"a": a}, progress=1.0)
    assert rep_a.clipped == ("b",) and rep_b.clipped == ("a",)
    w = {"self": 0.5, "other": 0.5}  # rows of (I + P)/2: doubly stochastic
    new_a = mix(w, {"self": a, "other": out_a["b"]})
    new_b = mix(w, {"self": b, "other": out_b["a"]})
    assert torch.allclose((new_a + new_b) / 2, (a + b) / 2, atol=1e-5)


def test_off_means_plain_mixing() -> None:
    own, trust = _own(), TrustRadius(TrustConfig(enabled=False))
    far = own * 0.1
    out, report = trust.clip(own, {"x": far}, progress=0.0)
    assert out["x"] is far and report.clipped == () and report.radius == math.inf


def test_finite_check() -> None:
    t = torch.zeros(10)
    assert all_finite(t)
    t[7] = float("nan")
    assert not all_finite(t)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="factor"):
        TrustConfig(factor=0)
    with pytest.raises(ValueError, match="warmup"):
        TrustConfig(warmup=0)


def test_the_history_survives_a_checkpoint_and_a_damaged_one_changes_nothing() -> None:
    trust = TrustRadius(TrustConfig(window=4, warmup=2))
    own = torch.zeros(8)
    for k in range(6):  # honest partners at distance 1..6: the last 4 are remembered
        trust.clip(own, {"p": torch.full((8,), (k + 1) / math.sqrt(8))}, progress=10.0)
    again = TrustRadius(TrustConfig(window=4, warmup=2))
    assert again.load_state_dict(trust.state_dict())
    assert again.radius(1.0) == trust.radius(1.0) == pytest.approx(2.0 * 4.5)
    for bad in ({"accepted": [1.0, math.nan], "radial": []}, {"accepted": [1.0]}, [1.0], None):
        fresh = TrustRadius(TrustConfig(window=4, warmup=2))
        assert not fresh.load_state_dict(bad)
        assert fresh.radius(1.0) == 4.0  # still warming up: nothing was taken


def test_an_altered_partners_pull_is_split_off_the_outer_step() -> None:
    """What robust mixing altered moves θ once, outside the outer step; an untouched
    partner is mixed as before. The round's total pull is the plain mix's either way."""
    own, trust = _own(), TrustRadius()
    _warm(trust, own, spread=1.0)
    honest = own + 0.5 * torch.randn(N, generator=torch.Generator().manual_seed(3)) / math.sqrt(N)
    w = {"me": 0.5, "h": 0.25, "x": 0.25}
    used, report = trust.clip(own, {"h": honest, "x": own * 0.1}, progress=1.0)
    assert report.clipped == ("x",)
    mixed, direct = split_mix(w, own, used, report, "me")
    assert torch.allclose(mixed, mix({"me": 0.75, "h": 0.25}, {"me": own, "h": honest}))
    assert direct is not None
    assert torch.allclose(direct, 0.25 * (used["x"] - own))
    assert torch.allclose(mixed + direct, mix(w, {"me": own, **used}), atol=1e-6)
    alone, none = split_mix(w, own, {"h": honest, "x": own}, replace(report, clipped=()), "me")
    assert none is None and torch.allclose(alone, mix(w, {"me": own, "h": honest, "x": own}))
