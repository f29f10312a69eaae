"""Round plans: agreement without messages, the right graph shapes, and mixing (P3, P4)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gaslocd.algorithm.topology import (
    dialer,
    mixing_matrix,
    plan_round,
    roster_digest,
    round_seed,
)
from gaslocd.config import TOPOLOGIES


def _roster(n: int) -> list[str]:
    return [f"peer-{k:04d}" for k in range(n)]


def test_round_seed_is_the_same_in_another_process() -> None:
    code = "from gaslocd.algorithm.topology import round_seed; print(round_seed('run-x', 17))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert int(out.stdout) == round_seed("run-x", 17)
    assert round_seed("run-x", 17) != round_seed("run-x", 18)
    assert round_seed("run-x", 17) != round_seed("run-y", 17)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_peer_computes_the_same_plan_whatever_roster_order(topology: str) -> None:
    roster = _roster(9)
    plan = plan_round(topology, roster, 5, "run")
    shuffled = list(reversed(roster))
    assert plan_round(topology, shuffled, 5, "run") == plan
    assert roster_digest(shuffled) == roster_digest(roster)


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("n", [1, 2, 3, 8, 13])
def test_plans_are_symmetric_and_w_is_doubly_stochastic(topology: str, n: int) -> None:
    plan = plan_round(topology, _roster(n), 3, 7)
    for p in plan.roster:
        assert p not in plan.partners_of(p)
        for q in plan.partners_of(p):
            assert p in plan.partners_of(q)
    w = mixing_matrix(plan)
    ones = torch.ones(n, dtype=torch.float64)
    assert torch.allclose(w.sum(0), ones, atol=1e-15)
    assert torch.allclose(w.sum(1), ones, atol=1e-15)
    assert torch.equal(w, w.T)
    assert (w >= 0).all()


def test_one_peer_is_a_matching_with_one_sitting_out_when_odd() -> None:
    plan = plan_round("1peer", _roster(9), 0, 1)
    degrees = sorted(plan.degree(p) for p in plan.roster)
    assert degrees == [0] + [1] * 8
    w = mixing_matrix(plan)
    assert sorted(w.diagonal().tolist()) == [0.5] * 8 + [1.0]


def test_two_peer_is_one_random_cycle_through_everyone() -> None:
    plan = plan_round("2peer", _roster(10), 4, 1)
    assert all(plan.degree(p) == 2 for p in plan.roster)
    seen, prev, cur = [plan.roster[0]], None, plan.roster[0]
    while True:
        nxt = next(q for q in plan.partners_of(cur) if q != prev)
        if nxt == plan.roster[0]:
            break
        seen.append(nxt)
        prev, cur = cur, nxt
    assert sorted(seen) == list(plan.roster)


def test_random_pairings_change_every_round_and_fixed_ring_does_not() -> None:
    roster = _roster(16)
    one = {plan_round("1peer", roster, t, 0).partners["peer-0000"] for t in range(30)}
    assert len(one) > 5
    ring = {plan_round("ring", roster, t, 0).partners["peer-0000"] for t in range(30)}
    assert ring == {("peer-0001", "peer-0015")}


def test_exp_reaches_exact_average_in_log2_n_rounds() -> None:
    n = 16
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for t in range(4):
        x = mixing_matrix(plan_round("exp", _roster(n), t, 0)) @ x
    assert torch.allclose(x, x.mean().expand(n), atol=1e-12)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="topology"):
        plan_round("star", _roster(4), 0, 0)
    with pytest.raises(ValueError, match="duplicate"):
        plan_round("1peer", ["a", "a"], 0, 0)
    with pytest.raises(ValueError, match="empty"):
        plan_round("1peer", [], 0, 0)
    with pytest.raises(KeyError, match="not in this round"):
        plan_round("1peer", ["a", "b"], 0, 0).partners_of("c")


# -- P3: every mixing step preserves the network mean ---------------------------------


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_p3_mixing_preserves_the_network_mean(topology: str) -> None:
    n, dim = 11, 50
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, dim, dtype=torch.float64, generator=gen)
    for t in range(6):
        y = mixing_matrix(plan_round(topology, _roster(n), t, 3)) @ x
        assert (y.mean(0) - x.mean(0)).abs().max() <= 1e-12
        x = y


# -- P4: expected contraction of the consensus error per round -------------------------


def _expected_wtw(topology: str, n: int, rounds: range) -> torch.Tensor:
    """Monte-Carlo E[WᵀW] over ``rounds``, built from sparse rows so n = 1024 stays cheap."""
    index = {p: k for k, p in enumerate(_roster(n))}
    rr: list[int] = []
    cc: list[int] = []
    vv: list[float] = []
    for t in rounds:
        plan = plan_round(topology, _roster(n), t, 11)
        for p in plan.roster:
            # (WᵀW)_ab = Σ_r W_ra W_rb: row r adds the outer product of its entries.
            entries = [(index[q], w) for q, w in plan.mixing_weights(p).items()]
            for a, wa in entries:
                for b, wb in entries:
                    rr.append(a)
                    cc.append(b)
                    vv.append(wa * wb)
    acc = torch.zeros(n, n, dtype=torch.float64)
    values = torch.tensor(vv, dtype=torch.float64)
    acc.index_put_((torch.tensor(rr), torch.tensor(cc)), values, accumulate=True)
    return acc / len(rounds)


def _contraction_rate(topology: str, n: int, samples: int) -> float:
    """Largest eigenvalue of E[WᵀW] off the all-ones vector, estimated without bias.

    The top eigenvalue of a noisy estimate is biased upwards by the noise, so the top
    eigenvector is found on one half of the rounds and its Rayleigh quotient is read on
    the other half (a held-out estimate).
    """
    proj = torch.eye(n, dtype=torch.float64) - 1.0 / n
    first = proj @ _expected_wtw(topology, n, range(0, samples // 2)) @ proj
    second = proj @ _expected_wtw(topology, n, range(samples // 2, samples)) @ proj
    top = torch.linalg.eigh(first).eigenvectors[:, -1]
    return float(top @ second @ top)


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_p4_one_peer_contracts_by_about_one_half_independent_of_n(n: int) -> None:
    rate = _contraction_rate("1peer", n, samples={8: 2000, 64: 1000, 1024: 200}[n])
    # Exact for even n: WᵀW = W and E[P] = (J − I)/(n − 1), so rate = 1/2 − 1/(2(n − 1)).
    assert rate == pytest.approx(0.5 - 0.5 / (n - 1), abs=0.03)
    assert 0.42 <= rate <= 0.53


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_p4_two_peer_contracts_by_about_one_third_independent_of_n(n: int) -> None:
    rate = _contraction_rate("2peer", n, samples={8: 2000, 64: 1000, 1024: 200}[n])
    # E[(I + P + Pᵀ)²]/9 with E[P] = E[P²] = (J − I)/(n − 1) off the ones vector.
    assert rate == pytest.approx(1 / 3 - 2 / (3 * (n - 1)), abs=0.03)
    assert 0.22 <= rate <= 0.36


def test_p4_fixed_ring_degrades_like_one_minus_order_one_over_n_squared() -> None:
    gaps = {}
    for n in (8, 32, 128):
        w = mixing_matrix(plan_round("ring", _roster(n), 0, 0))
        proj = torch.eye(n, dtype=torch.float64) - 1.0 / n
        gaps[n] = 1 - float(torch.linalg.eigvalsh(proj @ w.T @ w @ proj).max())
    # 1 − ((1 + 2 cos(2π/n)) / 3)² ≈ (8π²/3) / n² for large n.
    for n, gap in gaps.items():
        assert gap * n * n == pytest.approx(8 * torch.pi**2 / 3, rel=0.25)
    assert gaps[8] > gaps[32] > gaps[128]


# -- peers behind NAT ------------------------------------------------------------------------


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize(("n", "shut"), [(6, 1), (6, 3), (7, 4), (8, 6), (3, 3)])
def test_two_unreachable_peers_are_never_partners_and_w_stays_doubly_stochastic(
    topology: str, n: int, shut: int
) -> None:
    roster = _roster(n)
    unreachable = set(roster[::-1][:shut])  # not a prefix of the sorted order
    for t in range(12):
        plan = plan_round(topology, roster, t, "nat", unreachable)
        assert not [e for e in plan.edges() if set(e) <= unreachable], (t, plan.partners)
        for p, qs in plan.partners.items():
            assert all(p in plan.partners[q] for q in qs)
        w = mixing_matrix(plan)
        ones = torch.ones(n, dtype=w.dtype)
        assert torch.allclose(w.sum(0), ones) and torch.allclose(w.sum(1), ones)


@pytest.mark.parametrize("topology", ["1peer", "2peer"])
def test_random_pairings_give_every_unreachable_peer_a_partner_while_they_are_few(
    topology: str,
) -> None:
    roster = _roster(9)
    unreachable = set(roster[:4])  # 4 behind NAT, 5 reachable
    for t in range(20):
        plan = plan_round(topology, roster, t, "nat", unreachable)
        assert all(plan.degree(p) >= 1 for p in unreachable), (t, plan.partners)
        reachable_alone = [p for p in roster if p not in unreachable and plan.degree(p) == 0]
        assert len(reachable_alone) <= (1 if topology == "1peer" else 0)


def test_unreachable_peers_beyond_the_reachable_count_sit_out_by_turns() -> None:
    roster = _roster(8)
    unreachable = set(roster[:6])  # 6 behind NAT, 2 reachable
    paired: dict[str, int] = dict.fromkeys(unreachable, 0)
    for t in range(60):
        plan = plan_round("1peer", roster, t, "nat", unreachable)
        assert sum(plan.degree(p) for p in unreachable) == 2  # one per reachable peer
        for p in unreachable:
            paired[p] += plan.degree(p)
    assert min(paired.values()) >= 8, paired  # ~20 each expected: nobody is left out


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_with_everyone_reachable_the_plan_is_the_one_without_the_rule(topology: str) -> None:
    roster = _roster(9)
    for t in range(5):
        assert plan_round(topology, roster, t, "r", ()) == plan_round(topology, roster, t, "r")
        assert plan_round(topology, roster, t, "r", {"not-in-roster"}) == plan_round(
            topology, roster, t, "r"
        )


def test_the_peer_behind_nat_dials_otherwise_the_smaller_id() -> None:
    assert dialer("a", "b") == "a" and dialer("b", "a") == "a"
    assert dialer("a", "b", {"b"}) == "b" and dialer("b", "a", {"b"}) == "b"
    assert dialer("a", "b", {"a", "b"}) == "a"  # never planned; the id rule still answers
    with pytest.raises(ValueError, match="own partner"):
        dialer("a", "a")
