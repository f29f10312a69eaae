"""The paper's comparisons again with a decayed inner LR (issue 17): what the grid trains.

The earlier grids kept the inner LR constant after the warm-up, which neither DiLoCo nor
LLM pretraining does; a cosine decay to 10% closed most of GASLoC-2peer's gap to DiLoCo
in a trial. This mode trains, all with that decay:

- ``main``: GASLoC-1peer, GASLoC-2peer, DiLoCo and Local-DAdam-2peer at H=30 on 8 and 16
  workers, seeds 0, 1;
- ``outer``: the η×μ grid at 8 workers for GASLoC-2peer too (the earlier sweep had only
  GASLoC-1peer and DiLoCo), seed 0;
- ``h1_mu``: H=1 with small outer momenta (μ ∈ {0, 0.1, 0.2, 0.3}, η = 1 − μ), where
  every earlier setting had μ ≥ 0.5, beside DAdam on four topologies, seed 0;
- ``noise``: is the gap at 16 workers a noise-scale effect? The same comparison with
  4× the batch (same steps, a quarter of the gradient noise), and with the ``small``
  model (4.9M parameters, 20× the tiny one) over half the steps beside the tiny model
  over those same steps, seed 0;
- ``peak_lr``: GASLoC-2peer and DiLoCo at twice the peak inner LR (the decay lowers the
  mean LR; a decayed schedule usually pairs with a higher peak), seed 0;
- ``variant``: GASLoC with ``--gossip direct`` (the outer momentum on our own
  pseudo-gradient, the mix beside it), the main grid's sizes and seeds;
- ``tuned``: GASLoC-2peer and DiLoCo at the main grid's sizes and seeds with the outer
  setting the η×μ grid found best for DiLoCo under the decay (η=0.7, μ=0.7).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .grid import FULL, Mode, RunSpec

SECTIONS = ("main", "noise", "outer", "h1_mu", "peak_lr", "variant", "tuned")
COMPARED = ("1peer", "2peer", "diloco")


@dataclass(frozen=True)
class Plan:
    """The sizes of the decay grid (the report reads them back)."""

    h: int = 30
    workers: tuple[int, ...] = (8, 16)
    seeds: tuple[int, ...] = (0, 1)
    outer_lrs: tuple[float, ...] = (0.4, 0.7, 1.0)
    outer_momenta: tuple[float, ...] = (0.7, 0.9)
    h1_momenta: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3)
    big_batch: int = 32
    big_model: str = "small"
    big_model_steps: int = 240  # half the budget: a small-model step costs ~11× a tiny one
    noise_workers: int = 16
    # A decay to 10% lowers the mean LR: does a higher peak give the loss back?
    peak_lrs: tuple[float, ...] = (6e-3,)
    # The main comparison again at the outer setting the η×μ grid found best for DiLoCo.
    tuned: tuple[float, float] = (0.7, 0.7)

    @property
    def small_workers(self) -> int:
        return self.workers[0]

    def spec(self, kind: str, h: int, n: int, seed: int, **kw: object) -> RunSpec:
        """A GASLoC run (kind: its topology) or, for ``"diloco"``, a DiLoCo run."""
        if kind == "diloco":
            return RunSpec("diloco", "complete", h, n, seed, **kw)  # type: ignore[arg-type]
        return RunSpec("gasloc", kind, h, n, seed, **kw)  # type: ignore[arg-type]

    def local(self, n: int, seed: int) -> RunSpec:
        return RunSpec("local-dadam", "2peer", self.h, n, seed)

    def outer(self, kind: str, lr: float, mom: float) -> RunSpec:
        return self.spec(kind, self.h, self.small_workers, 0, outer_lr=lr, outer_momentum=mom)

    def h1(self, kind: str, mom: float) -> RunSpec:
        return self.spec(
            kind, 1, self.small_workers, 0, outer_lr=round(1.0 - mom, 3), outer_momentum=mom
        )

    def dadam(self, topology: str) -> RunSpec:
        return RunSpec("dadam", topology, 1, self.small_workers, 0)

    def noise_settings(
        self, batch: int = 8, steps: int = 480
    ) -> list[tuple[str, dict[str, object]]]:
        """(label, RunSpec overrides) of the noise-scale study's rows, the main grid's
        first; ``batch`` and ``steps``: the budget's, for the labels."""
        short, big = self.big_model_steps, self.big_model
        return [
            (f"tiny, batch {batch}, {steps} steps (the main grid)", {}),
            (f"tiny, batch {self.big_batch}, {steps} steps", {"batch_size": self.big_batch}),
            (f"tiny, batch {batch}, {short} steps", {"steps_per_worker": short}),
            (f"{big}, batch {batch}, {short} steps", {"model": big, "steps_per_worker": short}),
        ]

    def noise(self, kind: str, overrides: dict[str, object]) -> RunSpec:
        return self.spec(kind, self.h, self.noise_workers, 0, **overrides)

    def sections(self) -> dict[str, list[RunSpec]]:
        main = [
            spec
            for n in self.workers
            for s in self.seeds
            for spec in (*(self.spec(k, self.h, n, s) for k in COMPARED), self.local(n, s))
        ]
        outer = [
            self.outer(k, lr, mom)
            for k in ("2peer", "1peer", "diloco")
            for lr in self.outer_lrs
            for mom in self.outer_momenta
        ]
        h1_mu = [self.h1(k, mom) for mom in self.h1_momenta for k in ("1peer", "2peer")]
        h1_mu += [self.dadam(t) for t in ("1peer", "2peer", "ring", "complete")]
        noise = [
            self.noise(k, kw)
            for _, kw in self.noise_settings()[1:]
            for k in (COMPARED if "batch_size" in kw else ("2peer", "diloco"))
        ]
        peak_lr = [
            self.spec(k, self.h, n, 0, inner_lr=lr)
            for lr in self.peak_lrs
            for n in self.workers
            for k in ("2peer", "diloco")
        ]
        variant = [
            self.spec(k, self.h, n, s, gossip="direct")
            for n in self.workers
            for s in self.seeds
            for k in ("2peer", "1peer")
        ]
        lr, mom = self.tuned
        tuned = [
            self.spec(k, self.h, n, s, outer_lr=lr, outer_momentum=mom)
            for n in self.workers
            for s in self.seeds
            for k in ("2peer", "diloco")
        ]
        return {
            "tuned": tuned,
            "main": main,
            "noise": noise,
            "outer": outer,
            "h1_mu": h1_mu,
            "peak_lr": peak_lr,
            "variant": variant,
        }


@dataclass(frozen=True)
class DecayMode(Mode):
    """A :class:`Mode` whose sections come from a :class:`Plan`."""

    plan: Plan = field(default_factory=Plan)

    def __post_init__(self) -> None:
        self.sections.clear()
        self.sections.update(self.plan.sections())


def decay_mode(plan: Plan | None = None, base: Mode = FULL, name: str = "decay") -> DecayMode:
    """``base``'s budget and network with a cosine decay to 10%, and the plan's runs."""
    fields = {k: getattr(base, k) for k in Mode.__dataclass_fields__ if k != "sections"}
    fields |= {"name": name, "budget": replace(base.budget, lr_schedule="cosine")}
    return DecayMode(**fields, plan=plan or Plan())


def ordered(mode: Mode, sections: tuple[str, ...]) -> list[RunSpec]:
    """Each run once, the longest first, so that two processes end together."""
    seen: dict[str, RunSpec] = {}
    for name in SECTIONS:
        if name in sections:
            for spec in mode.sections[name]:
                seen.setdefault(spec.key, spec)

    def cost(spec: RunSpec) -> float:
        per_step = (11.0 if spec.model != "tiny" else 1.0) * (spec.batch_size or 8) / 8
        steps = spec.steps_per_worker or mode.budget.steps_per_worker
        return per_step * steps * spec.workers * (1.7 if spec.inner_steps == 1 else 1.0)

    return sorted(seen.values(), key=cost, reverse=True)


DECAY = decay_mode()
