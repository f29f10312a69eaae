"""The outer rule: DiLoCo as a special case (P1), isolation (P2), gossip (P5), failures."""

from __future__ import annotations

import math

import pytest
import torch

from gaslocd.algorithm.outer import (
    consensus_distance,
    mix,
    outer_step_,
    pairwise_consensus,
    renormalized_weights,
)
from gaslocd.algorithm.topology import mixing_matrix, plan_round
from gaslocd.config import TOPOLOGIES, OuterConfig

DIM = 40


def _roster(n: int) -> list[str]:
    return [f"w{k:02d}" for k in range(n)]


def _local_update(theta: torch.Tensor, worker: int, round_index: int, steps: int) -> torch.Tensor:
    """θ̃: a few gradient steps on a worker-specific random quadratic (nonlinear in the
    data, so the trajectories really depend on what each worker saw)."""
    gen = torch.Generator().manual_seed(1000 * round_index + worker)
    a = torch.randn(DIM, DIM, dtype=torch.float64, generator=gen) / math.sqrt(DIM)
    b = torch.randn(DIM, dtype=torch.float64, generator=gen)
    x = theta.clone()
    for _ in range(steps):
        x -= 0.05 * (a.T @ (a @ x - b) + 0.1 * torch.tanh(x))
    return x


def _gasloc_round(
    thetas: dict[str, torch.Tensor],
    moms: dict[str, torch.Tensor],
    topology: str,
    t: int,
    cfg: OuterConfig,
    steps: int = 3,
) -> None:
    plan = plan_round(topology, list(thetas), t, "seed")
    tilde = {p: _local_update(thetas[p], k, t, steps) for k, p in enumerate(sorted(thetas))}
    mixed = {}
    for p in plan.roster:
        row = plan.mixing_weights(p)
        mixed[p] = mix(row, {q: tilde[q] for q in row})
    for p in plan.roster:
        outer_step_(thetas[p], moms[p], mixed[p], cfg)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_p1_complete_graph_is_diloco_on_one_replica(seed: int) -> None:
    n, rounds, cfg = 6, 8, OuterConfig(lr=0.7, momentum=0.9)
    theta0 = torch.randn(DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    thetas = {p: theta0.clone() for p in _roster(n)}
    moms = {p: torch.zeros(DIM, dtype=torch.float64) for p in _roster(n)}

    # DiLoCo reference: one replica, the averaged pseudo-gradient, torch's own SGD.
    replica = torch.nn.Parameter(theta0.clone())
    sgd = torch.optim.SGD([replica], lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
    for t in range(rounds):
        start = replica.detach().clone()
        deltas = [start - _local_update(start, k, t, 3) for k in range(n)]
        replica.grad = torch.stack(deltas).mean(0)
        sgd.step()
        _gasloc_round(thetas, moms, "complete", t, cfg)
        for p in thetas:
            assert (thetas[p] - replica.detach()).abs().max() <= 1e-12


def test_p2_identity_mixing_is_each_worker_running_diloco_alone() -> None:
    cfg = OuterConfig(lr=0.5, momentum=0.8)
    roster = _roster(4)
    gen = torch.Generator().manual_seed(5)
    thetas = {p: torch.randn(DIM, dtype=torch.float64, generator=gen) for p in roster}
    moms = {p: torch.zeros(DIM, dtype=torch.float64) for p in roster}
    refs = {p: torch.nn.Parameter(thetas[p].clone()) for p in roster}
    opts = {
        p: torch.optim.SGD([refs[p]], lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
        for p in roster
    }
    for t in range(6):
        plan = plan_round("1peer", roster, t, 0)
        for k, p in enumerate(roster):
            tilde = _local_update(thetas[p], k, t, 2)
            # Every exchange failed: the row keeps only the self weight, W = I.
            row = renormalized_weights(plan.mixing_weights(p), p, exchanged=set())
            assert row == {p: 1.0}
            outer_step_(thetas[p], moms[p], mix(row, {p: tilde}), cfg)
            refs[p].grad = refs[p].detach() - _local_update(refs[p].detach(), k, t, 2)
            opts[p].step()
            assert (thetas[p] - refs[p].detach()).abs().max() <= 1e-12


@pytest.mark.parametrize("topology", ["1peer", "2peer", "ring", "exp"])
def test_p5_unit_lr_zero_momentum_is_plain_gossip_of_theta_tilde(topology: str) -> None:
    n, cfg = 7, OuterConfig(lr=1.0, momentum=0.0)
    gen = torch.Generator().manual_seed(9)
    thetas = {p: torch.randn(DIM, dtype=torch.float64, generator=gen) for p in _roster(n)}
    moms = {p: torch.zeros(DIM, dtype=torch.float64) for p in _roster(n)}
    gossip = torch.stack([thetas[p] for p in _roster(n)]).clone()
    for t in range(5):
        tilde = torch.stack([_local_update(gossip[k], k, t, 1) for k in range(n)])
        gossip = mixing_matrix(plan_round(topology, _roster(n), t, "seed")) @ tilde
        _gasloc_round(thetas, moms, topology, t, cfg, steps=1)
        got = torch.stack([thetas[p] for p in _roster(n)])
        assert (got - gossip).abs().max() <= 1e-12


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_p3_holds_with_symmetric_exchange_failures(topology: str) -> None:
    n = 9
    roster = _roster(n)
    gen = torch.Generator().manual_seed(2)
    x = {p: torch.randn(DIM, dtype=torch.float64, generator=gen) for p in roster}
    plan = plan_round(topology, roster, 4, 1)
    failed = set(plan.edges()[::2])  # every other edge dies, seen by both of its ends
    mixed = []
    for p in roster:
        ok = {q for q in plan.partners_of(p) if (min(p, q), max(p, q)) not in failed}
        row = renormalized_weights(plan.mixing_weights(p), p, ok)
        assert math.isclose(sum(row.values()), 1.0, abs_tol=1e-15)
        mixed.append(mix(row, x))
    before = torch.stack(list(x.values())).mean(0)
    assert (torch.stack(mixed).mean(0) - before).abs().max() <= 1e-12


def test_renormalization_refuses_inconsistent_inputs() -> None:
    row = {"a": 0.5, "b": 0.5}
    with pytest.raises(ValueError, match="outside the round's plan"):
        renormalized_weights(row, "a", {"c"})
    with pytest.raises(ValueError, match="self weight"):
        renormalized_weights(row, "z", set())
    with pytest.raises(ValueError, match="no tensor"):
        mix(row, {"a": torch.zeros(2)})


def test_outer_config_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="momentum"):
        OuterConfig(momentum=1.0)
    with pytest.raises(ValueError, match="learning rate"):
        OuterConfig(lr=float("nan"))


def test_consensus_measures() -> None:
    same = {p: torch.ones(5) for p in "abc"}
    assert consensus_distance(same) == 0.0
    spread = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([3.0, 0.0])}
    # mean (2, 0); each is 1 away: RMS 1, relative to ‖mean‖ = 2.
    assert consensus_distance(spread) == pytest.approx(0.5)
    assert pairwise_consensus(
        torch.tensor([2.0, 0.0]), {"b": torch.tensor([3.0, 0.0])}
    ) == pytest.approx(0.5)
    assert pairwise_consensus(torch.ones(3), {}) == 0.0
