"""The inner AdamW loop: learning, stopping, non-finite refusal, warmup and resumption."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from gaslocd.config import TrainConfig
from gaslocd.train.data import BatchSampler, fixed_batches, load_corpus
from gaslocd.train.flat import FlatParameters
from gaslocd.train.inner import InnerTrainer, NonFiniteLossError
from gaslocd.train.model import build_model

CFG = TrainConfig(seq_len=32, batch_size=4, inner_lr=3e-3, warmup_steps=4, grad_clip=1.0)


def _tokens() -> torch.Tensor:
    return torch.arange(4000) % 97


def _trainer(cfg: TrainConfig = CFG, tokens: torch.Tensor | None = None) -> InnerTrainer:
    model = build_model(cfg.model, vocab_size=256, seq_len=cfg.seq_len, seed=cfg.seed)
    flat = FlatParameters(model)
    sampler = BatchSampler(
        _tokens() if tokens is None else tokens,
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len,
        seed=cfg.seed,
        worker=0,
    )
    return InnerTrainer(model, flat, sampler, cfg)


def test_loss_falls_on_the_builtin_corpus() -> None:
    corpus = load_corpus(None, max_bytes=2 * 2**20)
    cfg = replace(CFG, seq_len=64, batch_size=8, inner_lr=3e-3, warmup_steps=5)
    trainer = _trainer(cfg, corpus.train)
    val = fixed_batches(corpus.val, batch_size=8, seq_len=64, n=2, seed=0)
    before = trainer.evaluate(val)
    # Below ln 256 already: tied embeddings favour repeating the current byte (spaces).
    assert math.log(256) - 0.6 < before < math.log(256) + 0.3
    losses = trainer.train_steps(40)
    after = trainer.evaluate(val)
    assert len(losses) == 40 and trainer.steps_done == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0
    assert after < before - 1.0
    assert trainer.model.training
    assert trainer.last_step_s is not None and trainer.last_step_s > 0


def test_should_stop_is_checked_between_steps() -> None:
    trainer = _trainer()
    calls = 0

    def stop_after_two() -> bool:
        nonlocal calls
        calls += 1
        return calls > 2

    assert len(trainer.train_steps(10, should_stop=stop_after_two)) == 2
    assert trainer.steps_done == 2


def test_non_finite_loss_is_refused_before_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _trainer()
    trainer.train_steps(2)
    theta = trainer.flat.clone()
    moments = [s["exp_avg"].clone() for s in trainer.optimizer.state.values()]
    forward = trainer.model.forward

    def poisoned(tokens: torch.Tensor, targets: torch.Tensor | None = None) -> object:
        logits, loss = forward(tokens, targets)
        assert loss is not None
        return logits, loss * float("inf")  # still depends on every parameter

    monkeypatch.setattr(trainer.model, "forward", poisoned)
    with pytest.raises(NonFiniteLossError, match="loss is inf at inner step 2"):
        trainer.train_steps(3)
    assert torch.equal(trainer.flat.flat, theta)
    assert trainer.steps_done == 2
    for before, state in zip(moments, trainer.optimizer.state.values(), strict=True):
        assert torch.equal(before, state["exp_avg"])


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_non_finite_gradient_is_refused_before_the_step(grad_clip: float) -> None:
    trainer = _trainer(replace(CFG, grad_clip=grad_clip))
    theta = trainer.flat.clone()
    param = next(trainer.model.parameters())
    param.register_hook(lambda g: g * float("inf"))
    with pytest.raises(NonFiniteLossError, match="gradient norm"):
        trainer.train_steps(1)
    assert torch.equal(trainer.flat.flat, theta)
    assert all(p.grad is None for p in trainer.model.parameters())


def test_warmup_is_linear_then_constant_and_decay_skips_vectors() -> None:
    trainer = _trainer(replace(CFG, warmup_steps=4, inner_lr=1e-3, weight_decay=0.1))
    seen = []
    for _ in range(6):
        trainer.train_steps(1)
        seen.append(trainer.optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    decay, no_decay = trainer.optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["params"]
    assert decay["betas"] == (0.9, 0.95)


def test_no_warmup_starts_at_full_rate() -> None:
    trainer = _trainer(replace(CFG, warmup_steps=0, inner_lr=2e-3))
    trainer.train_steps(1)
    assert trainer.optimizer.param_groups[0]["lr"] == 2e-3


def test_outer_overwrite_between_rounds_keeps_the_optimizer_working() -> None:
    trainer = _trainer()
    start = trainer.flat.clone()
    trainer.train_steps(2)
    trainer.flat.load_(start)  # what the outer step does, in place
    trainer.train_steps(1)
    trainer.flat.check()
    assert not torch.equal(trainer.flat.flat, start)
    assert len(trainer.optimizer.state) == len(list(trainer.model.parameters()))


def test_state_round_trip_resumes_exactly() -> None:
    a = _trainer()
    a.train_steps(3)
    theta, state = a.flat.clone(), a.state_dict()
    state = copy.deepcopy(state)  # the optimizer tensors are live references
    expected = a.train_steps(3)
    b = _trainer()
    b.flat.load_(theta)
    b.load_state_dict(state)
    assert b.steps_done == 3
    assert b.train_steps(3) == expected
    assert torch.equal(a.flat.flat, b.flat.flat)


def test_evaluate_restores_train_mode_and_needs_no_grad() -> None:
    trainer = _trainer()
    batches = fixed_batches(_tokens(), batch_size=2, seq_len=32, n=2, seed=0)
    loss = trainer.evaluate(batches)
    assert math.isfinite(loss) and trainer.model.training
    assert all(p.grad is None for p in trainer.model.parameters())
    with pytest.raises(ValueError):
        trainer.evaluate([])


def test_tokens_per_step() -> None:
    assert _trainer().tokens_per_step == CFG.batch_size * CFG.seq_len


def test_model_without_loss_is_reported() -> None:
    class NoLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))

        def forward(
            self, tokens: torch.Tensor, targets: torch.Tensor | None = None
        ) -> tuple[torch.Tensor, None]:
            return tokens.float() * self.w, None

    model = NoLoss()
    sampler = BatchSampler(_tokens(), batch_size=1, seq_len=4, seed=0, worker=0)
    trainer = InnerTrainer(model, FlatParameters(model), sampler, CFG)
    with pytest.raises(TypeError, match="no loss"):
        trainer.train_steps(1)


def test_timing_a_step_before_the_first_round_changes_nothing() -> None:
    """The daemon times a step before its first plan (its record's step time, the first
    round's T); the run must go on as if it had not: same θ, same data, same steps."""
    timed, plain = _trainer(), _trainer()
    seconds = timed.time_step()
    assert seconds is not None and seconds > 0
    assert all(p.grad is None for p in timed.model.parameters())
    assert timed.steps_done == 0 and timed.sampler.batches_drawn == 0
    assert torch.equal(timed.flat.flat, plain.flat.flat)
    assert timed.train_steps(3) == plain.train_steps(3)
    assert torch.equal(timed.flat.flat, plain.flat.flat)
