"""The decay grid of the paper bench (issue 17): a micro version trains every section and
writes every verdict, table and plot; its runs decay the inner LR and carry the overrides
(batch, model, steps) into the simulator and into their ``gaslocd simulate`` line."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gaslocd.train.data import Corpus

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import paper  # noqa: E402
from paperlib import execute  # noqa: E402
from paperlib.decay import Plan, decay_mode  # noqa: E402
from paperlib.grid import FULL, QUICK, Budget  # noqa: E402

pytestmark = pytest.mark.slow

PLAN = Plan(
    h=2,
    workers=(4, 6),
    outer_lrs=(0.7, 1.0),
    outer_momenta=(0.9,),
    h1_momenta=(0.0, 0.2),
    big_batch=4,
    big_model_steps=2,
    noise_workers=4,
    peak_lrs=(6e-3,),
)
BUDGET = Budget(
    steps_per_worker=4, batch_size=2, seq_len=16, eval_batches=1, inner_lr=3e-3,
    warmup_steps=1, evals_per_run=2,
)  # fmt: skip
MICRO = decay_mode(PLAN, base=replace(QUICK, budget=BUDGET), name="micro_decay")


def test_the_decay_grid_trains_with_a_decayed_lr_and_the_overrides() -> None:
    small = PLAN.noise("2peer", {"model": "small", "steps_per_worker": 2})
    _, train, sim = execute.configs(small, MICRO.budget, MICRO.network)
    assert (train.model, train.lr_schedule, train.total_steps, sim.rounds) == (
        "small", "cosine", 2, 1,
    )  # fmt: skip
    line = execute.cli_command(small, MICRO.budget, MICRO.network)
    assert "--model small" in line and "--lr-schedule cosine --lr-floor 0.1" in line
    variant = PLAN.spec("2peer", 2, 4, 0, gossip="direct")
    algo, _, _ = execute.configs(variant, MICRO.budget, MICRO.network)
    assert algo.outer.gossip == "direct" and variant.key.endswith("_gdirect")
    assert "--gossip direct" in execute.cli_command(variant, MICRO.budget, MICRO.network)
    assert small.key.endswith("_small_st2")
    # The earlier grids' files keep matching their specs: nothing new in their identity.
    plain = FULL.sections["main"][0]
    ident = execute._identity(plain, FULL.budget, FULL.network)
    assert "lr_schedule" not in ident["budget"] and "model" not in ident["spec"]


def test_a_micro_decay_grid_writes_every_verdict_table_and_plot(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(execute, "_corpus", corpus)
    md = paper.run(MICRO, out=tmp_path, jobs=1, log=lambda _: None)
    text = md.read_text()
    assert md.name == "paper_micro_decay.md"
    for line in (
        "**Claim (2), H=2 with a cosine decay:",
        "**Claim (1), H=1 with a cosine",
        "**Noise scale (seed 0 only):**",
        "Best per method: GASLoC-2peer",
        "**Schedule and peak LR (seed 0):** no constant-LR twins",
        "**Variant `--gossip direct`",
        "**At the outer setting best for DiLoCo",
    ):
        assert line in text
    assert "incomplete" not in text
    # Every run is in its table (the main table's constant-LR twins live in paper_shared/,
    # absent here, as in the last table, and DiLoCo has no gap to itself: those cells
    # alone read "—").
    middle = text.split("## The outer settings")[1].split("## The schedule")[0]
    assert "| — |" not in middle and "| — |" not in text.split("## A variant")[1]
    files = list((tmp_path / "paper_micro_decay").glob("*_*.json"))
    assert len(files) == len({s.key for specs in MICRO.sections.values() for s in specs})
    small = json.loads(next(p for p in files if "small" in p.name).read_text())
    assert small["tokens_per_worker"] == 2 * 2 * 16  # its own steps, not the budget's
    for png in ("n4", "n6", "outer"):
        assert (tmp_path / f"paper_micro_decay_{png}.png").stat().st_size > 10_000
