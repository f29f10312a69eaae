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
  over those same steps, seed 0.
"""

from __future__ import annotations

from dataclasses import replace

from .grid import FULL, Mode, RunSpec

SEEDS = (0, 1)
H = 30
OUTER_LRS = (0.4, 0.7, 1.0)
OUTER_MOMENTA = (0.7, 0.9)
H1_MOMENTA = (0.0, 0.1, 0.2, 0.3)
BIG_BATCH = 32
BIG_MODEL = "small"
BIG_MODEL_STEPS = 240  # half the budget: a small-model step costs ~11× a tiny one here
NOISE_WORKERS = 16
COMPARED = ("1peer", "2peer", "diloco")
SECTIONS = ("main", "noise", "outer", "h1_mu")


def _spec(kind: str, h: int, n: int, seed: int, **kw: object) -> RunSpec:
    if kind == "diloco":
        return RunSpec("diloco", "complete", h, n, seed, **kw)  # type: ignore[arg-type]
    return RunSpec("gasloc", kind, h, n, seed, **kw)  # type: ignore[arg-type]


def _sections() -> dict[str, list[RunSpec]]:
    main = [
        spec
        for n in (8, 16)
        for s in SEEDS
        for spec in (
            *(_spec(k, H, n, s) for k in COMPARED),
            RunSpec("local-dadam", "2peer", H, n, s),  # claim (2)'s "local steps alone"
        )
    ]
    outer = [
        _spec(k, H, 8, 0, outer_lr=lr, outer_momentum=mom)
        for k in ("2peer", "1peer", "diloco")
        for lr in OUTER_LRS
        for mom in OUTER_MOMENTA
    ]
    h1_mu = [
        _spec(k, 1, 8, 0, outer_lr=round(1.0 - mom, 3), outer_momentum=mom)
        for mom in H1_MOMENTA
        for k in ("1peer", "2peer")
    ] + [RunSpec("dadam", t, 1, 8, 0) for t in ("1peer", "2peer", "ring", "complete")]
    n = NOISE_WORKERS
    noise = [
        *(
            _spec(k, H, n, 0, model=BIG_MODEL, steps_per_worker=BIG_MODEL_STEPS)
            for k in ("2peer", "diloco")
        ),
        *(_spec(k, H, n, 0, batch_size=BIG_BATCH) for k in COMPARED),
        *(_spec(k, H, n, 0, steps_per_worker=BIG_MODEL_STEPS) for k in ("2peer", "diloco")),
    ]
    return {"main": main, "noise": noise, "outer": outer, "h1_mu": h1_mu}


def decay_mode() -> Mode:
    """The full grid's budget and network with a cosine decay to 10%, and its own runs."""
    mode = replace(
        FULL, name="decay", budget=replace(FULL.budget, lr_schedule="cosine"), with_long=False
    )
    mode.sections.clear()
    mode.sections.update(_sections())
    return mode


def ordered(mode: Mode, sections: tuple[str, ...]) -> list[RunSpec]:
    """Each run once, the longest first, so that two processes end together."""
    seen: dict[str, RunSpec] = {}
    for name in SECTIONS:
        if name in sections:
            for spec in mode.sections[name]:
                seen.setdefault(spec.key, spec)

    def cost(spec: RunSpec) -> float:
        per_step = {"tiny": 1.0, "small": 11.0}[spec.model] * (spec.batch_size or 8) / 8
        steps = spec.steps_per_worker or mode.budget.steps_per_worker
        return per_step * steps * spec.workers * (1.7 if spec.inner_steps == 1 else 1.0)

    return sorted(seen.values(), key=cost, reverse=True)


DECAY = decay_mode()
