"""An insider in the simulator: one worker that holds the join token and sends poison.

Issue 14's audit attacked live daemons with θ̃ at 0.9 of the wire's norm bound every
round; :class:`InsiderSimulation` reproduces that on the simulator's round (the daemon's
protocol, the daemon's :class:`~gaslocd.train.worker.Worker` and its robust mixing), so
the damage and the defence can be measured on one machine in minutes
(``bench/security_mixing.py``).

The insider is omniscient, the worst case: it crafts its message against its first
partner's θ̃ of the round (a real insider only knows its own θ̃, which is close), at
``fraction`` × ``norm_bound`` × ‖θ̃_p‖ from it, so the wire's norm check always passes:

- ``shrink``: θ̃_p scaled towards zero (the audit's "scaled θ": a uniform predictor);
- ``noise``: θ̃_p plus fresh Gaussian noise every round;
- ``direction``: θ̃_p plus one fixed random direction every round (what accumulates).

Otherwise the insider is an ordinary worker (it trains, and mixes what it receives); its
own model is left out of the reported losses, which are the honest workers'.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from gaslocd.algorithm.robust import TrustConfig, TrustRadius
from gaslocd.config import AlgoConfig, SimConfig, TrainConfig
from gaslocd.sim.runner import Simulation
from gaslocd.sim.schedule import RoundState
from gaslocd.train.data import Corpus

ATTACKS = ("shrink", "noise", "direction")


@dataclass(frozen=True)
class Insider:
    """Which worker attacks, how, and how close to the norm bound."""

    worker: int = 0
    attack: str = "noise"
    fraction: float = 0.9  # of the receiver's norm bound
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.attack not in ATTACKS:
            raise ValueError(f"attack must be one of {', '.join(ATTACKS)}, got {self.attack!r}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction!r}")


class InsiderSimulation(Simulation):
    """A :class:`Simulation` with an optional insider and a chosen robust-mixing setting."""

    def __init__(
        self,
        algo: AlgoConfig,
        train: TrainConfig,
        sim: SimConfig,
        *,
        insider: Insider | None = None,
        trust: TrustConfig | None = None,
        corpus: Corpus | None = None,
    ) -> None:
        super().__init__(algo, train, sim, corpus=corpus)
        if insider is not None and insider.worker >= sim.workers:
            raise ValueError(f"insider {insider.worker} does not exist with {sim.workers} workers")
        self.insider = insider
        for w in self.workers:
            w.trust = TrustRadius(trust)
        self._rng = torch.Generator().manual_seed(insider.seed if insider else 0)
        self._direction: torch.Tensor | None = None
        self.honest_val: list[float] = []  # each honest worker's last validation loss

    @property
    def honest(self) -> list[int]:
        return [
            k for k in range(len(self.workers)) if self.insider is None or k != self.insider.worker
        ]

    def _post(self, state: RoundState) -> None:
        """Every worker posts its θ̃, then the insider replaces its own."""
        super()._post(state)
        if self.insider is not None and state.group is None:
            partners = sorted(state.setups[self.insider.worker].partners)
            if partners:
                target = self.workers[self.roster.index(partners[0])].flat.flat
                poison = self.poison(target)
                self.transport.post(state.round, self.roster[self.insider.worker], poison)

    def poison(self, target: torch.Tensor) -> torch.Tensor:
        """The insider's θ̃: ``fraction`` of the norm bound away from ``target``."""
        assert self.insider is not None
        radius = self.insider.fraction * self.norm_bound * float(target.norm())
        if self.insider.attack == "shrink":
            return target * (1.0 - self.insider.fraction * self.norm_bound)
        if self.insider.attack == "direction":
            if self._direction is None:
                self._direction = torch.randn(target.numel(), generator=self._rng)
            step = self._direction
        else:
            step = torch.randn(target.numel(), generator=self._rng)
        return target + step * (radius / float(step.norm()))

    def evaluate(self) -> float:
        """Mean validation loss of the honest workers (each one kept in ``honest_val``)."""
        self.honest_val = [self.workers[k].evaluate() for k in self.honest]
        return statistics.fmean(self.honest_val)

    def clipped(self) -> int:
        """Partner θ̃ honest workers pulled in to their trust radius since the start."""
        return sum(self.workers[k].trust.clipped_total for k in self.honest)

    def rescaled(self) -> int:
        """Partner θ̃ within τ whose norm gap alone honest workers cut to ρ."""
        return sum(self.workers[k].trust.rescaled_total for k in self.honest)

    def rollbacks(self) -> int:
        """Rounds whose local result an honest worker threw away (non-finite)."""
        return sum(sum(self.workers[k].rollbacks.values()) for k in self.honest)
