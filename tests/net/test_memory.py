"""The in-memory transport: the wire's codec semantics, failures for both ends, accounting."""

from __future__ import annotations

import pytest
import torch

from gaslocd.net.codecs import get_codec, roundtrip
from gaslocd.net.memory import InMemoryTransport, cut_links, fail_at


def _vec(seed: int, n: int = 5000) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_fp32_is_exact_and_a_copy() -> None:
    t = InMemoryTransport("fp32", 5000)
    x = _vec(0)
    t.post(0, "a", x)
    x.add_(1.0)  # the sender keeps training: what was sent must not change
    assert torch.equal(t.fetch(0, "a"), _vec(0))


def test_lossy_codecs_use_error_feedback_across_rounds() -> None:
    t = InMemoryTransport("int8", 5000)
    x = _vec(1)
    sent = []
    for r in range(20):
        t.post(r, "a", x)
        sent.append(t.fetch(r, "a"))
        t.end_round(r)
    one = (sent[0] - x).abs().max()
    average = (torch.stack(sent).mean(0) - x).abs().max()
    assert 0 < one < 0.05
    assert average < one / 5  # the residual telescopes: the time average converges to x


def test_failed_exchange_fails_for_both_ends_and_is_counted() -> None:
    t = InMemoryTransport("fp16", 5000, edge_fails=fail_at([(1, "b")]))
    for r in range(2):
        for peer in "abc":
            t.post(r, peer, _vec(r))
    assert t.exchange(0, "a", "b")
    assert not t.exchange(1, "a", "b")
    assert t.exchange(1, "a", "c")
    assert t.stats["b"].failed_exchanges == t.stats["a"].failed_exchanges == 1
    assert t.stats["a"].bytes_sent == 2 * t.message_bytes == 2 * 5000 * 2
    assert t.stats["a"].sent_by_codec == {"fp16": 2 * t.message_bytes}
    assert t.stats["b"].bytes_received == t.message_bytes


def test_cut_links_is_undirected_and_round_scoped() -> None:
    fails = cut_links([(3, "x", "y")])
    assert fails(3, "y", "x") and not fails(4, "x", "y")


def test_bad_use_is_refused() -> None:
    t = InMemoryTransport("bf16", 10)
    with pytest.raises(ValueError, match="expected 10"):
        t.post(0, "a", torch.zeros(11))
    with pytest.raises(RuntimeError, match="posted nothing"):
        t.exchange(0, "a", "b")
    with pytest.raises(ValueError):
        InMemoryTransport("zstd", 10)


# -- a codec per link -------------------------------------------------------------------


def test_fetch_in_another_codec_decodes_what_that_codec_would_send() -> None:
    t = InMemoryTransport("fp16", 5000)
    x = _vec(2)
    t.post(0, "a", x)
    assert torch.equal(t.fetch(0, "a"), roundtrip(get_codec("fp16"), x))
    assert t.fetch(0, "a", None) is t.fetch(0, "a", "fp16")  # None: the transport's codec
    q4 = t.fetch(0, "a", "q4")
    assert torch.equal(q4, roundtrip(get_codec("q4"), x))  # first round: no residual yet
    assert t.fetch(0, "a", "q4") is q4  # encoded once per (round, sender, codec)
    assert torch.equal(t.fetch(0, "a", "fp32"), x)
    with pytest.raises(ValueError, match="unknown codec"):
        t.fetch(0, "a", "zstd")
    with pytest.raises(RuntimeError, match="posted nothing"):
        t.fetch(1, "a", "q4")


def test_error_feedback_is_per_sender_and_codec() -> None:
    """a sends q4 to one partner and int8 to another every round: each stream's time
    average converges to θ̃ (its own residual), as on the wire with a FeedbackBank."""
    t = InMemoryTransport("int8", 5000)
    x = _vec(3)
    got: dict[str, list[torch.Tensor]] = {"int8": [], "q4": []}
    for r in range(40):
        t.post(r, "a", x)
        t.post(r, "b", _vec(4))
        for name in got:
            got[name].append(t.fetch(r, "a", name))
        t.end_round(r)
    for name, sent in got.items():
        one = (sent[0] - x).abs().max()
        assert (torch.stack(sent).mean(0) - x).abs().max() < one / 5, name
    assert not t._posted and not t._decoded  # end_round freed every codec's mailbox


def test_bytes_are_counted_in_each_direction_s_codec() -> None:
    t = InMemoryTransport("fp16", 5000)
    for peer in "ab":
        t.post(0, peer, _vec(5))
    assert t.message_bytes == t.message_bytes_for(None) == 10_000
    assert t.message_bytes_for("q4") == get_codec("q4").encoded_nbytes(5000)
    assert t.exchange(0, "a", "b", codecs=("q4", None))
    a, b = t.stats["a"], t.stats["b"]
    assert a.bytes_sent == b.bytes_received == t.message_bytes_for("q4")
    assert b.bytes_sent == a.bytes_received == 10_000
    assert a.sent_by_codec == {"q4": t.message_bytes_for("q4")}
    assert b.sent_by_codec == {"fp16": 10_000}
    assert (0, "a", "q4") in t._decoded  # the exchange encoded a's q4 message
    with pytest.raises(ValueError, match="unknown codec"):
        t.exchange(0, "a", "b", codecs=("lz4", None))
