"""``--gossip direct`` (issue 17's variant): the outer step takes our own pseudo-gradient
and the mix of θ̃ moves θ beside it, once and unscaled, in the sequential and the
overlapped round alike; at η=1, μ=0 both rules are the same plain gossip (DAdam)."""

from __future__ import annotations

import pytest
import torch

from gaslocd.algorithm.outer import outer_step_
from gaslocd.config import OuterConfig, TrainConfig
from gaslocd.train.data import Corpus
from gaslocd.train.worker import Worker

TRAIN = TrainConfig(seq_len=16, batch_size=2, warmup_steps=0, eval_batches=1, inner_lr=3e-3)
ROW = {"me": 0.5, "p": 0.5}


def _corpus() -> Corpus:
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 64, (20_000,), generator=g).to(torch.uint8)
    return Corpus(train=text[:18_000], val=text[18_000:], vocab_size=256, source="random")


def _trained(corpus: Corpus, momentum: torch.Tensor | None = None) -> Worker:
    w = Worker(TRAIN, corpus, 0)
    if momentum is not None:
        w.momentum.copy_(momentum)
    w.begin_round()
    w.train(2)
    return w


def test_direct_gossip_keeps_the_mix_out_of_the_momentum() -> None:
    corpus, cfg = _corpus(), OuterConfig(lr=0.7, momentum=0.9, gossip="direct")
    m0 = torch.full((Worker(TRAIN, corpus, 0).numel,), 1e-4)
    w = _trained(corpus, m0)
    start, tilde = w.theta_start.clone(), w.flat.flat.clone()
    partner = tilde + 0.01
    w.outer_update(ROW, {"p": partner}, "me", cfg)

    expected, m = start.clone(), m0.clone()
    outer_step_(expected, m, tilde, cfg)  # our own pseudo-gradient only
    expected += 0.5 * (partner - tilde)  # the mix, once, unscaled
    torch.testing.assert_close(w.momentum, m)
    torch.testing.assert_close(w.theta_start, expected)
    torch.testing.assert_close(w.flat.flat, expected)


def test_at_eta_one_and_mu_zero_both_rules_are_plain_gossip() -> None:
    corpus = _corpus()
    out = []
    for gossip in ("momentum", "direct"):
        w = _trained(corpus)
        partner = w.flat.flat + 0.01
        w.outer_update(ROW, {"p": partner}, "me", OuterConfig(lr=1.0, momentum=0.0, gossip=gossip))
        out.append(w.flat.flat.clone())
    torch.testing.assert_close(out[0], out[1])


def test_the_overlapped_direct_step_is_the_sequential_one_plus_the_progress_meanwhile() -> None:
    corpus, cfg = _corpus(), OuterConfig(gossip="direct")
    plain, late = _trained(corpus), _trained(corpus)
    partner = plain.flat.flat + 0.01
    plain.outer_update(ROW, {"p": partner}, "me", cfg)
    late.hold_tilde(cfg)
    late.begin_round()
    eager = late.flat.flat.clone()
    late.train(1)
    progress = late.flat.flat - eager
    late.outer_update(ROW, {"p": partner}, "me", cfg)
    torch.testing.assert_close(late.theta_start, plain.theta_start)
    torch.testing.assert_close(late.momentum, plain.momentum)
    torch.testing.assert_close(late.flat.flat, plain.theta_start + progress)


def test_an_unknown_gossip_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="gossip must be one of momentum, direct"):
        OuterConfig(gossip="sideways")
