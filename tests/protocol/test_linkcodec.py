"""The codec-per-link chooser: the ladder, the transfer time, the choice and its edges."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gaslocd.config import CODECS
from gaslocd.net.codecs import CODEC_NAMES, get_codec
from gaslocd.protocol.linkcodec import (
    FIDELITY,
    LinkChoice,
    choose_codec,
    codec_ladder,
    message_bytes,
    transfer_s,
)

ALL = ("fp32", "fp16", "bf16", "int8", "q4")
N = 1_000_000  # fp32 4 MB, fp16 2 MB, int8 1.004 MB, q4 0.5625 MB


def test_the_chooser_knows_every_codec_the_wire_and_the_config_know() -> None:
    assert set(FIDELITY) == set(CODEC_NAMES) == set(CODECS)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("numel", [0, 1, 2, 63, 64, 65, 1023, 1024, 1025, 100_003, N])
def test_message_bytes_are_the_codecs_own_sizes(name: str, numel: int) -> None:
    assert message_bytes(name, numel) == get_codec(name).encoded_nbytes(numel)


def test_sizes_shrink_down_the_fidelity_order() -> None:
    sizes = [message_bytes(name, N) for name in FIDELITY]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    ("best", "allowed", "ladder"),
    [
        ("fp32", ALL, ("fp32", "fp16", "int8", "q4")),
        ("fp16", ALL, ("fp16", "int8", "q4")),
        ("bf16", ALL, ("bf16", "int8", "q4")),  # fp16 is the same size: no step down
        ("int8", ALL, ("int8", "q4")),
        ("q4", ALL, ("q4",)),
        ("fp32", ("fp32", "bf16", "q4"), ("fp32", "bf16", "q4")),
        ("fp32", ("q4", "fp32"), ("fp32", "q4")),  # order of `allowed` does not matter
        ("fp16", ("fp32", "int8"), ("int8",)),  # best not allowed: start below it
        ("fp32", ("fp32",), ("fp32",)),
    ],
)
def test_codec_ladder(best: str, allowed: tuple[str, ...], ladder: tuple[str, ...]) -> None:
    assert codec_ladder(best, allowed) == ladder


def test_codec_ladder_refuses_unknown_names_and_an_empty_result() -> None:
    with pytest.raises(ValueError, match="unknown codec 'zstd'"):
        codec_ladder("zstd", ALL)
    with pytest.raises(ValueError, match="unknown codec 'lz4'"):
        codec_ladder("fp32", ("fp32", "lz4"))
    with pytest.raises(ValueError, match="no codec"):
        codec_ladder("int8", ("fp32", "fp16"))
    with pytest.raises(ValueError, match="no codec"):
        codec_ladder("fp32", ())


def test_transfer_s() -> None:
    assert transfer_s("fp32", N, 4e6) == pytest.approx(1.0)
    assert transfer_s("fp16", N, 4e6, latency_s=0.25) == pytest.approx(0.75)
    assert transfer_s("q4", 0, 1.0, latency_s=0.1) == pytest.approx(0.1)
    assert transfer_s("int8", N, math.inf, latency_s=0.2) == 0.2
    for rate in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="rate"):
            transfer_s("fp32", N, rate)
    for latency in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="latency"):
            transfer_s("fp32", N, 1e6, latency)
    with pytest.raises(ValueError, match="numel"):
        transfer_s("fp32", -1, 1e6)
    with pytest.raises(ValueError, match="unknown codec"):
        transfer_s("zstd", N, 1e6)


LADDER = codec_ladder("fp32", ALL)  # fp32, fp16, int8, q4


@pytest.mark.parametrize(
    ("rate", "budget", "codec"),
    [
        (4e6, 1.0, "fp32"),  # exactly on budget: fits
        (4e6, 0.99, "fp16"),
        (2e6, 0.99, "int8"),
        (1e6, 0.99, "q4"),  # 0.5625 s
        (1e9, 10.0, "fp32"),
    ],
)
def test_choose_codec_takes_the_most_faithful_that_fits(
    rate: float, budget: float, codec: str
) -> None:
    choice = choose_codec(LADDER, N, rate, budget)
    assert choice == LinkChoice(codec, pytest.approx(transfer_s(codec, N, rate)), True)


def test_when_nothing_fits_the_strongest_is_named_and_the_peer_sits_out() -> None:
    choice = choose_codec(LADDER, N, 1e5, budget_s=1.0)
    assert choice.codec == "q4" and not choice.fits
    assert choice.transfer_s == pytest.approx(5.625)
    for budget in (0.0, -3.0):  # no time left at all
        assert not choose_codec(LADDER, N, 1e9, budget).fits


def test_latency_counts_against_the_budget() -> None:
    assert choose_codec(LADDER, N, 4e6, 1.0).codec == "fp32"
    assert choose_codec(LADDER, N, 4e6, 1.0, latency_s=0.2).codec == "fp16"
    late = choose_codec(LADDER, N, 4e6, 1.0, latency_s=1.5)
    assert late.codec == "q4" and not late.fits  # latency alone misses it


@pytest.mark.parametrize("rate", [None, 0.0, -5.0, math.nan])
def test_an_unmeasured_link_gets_the_best_codec(rate: float | None) -> None:
    assert choose_codec(LADDER, N, rate, budget_s=0.001) == LinkChoice("fp32", None, True)


def test_choose_codec_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="empty"):
        choose_codec((), N, 1e6, 1.0)
    with pytest.raises(ValueError, match="most faithful"):
        choose_codec(("q4", "fp32"), N, 1e6, 1.0)
    with pytest.raises(ValueError, match="unknown codec"):
        choose_codec(("fp32", "zstd"), N, 1e6, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        choose_codec(LADDER, N, 1e6, math.nan)
    with pytest.raises(ValueError, match="latency"):
        choose_codec(LADDER, N, 1e6, 1.0, latency_s=-1.0)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(1.0, 1e10),
    budget=st.floats(-1.0, 100.0),
    latency=st.floats(0.0, 2.0),
    numel=st.integers(0, 10**8),
)
def test_the_choice_fits_and_no_more_faithful_codec_would(
    rate: float, budget: float, latency: float, numel: int
) -> None:
    choice = choose_codec(LADDER, numel, rate, budget, latency)
    assert choice.transfer_s == transfer_s(choice.codec, numel, rate, latency)
    assert choice.fits == (choice.transfer_s <= budget)
    if not choice.fits:
        assert choice.codec == LADDER[-1]
    for better in LADDER[: LADDER.index(choice.codec)]:
        assert transfer_s(better, numel, rate, latency) > budget
