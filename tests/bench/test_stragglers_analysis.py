"""The simulator straggler benchmark's arithmetic (bench/stragglers.py): its table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import stragglers


def test_time_to_a_target_interpolates_between_evaluations() -> None:
    points = [(0.0, 5.0), (10.0, 3.0), (20.0, 2.0)]
    assert stragglers.time_to(points, 4.0) == pytest.approx(5.0)
    assert stragglers.time_to(points, 5.0) == 0.0
    assert stragglers.time_to(points, 1.0) is None


def test_compute_shares_split_stragglers_from_the_others() -> None:
    summary = {"compute_fraction_per_worker": [0.3, 0.5, 0.97, 0.99, 0.95]}
    assert stragglers.compute_shares(summary, 2) == (0.95, 0.3)
    assert stragglers.compute_shares(summary, 0) == (0.3, None)


def test_verdicts_and_ratios() -> None:
    assert stragglers.ratio(3.0, 6.0) == 0.5 and stragglers.ratio(None, 6.0) is None
    assert stragglers.verdict(0.5, 0.6) == "met" and stragglers.verdict(0.7, 0.6) == "MISSED"
    assert stragglers.verdict(0.95, 0.9, below=False) == "met"
    assert stragglers.verdict(None, 0.6) == "not reached"


def test_every_run_is_a_simulate_command_with_its_stragglers() -> None:
    grid = stragglers.Grid(
        workers=8, rounds=40, inner_steps=10, eval_every=4, topology="1peer", seed=0
    )
    runs = {r.name: r for r in stragglers.runs()}
    argv = runs["gasloc-3x+10x"].argv(grid, 500_000)
    assert argv[0] == "simulate" and "--overlap" in argv and "--adapt-codec" in argv
    # fp16 transfer of a straggler = FAST_SHARE × T / fraction = ratio × T
    fractions = [float(argv[i + 1].split(":")[1]) for i, a in enumerate(argv) if a == "--straggler"]
    assert fractions == pytest.approx([stragglers.FAST_SHARE / 3, stragglers.FAST_SHARE / 10])
    diloco = runs["diloco-10x"].argv(grid, 500_000)
    assert "--overlap" not in diloco and diloco[diloco.index("--topology") + 1] == "complete"


def test_equal_token_runs_fix_h_and_compare_seed_by_seed() -> None:
    grid = stragglers.Grid(
        workers=6, rounds=20, inner_steps=10, eval_every=4, topology="1peer", seed=0
    )
    runs = {r.name: r for r in stragglers.runs()}
    for name in stragglers.EQUAL:
        for s in stragglers.EQUAL_SEEDS:
            argv = runs[f"{name}-s{s}"].argv(grid, 500_000)
            assert "--adapt-h" not in argv and argv[argv.index("--seed") + 1] == str(s)
    results = {
        f"{name}-s{s}": {"final_val_loss": 2.0 + 0.01 * k + 0.001 * s, "tokens_per_worker": 100}
        for k, name in enumerate(stragglers.EQUAL)
        for s in (0, 1)
    }
    rows = {r["run"]: r for r in stragglers.equal_tokens(results)}
    assert rows["sequential-fp16"]["delta"] == 0.0 and rows["overlap-fp16"]["seeds"] == 2
    assert rows["overlap-fp16"]["delta"] == pytest.approx(0.01)
    # overlap under --gossip direct is measured against sequential direct gossip
    k = list(stragglers.EQUAL).index
    assert rows["overlap-direct"]["against"] == "sequential-direct"
    assert rows["overlap-direct"]["delta"] == pytest.approx(
        0.01 * (k("overlap-direct") - k("sequential-direct"))
    )
    assert "--gossip" in runs["overlap-direct-s0"].argv(grid, 500_000)
    assert "--gossip" not in runs["overlap-fp16-s0"].argv(grid, 500_000)
    fast, normal = (
        runs[n].argv(grid, 500_000) for n in ("overlap-fp16-fast-link-s0", "overlap-fp16-s0")
    )
    rate = [float(a[a.index("--bandwidth") + 1]) for a in (fast, normal)]
    assert rate[0] == pytest.approx(100 * rate[1], rel=1e-5)  # lands after the first step
    results["overlap-fp16-s1"]["tokens_per_worker"] = 110  # filled steps: no longer equal
    with pytest.raises(ValueError, match="tokens"):
        stragglers.equal_tokens(results)


def test_a_partial_rerun_names_each_runs_commit() -> None:
    assert stragglers._commits({"commits": {"a": "abc", "b": "abc"}}) == "abc"
    mixed = stragglers._commits({"commits": {"a": "abc", "b": "def", "c": "abc"}})
    assert mixed == "abc (a, c); def (b)"
    runs = {r.name: r for r in stragglers.runs()}
    grid = stragglers.Grid(
        workers=6, rounds=20, inner_steps=10, eval_every=4, topology="1peer", seed=0
    )
    longer = runs["gasloc-3x"].argv(grid, 500_000)
    assert longer[longer.index("--rounds") + 1] == str(20 * stragglers.LONGER)
    diloco = runs["diloco-3x"].argv(grid, 500_000)
    assert diloco[diloco.index("--rounds") + 1] == "20"


def _summary(final: float, curve: list[tuple[float, float]]) -> dict[str, object]:
    return {
        "final_val_loss": final,
        "val_loss_curve": [{"wall_clock_s": t, "val_loss": v} for t, v in curve],
        "compute_fraction_per_worker": [0.5, 0.95, 0.97],
        "bytes_sent_per_worker": [1, 2, 3],
    }


def test_fair_schedules_put_diloco_and_gasloc_on_one_lr_schedule() -> None:
    """The time to DiLoCo's final loss compares runs on one schedule: each fair scenario
    pair shares it (DiLoCo's budget of inner steps, or a constant LR), and the table of a
    schedule reads only that schedule's runs."""
    grid = stragglers.Grid(
        workers=6, rounds=20, inner_steps=10, eval_every=4, topology="1peer", seed=0
    )
    runs = {r.name: r for r in stragglers.runs()}
    for tag in stragglers.SCENARIOS:
        own = runs[f"gasloc-{tag}"].argv(grid, 500_000)
        assert "--lr-schedule" not in own and "--total-steps" not in own
        for algo in ("gasloc", "diloco"):
            shared = runs[f"{algo}-{tag}@shared"].argv(grid, 500_000)
            assert shared[shared.index("--total-steps") + 1] == "200"
            constant = runs[f"{algo}-{tag}@constant"].argv(grid, 500_000)
            assert constant[constant.index("--lr-schedule") + 1] == "constant"
            assert "--total-steps" not in constant
    results = {}
    for tag in stragglers.SCENARIOS:  # own: DiLoCo 3.0 reached at 40 s; constant: 2.0 at 20 s
        results[f"diloco-{tag}"] = _summary(3.0, [(10.0, 3.5), (40.0, 3.0)])
        results[f"gasloc-{tag}"] = _summary(2.5, [(10.0, 3.0), (30.0, 2.5)])
        results[f"diloco-{tag}@constant"] = _summary(2.0, [(10.0, 2.5), (20.0, 2.0)])
        results[f"gasloc-{tag}@constant"] = _summary(1.9, [(10.0, 2.0), (30.0, 1.9)])
    results["gasloc-none"] = _summary(2.5, [(10.0, 3.0), (30.0, 2.5)])
    results["gasloc-none@constant"] = _summary(1.9, [(10.0, 2.0), (20.0, 1.9)])
    own = stragglers.analyse(results, "own")
    constant = stragglers.analyse(results, "constant")
    assert [r["vs_diloco"] for r in own] == pytest.approx([10.0 / 40.0] * 4)
    assert [r["vs_diloco"] for r in constant] == pytest.approx([10.0 / 20.0] * 4)
    assert [r["vs_no_straggler"] for r in constant] == pytest.approx([30.0 / 20.0] * 4)
    assert stragglers.analyse(results, "shared") == []  # not run: no table
