"""What the bench runs: one spec per simulated run, grouped by the paper's claims.

Every run of a mode trains the same number of inner steps per worker (a fixed token
budget: steps × batch × seq_len), so H=1 runs do many short rounds and H=60 runs few long
ones. Seeds fix the initial model, the data streams, the pairings (run id ``sim-<seed>``)
and the held-out batches.

Runs use the daemon's round (``gaslocd.sim``): exchange deadlines, filling the wait and
resyncs make even a fixed-H gossip run depend on its network, so the straggler section
trains GASLoC on the straggler's network, fixed H and adaptive alike. DiLoCo (a barrier
all-reduce with a fixed H) trains the same models on any network: its homogeneous run is
re-timed (``gaslocd.sim.replay``, which checks that every round would be the same).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

OUTER_DEFAULTS = {"gasloc": (0.7, 0.9), "diloco": (0.7, 0.9), "dadam": (1.0, 0.0)}
OUTER_DEFAULTS["local-dadam"] = OUTER_DEFAULTS["dadam"]


@dataclass(frozen=True)
class Budget:
    """Training settings shared by every run of a mode."""

    steps_per_worker: int
    batch_size: int
    seq_len: int
    eval_batches: int
    inner_lr: float
    warmup_steps: int
    evals_per_run: int  # validation points per run (about; at least one per round for H>=30)
    # The inner LR after the warm-up: constant, or a decay to lr_floor × inner_lr at the
    # run's last step (its rounds × H). The grids before issue 17 ran constant.
    lr_schedule: str = "constant"
    lr_floor: float = 0.1

    @property
    def tokens_per_worker(self) -> int:
        return self.steps_per_worker * self.batch_size * self.seq_len

    def rounds(self, inner_steps: int, scale: int = 1) -> int:
        return max(1, scale * self.steps_per_worker // inner_steps)

    def eval_every(self, inner_steps: int, scale: int = 1) -> int:
        return max(1, self.rounds(inner_steps, scale) // self.evals_per_run)


@dataclass(frozen=True)
class Network:
    """The simulated network every run is timed on (the math never depends on it)."""

    step_time_s: float
    message_bytes: int
    bandwidth_mbps: float
    latency_ms: float


# A 134M-parameter model (the paper's small one) sent as 16-bit values, a 0.4 s GPU step
# and 1 Gbit/s access links: 30 steps (12 s) outweigh one exchange (2.1 s) by ~6×.
PAPER_NETWORK = Network(
    step_time_s=0.4, message_bytes=134_000_000 * 2, bandwidth_mbps=1000.0, latency_ms=10.0
)


@dataclass(frozen=True)
class RunSpec:
    """One simulated run. ``straggler``: worker 0's share of the bandwidth (None: all equal)."""

    algo: str
    topology: str
    inner_steps: int
    workers: int
    seed: int
    outer_lr: float | None = None  # None: the algorithm's default (OUTER_DEFAULTS)
    outer_momentum: float | None = None
    codec: str = "fp32"
    adapt_h: bool = False
    straggler: float | None = None
    budget_scale: int = 1  # × the mode's steps per worker (a longer horizon, same H)
    # Overrides of the mode's budget (the noise-scale study): a bigger batch (less gradient
    # noise per step), another model, fewer steps per worker (a bigger model's budget).
    batch_size: int | None = None
    model: str = "tiny"
    steps_per_worker: int | None = None
    inner_lr: float | None = None  # the peak inner LR (a decayed schedule's own optimum)
    gossip: str = "momentum"  # OuterConfig.gossip: "direct" is issue 17's variant

    @property
    def outer(self) -> tuple[float, float]:
        lr, mom = OUTER_DEFAULTS[self.algo]
        return (
            lr if self.outer_lr is None else self.outer_lr,
            mom if self.outer_momentum is None else self.outer_momentum,
        )

    @property
    def method(self) -> str:
        """The method's name as the paper writes it (no H, workers or seed)."""
        name = {"gasloc": "GASLoC", "diloco": "DiLoCo", "dadam": "DAdam"}.get(
            self.algo, "Local-DAdam"
        )
        if self.algo != "diloco":
            name += f"-{self.topology}"
        if self.adapt_h:
            name += " +adapt-H"
        if self.gossip != "momentum":
            name += f" ({self.gossip} gossip)"
        return name

    @property
    def label(self) -> str:
        """The method's name, and the horizon when it is not the mode's budget."""
        return self.method + ("" if self.budget_scale == 1 else f" ({self.budget_scale}× rounds)")

    @property
    def key(self) -> str:
        """File-name-safe identity: two specs with the same key are the same run."""
        lr, mom = self.outer
        parts = [
            self.algo,
            self.topology,
            f"H{self.inner_steps}",
            f"n{self.workers}",
            f"s{self.seed}",
            f"lr{lr:g}",
            f"m{mom:g}",
            self.codec,
        ]
        if self.adapt_h:
            parts.append("adapt")
        if self.straggler is not None:
            parts.append(f"strag{self.straggler:g}")
        if self.budget_scale != 1:
            parts.append(f"x{self.budget_scale}")
        if self.model != "tiny":
            parts.append(self.model)
        if self.batch_size is not None:
            parts.append(f"b{self.batch_size}")
        if self.steps_per_worker is not None:
            parts.append(f"st{self.steps_per_worker}")
        if self.inner_lr is not None:
            parts.append(f"ilr{self.inner_lr:g}")
        if self.gossip != "momentum":
            parts.append(f"g{self.gossip}")
        return "_".join(parts)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # Fields at their defaults are left out: files of runs from before they existed
        # still match their specs.
        for name, default in _SPEC_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        return d


_SPEC_DEFAULTS = {
    "budget_scale": 1,
    "batch_size": None,
    "model": "tiny",
    "steps_per_worker": None,
    "inner_lr": None,
    "gossip": "momentum",
}


def _gasloc(topology: str, h: int, n: int, seed: int, **kw: Any) -> RunSpec:
    return RunSpec("gasloc", topology, h, n, seed, **kw)


def _diloco(h: int, n: int, seed: int, **kw: Any) -> RunSpec:
    return RunSpec("diloco", "complete", h, n, seed, **kw)


@dataclass(frozen=True)
class Mode:
    """A whole grid: the budget, the sizes, and which seeds go where."""

    name: str
    budget: Budget
    network: Network
    h1_workers: int
    h1_outer: tuple[tuple[float, float], ...]  # (η, μ) tried for GASLoC at H=1, default first
    workers: tuple[int, ...]  # worker counts of the H=h_main comparison
    single_seed_workers: tuple[int, ...]  # counts run with the first seed only (time)
    h_main: int
    h_sweep: tuple[int, ...]
    long_scale: int  # the "long" section: the H=h_main comparison with this × the budget
    outer_lrs: tuple[float, ...]
    outer_momenta: tuple[float, ...]
    codecs: tuple[str, ...]
    straggler_fractions: tuple[float, ...]
    seeds: tuple[int, ...]
    methods: tuple[str, ...] = ()  # non-empty: a slice that runs only these methods
    with_long: bool = True  # the 2× horizon sections ("long", "straggler_long")
    sections: dict[str, list[RunSpec]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        s0 = self.seeds[0]
        n8, h = self.h1_workers, self.h_main
        # H=1: DiLoCo's η=0.7, μ=0.9 on top of every single AdamW step multiplies the step
        # by up to η/(1−μ) = 7, so GASLoC's outer settings are tuned here (seed 0, 1peer)
        # and the best is then run on every seed: see tuned_h1().
        h1_tune = [
            _gasloc("1peer", 1, n8, s0, outer_lr=lr, outer_momentum=mom)
            for lr, mom in self.h1_outer
        ]
        h1 = [
            _gasloc("2peer", 1, n8, s0),
            *(
                RunSpec("dadam", t, 1, n8, seed)
                for seed in self.seeds
                for t in ("1peer", "2peer", "ring", "complete")
            ),
        ]
        main = []
        for n in self.workers:
            seeds = self.seeds[:1] if n in self.single_seed_workers else self.seeds
            for seed in seeds:
                main += [
                    _gasloc("1peer", h, n, seed),
                    _gasloc("2peer", h, n, seed),
                    _diloco(h, n, seed),
                    RunSpec("local-dadam", "2peer", h, n, seed),
                ]
                if n == n8:
                    main.append(RunSpec("local-dadam", "1peer", h, n, seed))
        straggler = [
            _gasloc(topology, h, n8, seed, adapt_h=adapt, straggler=f)
            for f in self.straggler_fractions
            for seed in self.seeds
            for topology, adapt in (("1peer", True), ("1peer", False), ("2peer", False))
        ]
        straggler += [
            _gasloc("2peer", h, n8, s0, adapt_h=True, straggler=f) for f in self.straggler_fractions
        ]
        # The same with a longer horizon (seed 0); DiLoCo's comes from "long", re-timed.
        straggler_long = [
            _gasloc("1peer", h, n8, s0, adapt_h=adapt, straggler=f, budget_scale=self.long_scale)
            for f in self.straggler_fractions
            for adapt in (True, False)
        ]
        outer = [
            make(h, n8, s0, outer_lr=lr, outer_momentum=mom)
            for make in (lambda *a, **k: _gasloc("1peer", *a, **k), _diloco)
            for lr in self.outer_lrs
            for mom in self.outer_momenta
        ]
        h_sweep = [
            make(hh, n8, s0)
            for make in (
                lambda *a, **k: _gasloc("1peer", *a, **k),
                _diloco,
                lambda *a, **k: RunSpec("local-dadam", "2peer", *a, **k),
            )
            for hh in self.h_sweep
        ]
        # Does the ranking at H=h_main change with more rounds? (16 rounds is short for an
        # outer momentum of 0.9, whose memory is ~10 rounds.)
        long = [
            spec
            for spec in main
            if spec.workers == n8 and spec.seed == s0 and spec.method != "Local-DAdam-1peer"
        ]
        long = [replace(spec, budget_scale=self.long_scale) for spec in long]
        codec = [_gasloc("1peer", h, n8, s0, codec=c) for c in self.codecs]
        # Why does GASLoC-1peer get worse with more, shorter rounds (small H)? Suspects: its
        # outer momentum also accumulates the consensus gap θ_i − θ_j, which points at a new
        # random partner every round (a fixed ring keeps it coherent, 2peer averages two),
        # or the outer setting itself (a smaller μ; DiLoCo's own H sweep tells which).
        h_low = min(self.h_sweep)
        diagnose = [
            _gasloc("ring", h_low, n8, s0),
            _gasloc("2peer", h_low, n8, s0),
            _gasloc("1peer", h_low, n8, s0, outer_lr=0.5, outer_momentum=0.5),
            RunSpec("local-dadam", "1peer", h_low, n8, s0),
        ]
        if not self.with_long:
            long, straggler_long = [], []
        self.sections.update(
            h1_tune=h1_tune,
            h1=h1,
            main=main,
            long=long,
            straggler=straggler,
            straggler_long=straggler_long,
            outer=outer,
            h_sweep=h_sweep,
            codec=codec,
            diagnose=diagnose,
        )
        if self.methods:  # a slice of the grid: only these methods, in every section
            for name, specs in self.sections.items():
                self.sections[name] = [s for s in specs if s.method in self.methods]

    def tuned_h1(self, outer: tuple[float, float]) -> list[RunSpec]:
        """GASLoC-1peer and -2peer at H=1 with the tuned (η, μ), on every seed."""
        lr, mom = outer
        return [
            _gasloc(t, 1, self.h1_workers, seed, outer_lr=lr, outer_momentum=mom)
            for seed in self.seeds
            for t in ("1peer", "2peer")
        ]

    def all_runs(self, sections: tuple[str, ...] | None = None) -> list[RunSpec]:
        """Each distinct run once, the biggest worker counts last ("h1" includes its tuning)."""
        wanted = set(self.sections if sections is None else sections)
        if "h1" in wanted:
            wanted.add("h1_tune")
        seen: dict[str, RunSpec] = {}
        for name, specs in self.sections.items():
            if name in wanted:
                for spec in specs:
                    seen.setdefault(spec.key, spec)
        return sorted(seen.values(), key=lambda s: s.workers)


FULL = Mode(
    name="full",
    budget=Budget(
        steps_per_worker=480,
        batch_size=8,
        seq_len=64,
        eval_batches=8,
        inner_lr=3e-3,
        warmup_steps=30,
        evals_per_run=16,
    ),
    network=PAPER_NETWORK,
    h1_workers=8,
    h1_outer=((0.7, 0.9), (0.5, 0.5), (1.0, 0.5)),
    workers=(8, 16, 32),
    single_seed_workers=(32,),
    h_main=30,
    h_sweep=(5, 10, 30, 60),
    long_scale=2,
    outer_lrs=(0.4, 0.7, 1.0),
    outer_momenta=(0.7, 0.9),
    codecs=("fp32", "fp16", "bf16", "int8"),
    straggler_fractions=(0.1, 0.2),
    seeds=(0, 1),
)

QUICK = replace(
    FULL,
    name="quick",
    budget=Budget(
        steps_per_worker=40,
        batch_size=4,
        seq_len=32,
        eval_batches=2,
        inner_lr=3e-3,
        warmup_steps=5,
        evals_per_run=4,
    ),
    h1_workers=4,
    h1_outer=((0.7, 0.9), (0.5, 0.5)),
    workers=(4, 8),
    single_seed_workers=(8,),
    h_main=10,
    h_sweep=(5, 10, 20),
    outer_lrs=(0.7, 1.0),
    outer_momenta=(0.9,),
    codecs=("fp32", "int8"),
    seeds=(0,),
)

# The re-run with the daemon's round (issue "one protocol, two clocks"): the H=30 grid
# (8 and 16 workers on seeds 0 and 1, 32 workers on seed 0) and the straggler scenarios
# (8 workers, 10% / 20% bandwidth, seeds 0 and 1), GASLoC (fixed and adaptive H), DiLoCo and
# Local-DAdam. 36 runs, about 50 min with --jobs 2 on two cores.
SHARED = replace(
    FULL,
    name="shared",
    methods=(
        "GASLoC-1peer",
        "GASLoC-2peer",
        "DiLoCo",
        "Local-DAdam-2peer",
        "Local-DAdam-1peer",
        "GASLoC-1peer +adapt-H",
        "GASLoC-2peer +adapt-H",
    ),
    with_long=False,
)

MODES = {"full": FULL, "quick": QUICK, "shared": SHARED}
