"""The inner learning rate: warm-up, then constant or a decay to a floor over a budget that
a bounded run derives from its rounds; and a simulation that reruns bit for bit."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from gaslocd.cli import main, parse
from gaslocd.cli.configs import train_config
from gaslocd.config import TrainConfig
from gaslocd.train.inner import lr_factor


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_a_decay_warms_up_then_falls_to_its_floor_and_stays(schedule: str) -> None:
    cfg = TrainConfig(warmup_steps=10, lr_schedule=schedule, total_steps=110, lr_floor=0.1)
    factors = [lr_factor(cfg, step) for step in range(200)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    after = factors[9:111]
    assert all(a >= b for a, b in itertools.pairwise(after))  # never rises
    assert factors[60] == pytest.approx(0.55)  # halfway: the mean of 1 and the floor
    assert factors[110:] == [pytest.approx(0.1)] * 90


def test_constant_is_what_it_was() -> None:
    cfg = TrainConfig(warmup_steps=4)
    assert [lr_factor(cfg, s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("argv", "schedule", "total"),
    [
        (["simulate", "--rounds", "10", "--inner-steps", "20"], "cosine", 200),
        (["start", "--max-rounds", "40"], "cosine", 40 * 30),
        (["start"], "constant", None),  # runs until stopped: nothing to decay over
        (["start", "--max-rounds", "1"], "constant", 30),  # within the warm-up
        (["start", "--total-steps", "500", "--lr-schedule", "linear"], "linear", 500),
    ],
)
def test_auto_decays_over_a_bounded_runs_budget(
    argv: list[str], schedule: str, total: int | None
) -> None:
    cfg = train_config(parse(argv, env={})[1])
    assert (cfg.lr_schedule, cfg.total_steps) == (schedule, total)


def test_a_decay_without_a_budget_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", "--lr-schedule", "cosine"]) == 2
    assert "needs --total-steps" in capsys.readouterr().err


@pytest.mark.slow
def test_the_same_simulation_twice_gives_the_same_summary(tmp_path: Path) -> None:
    argv = ["simulate", "--workers", "4", "--rounds", "5", "--inner-steps", "4", "--seq-len"]
    argv += ["32", "--batch-size", "4", "--topology", "2peer", "--adapt-h", "--straggler"]
    argv += ["0:0.2", "--step-time", "0.3", "--message-bytes", "50000000"]
    runs = []
    for k in range(2):
        assert main([*argv, "--json", str(tmp_path / f"{k}.json")]) == 0
        summary = json.loads((tmp_path / f"{k}.json").read_text())
        del summary["real_elapsed_s"], summary["args"]["json"]
        runs.append(summary)
    assert runs[0]["rounds"][-1]["mixing_matrix"]  # the comparison covers W per round
    assert not math.isnan(runs[0]["final_val_loss"])
    assert runs[0] == runs[1]
