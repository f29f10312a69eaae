"""The library API's handshake (gaslocd.train.external): a user's thread takes the steps, the
training thread gets them as a window; exactly one of them touches θ at a time.

In process, with two real threads and a real Worker around a real model; every wait is
bounded (the futures' timeouts)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from gaslocd.config import OuterConfig, TrainConfig
from gaslocd.train.data import Corpus
from gaslocd.train.external import PeerStopped, UserLoop, take_over
from gaslocd.train.worker import Worker

WAIT_S = 30.0


def _worker(loop: UserLoop) -> tuple[Worker, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loop.optimizer = opt
    return Worker.around(model, lambda _flat: loop, TrainConfig(model="user:test")), model, opt


def _user_step(model: nn.Module, opt: torch.optim.Optimizer, value: float | None = None) -> float:
    x = torch.randn(16, 4)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item() if value is None else value


@pytest.fixture
def trainer_thread() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=1)
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


def test_a_window_is_the_users_steps_and_the_round_end_waits_for_the_next_window(
    trainer_thread: ThreadPoolExecutor,
) -> None:
    loop = UserLoop()
    worker, model, opt = _worker(loop)
    worker.begin_round()
    window: Future[list[float]] = trainer_thread.submit(worker.train, 3)
    assert loop.wait_open(WAIT_S)
    losses = []
    for _ in range(2):
        losses.append(_user_step(model, opt))
        assert loop.step(losses[-1]) is True
        assert not window.done()  # two of three steps: the round is still the user's
    # The third step ends the window: step() must not return before the next one opens,
    # so run it on a thread and open the next window from here once the first is back.
    third: Future[bool] = ThreadPoolExecutor(max_workers=1).submit(
        lambda: loop.step(_user_step(model, opt, 1.5))
    )
    assert window.result(timeout=WAIT_S)[:2] == losses
    assert len(window.result()) == 3 and loop.steps_done == 3
    assert not third.done()  # still waiting: the outer step may run now
    before = worker.flat.flat.clone()
    worker.outer_update({"me": 1.0}, {}, "me", OuterConfig(lr=0.7, momentum=0.9))
    assert not torch.equal(before, worker.flat.flat)  # θ moved while the user waited
    assert worker.round == 1
    nxt = trainer_thread.submit(worker.train, 2)
    assert third.result(timeout=WAIT_S) is True
    assert loop.step(_user_step(model, opt)) is True
    last = ThreadPoolExecutor(max_workers=1).submit(lambda: loop.step(_user_step(model, opt)))
    assert len(nxt.result(timeout=WAIT_S)) == 2
    assert loop.last_step_s is not None and loop.last_step_s > 0
    loop.stop("the run is over")  # no next window: the waiting step says so
    assert last.result(timeout=WAIT_S) is False


def test_should_stop_ends_a_window_at_the_next_step_boundary(
    trainer_thread: ThreadPoolExecutor,
) -> None:
    loop = UserLoop()
    worker, model, opt = _worker(loop)
    ready = threading.Event()  # a partner became ready: the fill ends
    window = trainer_thread.submit(worker.train, 100, ready.is_set)
    assert loop.wait_open(WAIT_S)
    assert loop.step(_user_step(model, opt)) is True
    ready.set()
    with pytest.raises(TimeoutError):  # not mid-step: only the user's next step ends it
        window.result(timeout=0.2)
    result = ThreadPoolExecutor(max_workers=1).submit(loop.step, _user_step(model, opt))
    assert len(window.result(timeout=WAIT_S)) == 2
    loop.stop("closed")
    assert result.result(timeout=WAIT_S) is False  # stopped, not failed: the loop ends


def test_a_non_finite_loss_throws_the_round_away(trainer_thread: ThreadPoolExecutor) -> None:
    loop = UserLoop()
    worker, model, opt = _worker(loop)
    worker.begin_round()
    start = worker.theta_start.clone()
    window = trainer_thread.submit(worker.train, 5)
    assert loop.wait_open(WAIT_S)
    assert loop.step(_user_step(model, opt)) is True
    with torch.no_grad():  # what a poisoned step leaves behind
        worker.flat.flat.fill_(math.nan)
    ended = ThreadPoolExecutor(max_workers=1).submit(loop.step, math.nan)
    assert window.result(timeout=WAIT_S) == []
    assert torch.equal(worker.flat.flat, start)  # back to the round's start
    assert worker.rollbacks["non-finite-loss"] == 1
    loop.stop("closed")
    assert ended.result(timeout=WAIT_S) is False


def test_misuse_and_failure_are_clear_errors(trainer_thread: ThreadPoolExecutor) -> None:
    loop = UserLoop()
    with pytest.raises(RuntimeError, match="no round open"):
        loop.step(1.0)
    alive = threading.Event()
    alive.set()
    failing = UserLoop(alive=alive.is_set)
    assert failing.wait_open(0.01) is False  # nothing opened: a bounded wait says so
    alive.clear()  # the daemon thread ended without a stop: a failure
    with pytest.raises(PeerStopped, match="daemon thread has ended"):
        failing.wait_open(WAIT_S)
    failed = UserLoop()
    failed.stop("the peer stopped: cannot listen", failed=True)
    with pytest.raises(PeerStopped, match="cannot listen"):
        failed.step(1.0)


def test_checkpoint_state_carries_the_users_optimizer() -> None:
    loop = UserLoop()
    worker, _, opt = _worker(loop)
    opt.param_groups[0]["lr"] = 0.01234
    state = loop.state_dict()
    opt.param_groups[0]["lr"] = 0.5
    loop.load_state_dict(state)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01234)
    assert loop.evaluates is False and math.isnan(worker.evaluate())
    assert UserLoop(evaluate=lambda: 2.5).evaluate([]) == 2.5


def test_a_checkpoint_keeps_the_trust_radius(tmp_path: Path) -> None:
    worker, _, _ = _worker(UserLoop())
    own = worker.flat.flat.clone()
    for k in range(6):
        worker.trust.clip(own, {"p": own + 0.01 * (k + 1)}, progress=1.0)
    worker.save(tmp_path, {})
    restored, _, _ = _worker(UserLoop())
    restored.restore(tmp_path)
    assert restored.trust.state_dict() == worker.trust.state_dict()
    assert restored.trust.radius(0.0) == worker.trust.radius(0.0) < math.inf


def _own_worker() -> Worker:
    """gaslocd's own worker (its InnerTrainer, its data stream) on a small random corpus."""
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 64, (20_000,), generator=g).to(torch.uint8)
    corpus = Corpus(train=text[:18_000], val=text[18_000:], vocab_size=256, source="random")
    cfg = TrainConfig(seq_len=32, batch_size=4, warmup_steps=0, eval_batches=1, inner_lr=3e-3)
    return Worker(cfg, corpus, worker_index=0)


def test_the_daemons_own_loop_trains_through_the_handshake(
    trainer_thread: ThreadPoolExecutor,
) -> None:
    """take_over: what `gaslocd join` runs. Its steps, evaluation and checkpoint entry are
    the InnerTrainer's, taken through windows; the entry keeps its old layout (checkpoints
    written before the daemon used the API still load)."""
    worker = _own_worker()
    loop, inner = take_over(worker, alive=lambda: True)
    assert worker.trainer is loop and loop.precision == inner.precision == "fp32"
    # The daemon's first plan needs a step time before the first window: its own loop
    # times one (nothing drawn, nothing applied); a user's loop has none to give.
    seconds = loop.time_step()
    assert seconds is not None and seconds > 0 and inner.sampler.batches_drawn == 0
    assert UserLoop().time_step() is None
    assert loop.evaluates and math.isfinite(worker.evaluate())
    worker.begin_round()
    window = trainer_thread.submit(worker.train, 3)
    assert loop.wait_open(WAIT_S)
    user = ThreadPoolExecutor(max_workers=1)
    stepped = [user.submit(lambda: loop.step(inner.step())) for _ in range(3)]
    losses = window.result(timeout=WAIT_S)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert loop.steps_done == inner.steps_done == 3
    state = loop.state_dict()
    assert set(state) == {"optimizer", "steps_done", "sampler"}  # InnerTrainer's, as is
    loop.stop("closed")
    assert stepped[-1].result(timeout=WAIT_S) is False
    again = _own_worker()
    loop2, inner2 = take_over(again, alive=lambda: True)
    loop2.load_state_dict(state)
    assert loop2.steps_done == inner2.steps_done == 3
    assert torch.equal(inner2.sampler.next_batch()[0], inner.sampler.next_batch()[0])
    with pytest.raises(TypeError, match="not gaslocd's own"):
        take_over(worker, alive=lambda: True)  # already a UserLoop


def test_a_step_rejected_by_the_own_loop_throws_the_round_away(
    trainer_thread: ThreadPoolExecutor,
) -> None:
    worker = _own_worker()
    loop, inner = take_over(worker, alive=lambda: True)
    worker.begin_round()
    start = worker.theta_start.clone()
    window = trainer_thread.submit(worker.train, 5)
    assert loop.wait_open(WAIT_S)
    assert loop.step(inner.step()) is True
    ended = ThreadPoolExecutor(max_workers=1).submit(loop.reject, "loss is nan at inner step 1")
    assert window.result(timeout=WAIT_S) == []
    assert torch.equal(worker.flat.flat, start) and worker.rollbacks["non-finite-loss"] == 1
    assert worker.train(5) == []  # the round stays thrown away: no window opens
    loop.stop("closed")
    assert ended.result(timeout=WAIT_S) is False


def test_a_window_whose_stop_already_holds_opens_no_steps() -> None:
    """As gaslocd's own loop checks before each step: a fill whose partner is already
    ready trains nothing (the user's thread is not woken for one step)."""
    loop = UserLoop()
    assert loop.train_steps(10, lambda: True) == [] and loop.opened == 0
