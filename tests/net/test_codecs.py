"""Codecs: sizes, round-trip error bounds, streaming by chunks, and the error-feedback claim."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gaslocd.net.codecs import (
    _Q4,
    CODEC_NAMES,
    INT8_BLOCK,
    ErrorFeedback,
    FeedbackBank,
    chunk_spans,
    get_codec,
    roundtrip,
)
from gaslocd.net.q4 import Q4_BLOCK

# Relative L2 error bounds on standard-normal data. fp16 keeps 11 significant bits
# (≈ 2e-4 measured), bf16 8 bits (≈ 1.7e-3), int8 blockwise ≈ 7.9e-3 with 1024-blocks,
# q4 ≈ 0.108 with 64-blocks (the table in gaslocd/net/q4.py, from bench/codec_error.py).
REL_ERROR_BOUND = {"fp32": 0.0, "fp16": 4e-4, "bf16": 3e-3, "int8": 1.2e-2, "q4": 0.125}
SIZES = [1, 7, INT8_BLOCK - 1, INT8_BLOCK, INT8_BLOCK + 1, 3 * INT8_BLOCK + 5, 100_003]


def _randn(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_unknown_codec_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="fp32, fp16, bf16, int8, q4"):
        get_codec("zstd")
    assert [get_codec(n).name for n in CODEC_NAMES] == list(CODEC_NAMES)


@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("numel", SIZES)
def test_roundtrip_error_is_bounded(name: str, numel: int) -> None:
    codec = get_codec(name)
    x = _randn(numel, seed=numel)
    data = codec.encode(x)
    assert data.dtype == torch.uint8 and data.numel() == codec.encoded_nbytes(numel)
    y = roundtrip(codec, x)
    assert y.dtype == torch.float32 and y.shape == x.shape
    if numel >= 1000:  # the bound is statistical; tiny vectors only check exactness below
        assert _rel_error(y, x) <= REL_ERROR_BOUND[name]
    if name == "fp32":
        assert torch.equal(y, x)


def test_encoded_sizes() -> None:
    n = 10 * INT8_BLOCK + 3
    assert get_codec("fp32").encoded_nbytes(n) == 4 * n
    assert get_codec("fp16").encoded_nbytes(n) == 2 * n
    assert get_codec("bf16").encoded_nbytes(n) == 2 * n
    assert get_codec("int8").encoded_nbytes(n) == n + 4 * 11
    assert get_codec("int8").encoded_nbytes(0) == 0
    # q4: 64-blocks of a float32 scale + 32 bytes; the last block holds 3 values: 4 + 2
    assert get_codec("q4").encoded_nbytes(n) == (n // Q4_BLOCK) * (4 + 32) + 4 + 2
    assert get_codec("q4").encoded_nbytes(Q4_BLOCK) == 36
    assert get_codec("q4").encoded_nbytes(0) == 0


@settings(max_examples=40, deadline=None)
@given(numel=st.integers(1, 5000), scale=st.floats(1e-6, 1e4), seed=st.integers(0, 2**31))
def test_int8_elementwise_error_is_half_a_step_of_its_block(
    numel: int, scale: float, seed: int
) -> None:
    x = _randn(numel, seed) * scale
    y = roundtrip(get_codec("int8"), x)
    for start in range(0, numel, INT8_BLOCK):
        block = x[start : start + INT8_BLOCK]
        half_step = float(block.abs().max()) / 254
        err = (y[start : start + INT8_BLOCK] - block).abs().max()
        assert float(err) <= half_step * (1 + 1e-5) + 1e-30


def test_int8_zero_block_is_exact_and_inf_decodes_to_nan() -> None:
    x = torch.zeros(2 * INT8_BLOCK)
    x[INT8_BLOCK + 3] = float("inf")
    y = roundtrip(get_codec("int8"), x)
    assert torch.equal(y[:INT8_BLOCK], torch.zeros(INT8_BLOCK))
    assert not torch.isfinite(y[INT8_BLOCK:]).all()


@settings(max_examples=40, deadline=None)
@given(numel=st.integers(1, 700), scale=st.floats(1e-6, 1e4), seed=st.integers(0, 2**31))
def test_q4_elementwise_error_is_half_a_step_of_its_block(
    numel: int, scale: float, seed: int
) -> None:
    x = _randn(numel, seed) * scale
    y = roundtrip(get_codec("q4"), x)
    blocks = torch.nn.functional.pad(x, (0, -numel % Q4_BLOCK)).view(-1, Q4_BLOCK)
    half_step = blocks.abs().amax(1) / 14  # levels -7..7: a step is absmax / 7
    err = torch.nn.functional.pad((y - x).abs(), (0, -numel % Q4_BLOCK)).view(-1, Q4_BLOCK)
    assert bool((err.amax(1) <= half_step * (1 + 1e-5) + 1e-30).all())


def test_q4_levels_are_exact_and_the_layout_is_scale_then_low_nibble_first() -> None:
    levels = torch.arange(-7.0, 8.0) * 0.25  # absmax 1.75: a step of exactly 0.25
    x = torch.cat([levels, torch.zeros(Q4_BLOCK - 15), levels[:3]])  # a block and 3 more
    codec = get_codec("q4")
    assert torch.equal(roundtrip(codec, x), x)
    data = codec.encode(x)
    assert data.numel() == 36 + 4 + 2
    assert torch.equal(data[:4].view(torch.float32), torch.tensor([0.25]))
    # codes q + 8: -7 → 1 (low nibble), -6 → 2 (high nibble); 0 → 8
    assert data[4].item() == 1 | 2 << 4 and data[4 + 31].item() == 8 | 8 << 4
    tail = data[36:]
    assert torch.equal(tail[:4].view(torch.float32), torch.tensor([-1.75 / -7]))
    assert tail[4].item() == 1 | 2 << 4 and tail[5].item() == 3 | 8 << 4  # padded with 0


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_q4_non_finite_block_decodes_to_nan_and_leaves_the_others(bad: float) -> None:
    x = _randn(3 * Q4_BLOCK + 5)
    x[Q4_BLOCK + 9] = bad
    y = roundtrip(get_codec("q4"), x)
    assert bool(y[Q4_BLOCK : 2 * Q4_BLOCK].isnan().all())  # refused by the finite check
    others = torch.cat([y[:Q4_BLOCK], y[2 * Q4_BLOCK :]])
    assert bool(torch.isfinite(others).all())


def test_q4_extreme_but_finite_blocks_stay_finite() -> None:
    tiny = torch.full((Q4_BLOCK,), 1e-45)  # subnormal: 7 / absmax overflows, sent as zeros
    huge = 3e38 * torch.linspace(-1.0, 1.0, Q4_BLOCK)
    y = roundtrip(get_codec("q4"), torch.cat([tiny, huge]))
    assert torch.equal(y[:Q4_BLOCK], torch.zeros(Q4_BLOCK))
    assert bool(torch.isfinite(y).all()) and float(y.abs().max()) == pytest.approx(3e38)


def test_q4_block_must_be_even() -> None:
    with pytest.raises(ValueError, match="even"):
        _Q4(33)


def test_fp16_overflow_is_visible_to_the_receiver() -> None:
    y = roundtrip(get_codec("fp16"), torch.tensor([1e6, 1.0]))
    assert not torch.isfinite(y).all()  # refused by the receiver's finite check


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_chunked_encode_and_decode_equal_whole(name: str) -> None:
    codec = get_codec(name)
    numel = 37 * INT8_BLOCK + 11
    x = _randn(numel, 3)
    whole = codec.encode(x)
    chunk_bytes = 5 * codec.encoded_nbytes(INT8_BLOCK) + 3
    spans = chunk_spans(codec, numel, chunk_bytes)
    assert len(spans) > 3 and spans[-1][1] == numel and spans[-1][3] == whole.numel()
    pieces = torch.empty_like(whole)
    decoded = torch.empty(numel)
    for e0, e1, b0, b1 in spans:
        assert e0 % codec.block_elems == 0 and b1 - b0 <= chunk_bytes
        codec.encode_into(x[e0:e1], pieces[b0:b1])
        codec.decode(pieces[b0:b1], decoded[e0:e1])
    assert torch.equal(pieces, whole)
    assert torch.equal(decoded, roundtrip(codec, x))


def test_encode_is_not_a_view_of_the_source() -> None:
    x = _randn(100)
    original = x.clone()
    data = get_codec("fp32").encode(x)
    x.add_(1.0)
    out = torch.empty(100)
    get_codec("fp32").decode(data, out)
    assert torch.equal(out, original)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_decode_refuses_wrong_sizes_and_types(name: str) -> None:
    codec = get_codec(name)
    data = codec.encode(_randn(2000))
    with pytest.raises(ValueError, match="bytes"):
        codec.decode(data[:-1], torch.empty(2000))
    with pytest.raises(ValueError, match="float32"):
        codec.decode(data, torch.empty(2000, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32"):
        codec.encode(torch.zeros(4, 4))


def test_error_feedback_makes_the_running_mean_of_a_fixed_vector_converge() -> None:
    """Gossiping the same vector again and again: with EF the receiver's running mean
    converges to the truth (error ~ residual / rounds); without EF Q(x) − x stays."""
    codec = get_codec("int8")
    x = _randn(5000, 1)
    rounds = 200
    plain = sum(roundtrip(codec, x) for _ in range(rounds)) / rounds
    fb = ErrorFeedback(codec, x.numel())
    with_ef = sum(roundtrip(codec, x, fb) for _ in range(rounds)) / rounds
    bias_plain = float((plain - x).abs().max())
    bias_ef = float((with_ef - x).abs().max())
    assert bias_plain > 0.01  # one int8 half-step of a normal block ≈ 0.013
    assert bias_ef < bias_plain / 50
    # the residual stays bounded by a quantization step: no accumulation
    assert float(fb.residual.abs().max()) <= float(x.abs().max()) / 127


def _gossip_mean_bias(use_ef: bool, rounds: int) -> float:
    """n workers, a fresh random 1-peer matching every round, each worker's θ drifts by a
    small amount below an int8 half-step (like a slow local update), then x_i ← (x_i + q_j)/2.
    Mixing preserves the mean exactly in fp32 (P3), so any gap to it is codec bias."""
    codec = get_codec("int8")
    n, d = 8, 4096
    gen = torch.Generator().manual_seed(2)
    xs = torch.randn(n, d, generator=gen)
    drift = 1e-3 * torch.rand(n, d, generator=gen)
    feedback = [ErrorFeedback(codec, d) if use_ef else None for _ in range(n)]
    exact_mean = xs.mean(0)
    for _ in range(rounds):
        xs += drift
        exact_mean = exact_mean + drift.mean(0)
        sent = torch.stack([roundtrip(codec, xs[i], feedback[i]) for i in range(n)])
        pairs = torch.randperm(n, generator=gen).view(-1, 2).tolist()
        mixed = xs.clone()
        for a, b in pairs:  # partners change every round; the residual stays per sender
            mixed[a] = (xs[a] + sent[b]) / 2
            mixed[b] = (xs[b] + sent[a]) / 2
        xs = mixed
    return float((xs.mean(0) - exact_mean).abs().mean())


def test_error_feedback_keeps_the_network_mean_unbiased_when_partners_change() -> None:
    early_plain, late_plain = _gossip_mean_bias(False, 30), _gossip_mean_bias(False, 150)
    early_ef, late_ef = _gossip_mean_bias(True, 30), _gossip_mean_bias(True, 150)
    assert late_plain > 3 * early_plain  # without EF the bias grows with the rounds
    assert late_ef < 2 * early_ef + 1e-4  # with EF it stays bounded
    assert late_ef < late_plain / 20


@pytest.mark.parametrize("name", ["int8", "q4"])
def test_error_feedback_makes_both_lossy_codecs_converge(name: str) -> None:
    codec, x = get_codec(name), _randn(5000, 6)
    fb = ErrorFeedback(codec, x.numel())
    with_ef = sum(roundtrip(codec, x, fb) for _ in range(100)) / 100
    plain = roundtrip(codec, x)
    assert float((with_ef - x).abs().max()) < float((plain - x).abs().max()) / 20


def test_feedback_bank_keeps_one_residual_per_lossy_codec() -> None:
    bank = FeedbackBank(100)
    assert bank.for_codec("fp32") is None and bank.codecs == ()
    q4 = bank.for_codec("q4")
    assert q4 is not None and q4.codec is get_codec("q4") and q4.numel == 100
    assert bank.for_codec(get_codec("q4")) is q4  # by name or by codec: the same one
    assert bank.for_codec("int8") not in (None, q4)
    assert bank.codecs == ("q4", "int8")
    with pytest.raises(ValueError, match="unknown codec"):
        bank.for_codec("zstd")
    with pytest.raises(ValueError, match="numel"):
        FeedbackBank(-1)


def test_a_codec_per_partner_in_the_same_round_is_unbiased_for_every_partner() -> None:
    """One sender, the same θ̃ every round, two partners: one gets int8, one q4, each
    round. Each partner's running mean converges to θ̃, because each codec's stream has
    its own residual (a shared one would take θ̃ in twice a round)."""
    x = _randn(5000, 7)
    bank, rounds = FeedbackBank(x.numel()), 100
    got = {name: torch.zeros_like(x) for name in ("int8", "q4")}
    for _ in range(rounds):
        for name in got:
            got[name] += roundtrip(get_codec(name), x, bank.for_codec(name))
    for name, total in got.items():
        one = float((roundtrip(get_codec(name), x) - x).abs().max())
        assert float((total / rounds - x).abs().max()) < one / 20, name


def _switching_gossip_bias(use_ef: bool, rounds: int) -> float:
    """As _gossip_mean_bias, but each message's codec is drawn per link and round from
    (int8, q4): residuals per codec keep the network mean's bias bounded."""
    n, d, names = 8, 4096, ("int8", "q4")
    gen = torch.Generator().manual_seed(2)
    xs = torch.randn(n, d, generator=gen)
    drift = 1e-3 * torch.rand(n, d, generator=gen)
    banks = [FeedbackBank(d) for _ in range(n)]
    exact_mean = xs.mean(0)
    for _ in range(rounds):
        xs += drift
        exact_mean = exact_mean + drift.mean(0)
        sent = []
        for i in range(n):
            name = names[int(torch.randint(2, (1,), generator=gen))]
            sent.append(
                roundtrip(get_codec(name), xs[i], banks[i].for_codec(name) if use_ef else None)
            )
        pairs = torch.randperm(n, generator=gen).view(-1, 2).tolist()
        mixed = xs.clone()
        for a, b in pairs:
            mixed[a] = (xs[a] + sent[b]) / 2
            mixed[b] = (xs[b] + sent[a]) / 2
        xs = mixed
    return float((xs.mean(0) - exact_mean).abs().mean())


def test_per_codec_feedback_keeps_the_mean_unbiased_when_codecs_switch() -> None:
    early_plain, late_plain = _switching_gossip_bias(False, 30), _switching_gossip_bias(False, 150)
    early_ef, late_ef = _switching_gossip_bias(True, 30), _switching_gossip_bias(True, 150)
    assert late_plain > 1.5 * early_plain  # without EF the bias grows with the rounds
    assert late_ef < 1.5 * early_ef + 1e-3  # with EF it stays bounded
    assert late_ef < late_plain / 5


def test_error_feedback_on_a_lossless_codec_keeps_no_residual() -> None:
    fb = ErrorFeedback(get_codec("fp32"), 10)
    assert fb.residual.numel() == 0
    x = _randn(10)
    assert torch.equal(roundtrip(get_codec("fp32"), x, fb), x)


def test_error_feedback_chunked_equals_whole() -> None:
    codec, numel = get_codec("int8"), 5 * INT8_BLOCK + 17
    x = _randn(numel, 4)
    a, b = ErrorFeedback(codec, numel), ErrorFeedback(codec, numel)
    for _ in range(3):
        whole = a.encode(x)
        pieces = torch.empty_like(whole)
        for e0, e1, b0, b1 in chunk_spans(codec, numel, 2 * (INT8_BLOCK + 4)):
            b.encode_chunk(x[e0:e1], e0, pieces[b0:b1])
        assert torch.equal(whole, pieces)
    assert torch.equal(a.residual, b.residual)


def test_error_feedback_chunks_encoded_in_parallel_threads_equal_sequential() -> None:
    """A streaming sender encodes chunks in worker threads at once (a shared scratch buffer
    once corrupted the residual this way; the transport bench caught it)."""
    codec, numel = get_codec("int8"), 64 * INT8_BLOCK
    x = _randn(numel, 5)
    spans = chunk_spans(codec, numel, 4 * (INT8_BLOCK + 4))
    seq, par = ErrorFeedback(codec, numel), ErrorFeedback(codec, numel)
    out_seq, out_par = (torch.empty(codec.encoded_nbytes(numel), dtype=torch.uint8) for _ in "ab")
    for _ in range(3):
        for e0, e1, b0, b1 in spans:
            seq.encode_chunk(x[e0:e1], e0, out_seq[b0:b1])
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(
                    lambda s: par.encode_chunk(x[s[0] : s[1]], s[0], out_par[s[2] : s[3]]), spans
                )
            )
        assert torch.equal(out_seq, out_par)
    assert torch.equal(seq.residual, par.residual)


def test_importing_codecs_pulls_in_neither_grpc_nor_hivemind() -> None:
    code = (
        "import sys, gaslocd.net.codecs; "
        "bad = [m for m in ('grpc', 'hivemind') if m in sys.modules]; sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
