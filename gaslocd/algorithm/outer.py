"""The GASLoC outer step (docs/design.md §1) on flat parameter tensors.

For worker i at round t, with θ_i its parameters at the start of the round and θ̃_j the
post-local-update parameters of itself and of this round's partners::

    G_i = θ_i − Σ_j W_ij θ̃_j                  (outer gradient)
    m_i ← μ m_i + G_i                         (Nesterov, torch.optim.SGD(nesterov=True) form)
    θ_i ← θ_i − η (G_i + μ m_i)

With W = J/n and equal starting points this is exactly DiLoCo; with η = 1, μ = 0 it is
plain gossip of θ̃ (DAdam). Everything here is arithmetic on tensors the caller owns:
no clock, no I/O, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from gaslocd.config import OuterConfig


def renormalized_weights(
    row: Mapping[str, float], self_id: str, exchanged: set[str]
) -> dict[str, float]:
    """Row of W for the peers that actually exchanged: a lost partner's weight goes to self.

    A partner that died, timed out or refused drops out of this round only. Its weight
    W_ij is added to W_ii rather than rescaling the rest proportionally: exchange
    failures are symmetric (both ends of an edge see them), so this keeps W symmetric and
    doubly stochastic and the network mean is still preserved (P3) in a round with
    failures. If every partner failed, W_ii = 1: a pure local DiLoCo step (P2).
    """
    if self_id not in row:
        raise ValueError(f"the mixing row has no self weight for {self_id!r}")
    unknown = exchanged - row.keys()
    if unknown:
        raise ValueError(f"exchanged with peers outside the round's plan: {sorted(unknown)}")
    kept = {j: w for j, w in row.items() if j in exchanged and j != self_id}
    kept[self_id] = 1.0 - math.fsum(kept.values())
    if not kept[self_id] > 0:
        raise ValueError("mixing weights must leave a positive self weight")
    return kept


def mix(weights: Mapping[str, float], tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Σ_j W_ij θ̃_j over the given row (a new tensor; inputs are not modified)."""
    missing = weights.keys() - tensors.keys()
    if missing:
        raise ValueError(f"no tensor for peers {sorted(missing)}")
    out: torch.Tensor | None = None
    for peer in sorted(weights):  # a fixed order so the float sum is reproducible
        w, x = weights[peer], tensors[peer]
        if out is None:
            out = x.mul(w)
        else:
            out.add_(x, alpha=w)
    assert out is not None  # renormalized rows always hold the self weight
    return out


def outer_gradient(theta: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
    """G = θ − Σ_j W_ij θ̃_j: the peers' pseudo-gradients plus the consensus gap."""
    return theta - mixed


def nesterov_step_(
    theta: torch.Tensor, momentum: torch.Tensor, outer_grad: torch.Tensor, cfg: OuterConfig
) -> None:
    """θ ← θ − η (G + μ m) after m ← μ m + G, in place on ``theta`` and ``momentum``.

    A zero-initialised ``momentum`` matches PyTorch's SGD, whose first step sets m = G.
    """
    momentum.mul_(cfg.momentum).add_(outer_grad)
    theta.sub_(outer_grad.add(momentum, alpha=cfg.momentum), alpha=cfg.lr)


def outer_step_(
    theta: torch.Tensor, momentum: torch.Tensor, mixed: torch.Tensor, cfg: OuterConfig
) -> torch.Tensor:
    """One full outer step in place; returns G for logging (its norm is a useful signal)."""
    grad = outer_gradient(theta, mixed)
    nesterov_step_(theta, momentum, grad, cfg)
    return grad


def consensus_distance(tensors: Mapping[str, torch.Tensor]) -> float:
    """RMS distance of the tensors from their mean, relative to the mean's norm.

    sqrt(mean_i ‖x_i − x̄‖²) / ‖x̄‖: 0 when all replicas agree; scale-free so runs with
    different models compare.
    """
    if not tensors:
        raise ValueError("consensus distance of no tensors")
    stacked = list(tensors.values())
    mean = torch.stack(stacked).mean(dim=0)
    spread = math.fsum(float((x - mean).pow(2).sum()) for x in stacked) / len(stacked)
    norm = float(mean.norm())
    return math.sqrt(spread) / norm if norm > 0 else math.sqrt(spread)


def pairwise_consensus(own: torch.Tensor, partners: Mapping[str, torch.Tensor]) -> float:
    """RMS of θ̃_i − θ̃_j over this round's partners, relative to ‖θ̃_i‖ (a daemon's view).

    A daemon never sees the whole network; this is what it can compute from tensors it
    already holds after an exchange (docs/design.md §4, ``gasloc_consensus_distance``).
    """
    if not partners:
        return 0.0
    own_norm = float(own.norm())
    sq = math.fsum(float((own - x).pow(2).sum()) for x in partners.values()) / len(partners)
    return math.sqrt(sq) / own_norm if own_norm > 0 else math.sqrt(sq)
