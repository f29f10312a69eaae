"""The H policy: slow links and slow workers take fewer steps; nobody idles."""

from __future__ import annotations

import pytest

from gaslocd.algorithm.hpolicy import choose_inner_steps, target_round_time


def test_target_uses_medians_so_one_straggler_does_not_move_it() -> None:
    steps = [0.1] * 7 + [5.0]
    transfers = [1.0] * 7 + [100.0]
    assert target_round_time(30, steps, transfers) == pytest.approx(30 * 0.1 + 1.0)


def test_equal_workers_keep_h_base() -> None:
    target = target_round_time(30, [0.1] * 8, [1.0] * 8)
    assert choose_inner_steps(target, 1.0, 0.1, 1, 120) == 30


def test_slow_link_and_slow_gpu_take_fewer_steps_and_finish_on_time() -> None:
    target = target_round_time(30, [0.1] * 8, [1.0] * 8)  # 4 s
    slow_link = choose_inner_steps(target, 2.5, 0.1, 1, 120)
    assert slow_link == 15
    assert slow_link * 0.1 + 2.5 == pytest.approx(target)
    slow_gpu = choose_inner_steps(target, 1.0, 0.2, 1, 120)
    assert slow_gpu == 15
    fast_gpu = choose_inner_steps(target, 1.0, 0.05, 1, 120)
    assert fast_gpu == 60


def test_clamped_to_bounds() -> None:
    assert choose_inner_steps(1.0, 50.0, 0.1, 1, 120) == 1
    assert choose_inner_steps(1000.0, 0.0, 0.1, 1, 120) == 120


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((4.0, 1.0, 0.0, 1, 10), "step time"),
        ((4.0, float("nan"), 0.1, 1, 10), "finite"),
        ((4.0, 1.0, 0.1, 5, 2), "h_min"),
    ],
)
def test_bad_measurements_are_refused(
    args: tuple[float, float, float, int, int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        choose_inner_steps(*args)


def test_target_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        target_round_time(30, [], [])
    with pytest.raises(ValueError, match="transfer"):
        target_round_time(30, [0.1], [-1.0])
