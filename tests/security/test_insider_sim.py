"""An insider at the norm bound on the simulator (gaslocd/sim/insider.py), and the guard
that keeps a non-finite local result from ending a worker (Worker.train)."""

from __future__ import annotations

import math

import pytest
import torch

from gaslocd.algorithm.robust import TrustConfig
from gaslocd.config import AlgoConfig, OuterConfig, SimConfig, TrainConfig
from gaslocd.sim.insider import Insider, InsiderSimulation
from gaslocd.train.data import Corpus, load_corpus
from gaslocd.train.inner import NonFiniteLossError
from gaslocd.train.worker import NON_FINITE_LOSS, Worker

TRAIN = TrainConfig(batch_size=4, seq_len=32, eval_batches=2, inner_lr=3e-3, warmup_steps=2)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus(None, max_bytes=2**20)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _final(corpus: Corpus, clip: bool) -> tuple[float, InsiderSimulation]:
    sim = InsiderSimulation(
        AlgoConfig(inner_steps=4),
        TRAIN,
        SimConfig(workers=4, rounds=6, step_time_s=0.1, eval_every=6),
        insider=Insider(worker=0, attack="direction", fraction=0.9),
        trust=TrustConfig(enabled=clip),
        corpus=corpus,
    )
    return sim.run().final_val_loss, sim


@pytest.mark.slow
def test_clipping_bounds_what_an_insider_at_the_bound_does(corpus: Corpus) -> None:
    unclipped, _ = _final(corpus, clip=False)
    clipped, sim = _final(corpus, clip=True)
    assert math.isfinite(clipped) and all(math.isfinite(x) for x in sim.honest_val)
    assert sim.clipped() >= 3  # the insider is a partner of someone in most rounds
    assert sim.rollbacks() == 0
    # Without clipping the same insider costs the honest workers far more.
    assert not math.isfinite(unclipped) or unclipped > clipped + 0.2


def test_the_insider_offers_what_it_says(corpus: Corpus) -> None:
    sim = InsiderSimulation(
        AlgoConfig(inner_steps=1),
        TRAIN,
        SimConfig(workers=2, rounds=1, step_time_s=0.1),
        insider=Insider(attack="shrink", fraction=0.5),
        corpus=corpus,
    )
    target = torch.ones(100)
    assert torch.allclose(sim.poison(target), target * 0.5)
    with pytest.raises(ValueError, match="attack"):
        Insider(attack="nope")


def test_a_non_finite_loss_rolls_the_round_back_and_training_goes_on(
    corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = Worker(TRAIN, corpus, 0)
    w.begin_round()
    start = w.theta_start.clone()
    w.train(2)
    assert not torch.equal(w.flat.flat, start)  # it trained ...

    def poisoned() -> float:
        raise NonFiniteLossError("loss is nan at inner step 2")

    monkeypatch.setattr(w.trainer, "step", poisoned)
    assert w.train(3) == []
    assert torch.equal(w.flat.flat, start)  # ... then went back to the round's start
    assert w.rollbacks[NON_FINITE_LOSS] == 1
    assert w.train(3) == []  # the rest of the round offers θ (Δ = 0)
    monkeypatch.undo()
    w.begin_round()  # the next round trains again
    assert len(w.train(1)) == 1


@pytest.mark.parametrize("overlap", [False, True])
def test_a_clipped_partners_pull_never_rides_the_outer_momentum(
    corpus: Corpus, overlap: bool
) -> None:
    """An insider's θ̃ (scaled towards 0) is clipped, and what is left of its pull moves θ
    once: the outer momentum is the one of a round without it, so an insider pulling the
    same way every round is not multiplied by the momentum (7x at μ = 0.9, η = 0.7)."""
    cfg = OuterConfig(lr=0.7, momentum=0.9)
    attacked, alone = Worker(TRAIN, corpus, 0), Worker(TRAIN, corpus, 0)
    for w in (attacked, alone):
        w.begin_round()
        w.train(2)
        if overlap:
            w.hold_tilde(cfg)
    tilde = attacked.pending if overlap else attacked.flat.flat.clone()
    assert tilde is not None
    row = {"me": 0.5, "x": 0.5}
    result = attacked.outer_update(row, {"x": tilde * 0.1}, "me", cfg)
    alone.outer_update(row, {"x": tilde.clone()}, "me", cfg)  # a partner with our own θ̃
    assert result.clip.clipped == ("x",)
    torch.testing.assert_close(attacked.momentum, alone.momentum)
    moved = float((attacked.theta_start - alone.theta_start).norm())
    assert 0 < moved <= 0.5 * result.clip.radius * (1 + 1e-4)  # W_ij τ, not η(1 + μ) W_ij τ
