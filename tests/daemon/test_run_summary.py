"""One summary type for simulate, a daemon and demo: it survives JSON, and demo adds up
its daemons' time accounts."""

from __future__ import annotations

import json

import pytest

from gaslocd.daemon.demo import aggregate
from gaslocd.protocol.account import ACTIVITIES
from gaslocd.sim.summary import RunSummary


def _daemon(peer: str, began: float, train_s: float, wait_s: float, loss: float) -> RunSummary:
    return RunSummary(
        kind="daemon",
        wall_clock_kind="real",
        final_val_loss=loss,
        val_loss_curve=[
            {"round": 1, "wall_clock_s": 1.0, "unix_time": began + 1.0, "val_loss": loss + 1},
            {"round": 2, "wall_clock_s": 2.0, "unix_time": began + 2.5, "val_loss": loss},
        ],
        consensus_curve=[{"round": 2, "consensus": 0.5}],
        train_loss_curve=[{"round": 2, "train_loss": loss}],
        wall_clock_s=train_s + wait_s,
        bytes_sent_per_worker=[100],
        time={"train": train_s, "wait_ready": wait_s},
        args={},
        extra={"peer_id": peer},
    )


def test_a_summary_reads_back_what_it_wrote() -> None:
    written = _daemon("p1", 1000.0, 3.0, 1.0, 2.0).to_json()
    assert written["idle_fraction"] == pytest.approx(0.25)
    assert written["training_share"] == pytest.approx(0.75)
    assert written["peer_id"] == "p1"  # extras sit beside the common keys
    again = RunSummary.from_json(json.loads(json.dumps(written)))
    assert again.to_json() == written


@pytest.mark.parametrize("bad", [{}, {"schema_version": 1, "kind": "daemon"}])
def test_what_is_not_a_whole_summary_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="summary"):
        RunSummary.from_json(bad)


def test_demo_adds_up_its_daemons_and_skips_one_that_wrote_nothing() -> None:
    began = 1000.0
    runs = [_daemon("p1", began, 3.0, 1.0, 2.0), None, _daemon("p2", began, 1.0, 3.0, 3.0)]
    demo = aggregate(runs, began, {"workers": 3}, "demo-x").to_json()
    assert demo["kind"] == "demo" and demo["run_id"] == "demo-x"
    assert demo["workers_reporting"] == 2
    assert demo["final_val_loss"] == pytest.approx(2.5)
    assert demo["time"] == {a: {"train": 4.0, "wait_ready": 4.0}.get(a, 0.0) for a in ACTIVITIES}
    assert demo["idle_fraction"] == pytest.approx(0.5)  # all daemons' time, not a mean
    assert demo["idle_fraction_per_worker"] == pytest.approx([0.25, 0.75])
    # the curve's clock starts at the demo's start; a round counts once every daemon has it
    assert [p["wall_clock_s"] for p in demo["val_loss_curve"]] == [1.0, 2.5]
