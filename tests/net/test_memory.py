"""The in-memory transport: the wire's codec semantics, failures for both ends, accounting."""

from __future__ import annotations

import pytest
import torch

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
