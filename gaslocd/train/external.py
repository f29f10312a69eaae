"""A user's own training loop as the trainer of a round (the library API's side of it).

The round driver asks its trainer for H steps (and, filling the wait, for steps until a
partner is ready) on the training thread. gaslocd's own loop runs them right there; this
one opens a *window* instead and waits on the training thread until the user's thread has
reported the steps through :meth:`UserLoop.step`. Exactly one thread touches the
parameters at any time: the user's while a window is open, the training thread (mixing,
the outer step, checkpoints, a newcomer's state) otherwise, while the user's thread waits
inside :meth:`UserLoop.step`. A window closes only at a step boundary, so a forward pass
never reads θ half-written by an outer step.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gaslocd.train.inner import InnerTrainer, NonFiniteLossError

if TYPE_CHECKING:
    from gaslocd.train.worker import Worker

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often a waiting user thread checks that the peer is still alive


class PeerStopped(RuntimeError):
    """The peer failed (it could not start, or its daemon ended with an error)."""


class Stateful(Protocol):
    """What a checkpoint keeps of a user's loop besides θ (a scheduler, a data position)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class _Window:
    steps: int
    should_stop: Callable[[], bool] | None
    started: float
    losses: list[float] = field(default_factory=list)
    bad: str | None = None  # a non-finite loss ended it
    done: bool = False


class UserLoop:
    """The trainer of a worker whose steps the user's own loop takes.

    ``optimizer``: the user's inner optimizer, whose state goes into checkpoints with θ
    (optional: without it a resumed peer restarts its optimizer). ``evaluate``: called on
    the training thread when the round's evaluation is due, between windows, so it may use
    the model; None reports no validation loss. ``tokens_per_step`` feeds the tokens
    metric. ``alive`` says whether the daemon still runs (a waiting user thread stops
    waiting when it does not).
    """

    precision = "user"  # the user's loop chooses its own autocast

    def __init__(
        self,
        optimizer: torch.optim.Optimizer | None = None,
        evaluate: Callable[[], float] | None = None,
        tokens_per_step: int = 0,
        alive: Callable[[], bool] = lambda: True,
        state: Stateful | None = None,
        timer: Callable[[], float | None] | None = None,
    ) -> None:
        self.optimizer = optimizer
        self._timer = timer
        self.state = state
        self._evaluate = evaluate
        self.evaluates = evaluate is not None
        self._tokens_per_step = tokens_per_step
        self.alive = alive
        self.steps_done = 0
        self.last_step_s: float | None = None
        self._cond = threading.Condition()
        self._window: _Window | None = None
        self._opened = 0  # windows opened so far
        self._stopped: str | None = None
        self._failed = False

    @property
    def tokens_per_step(self) -> int:
        return self._tokens_per_step

    @property
    def opened(self) -> int:
        """Windows opened so far: θ can only have moved when this changed."""
        return self._opened

    # -- the training thread's side (what the round driver calls) -------------------------

    def train_steps(self, n: int, should_stop: Callable[[], bool] | None = None) -> list[float]:
        """Let the user's loop take up to ``n`` steps; their losses (NaN where none was
        given). Raises :class:`NonFiniteLossError` when the user reported one, so the
        worker rolls θ back to the round's start as it does for its own loop."""
        with self._cond:
            # The user's thread waits between windows, so this is "before the first step"
            # (later ones are checked after each step: before the next).
            if n <= 0 or self._stopped is not None or (should_stop and should_stop()):
                return []
            window = _Window(n, should_stop, time.perf_counter())
            self._window = window
            self._opened += 1
            self._cond.notify_all()
            while not window.done and self._stopped is None:
                self._cond.wait()
            self._window = None
        if window.losses:
            self.last_step_s = (time.perf_counter() - window.started) / len(window.losses)
        if window.bad is not None:
            raise NonFiniteLossError(window.bad)
        return window.losses

    def time_step(self) -> float | None:
        """A step's time before the first window (:meth:`InnerTrainer.time_step`), when
        the loop is gaslocd's own (``timer``); a user's loop is timed from its first window.
        Called before any window opens, so the loop's thread is not stepping."""
        return self._timer() if self._timer is not None else None

    def evaluate(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
        del batches  # the user's evaluation brings its own data
        return float(self._evaluate()) if self._evaluate is not None else math.nan

    def state_dict(self) -> dict[str, Any]:
        if self.state is not None:
            return self.state.state_dict()
        optimizer = self.optimizer.state_dict() if self.optimizer is not None else None
        return {"steps_done": self.steps_done, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state["steps_done"])
        if self.state is not None:
            self.state.load_state_dict(state)
        elif self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    # -- the user's thread's side -------------------------------------------------------------

    def wait_open(self, timeout_s: float) -> bool:
        """Block until the first window opens (the peer has joined); False on timeout.
        Raises :class:`PeerStopped` when the peer stopped first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._window is None:
                if self._check_running():
                    raise PeerStopped(self._stopped)
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(POLL_S, left))
        return True

    def step(self, loss: float | torch.Tensor | None = None) -> bool:
        """One inner step is done. Returns at once inside a round; at the round's last
        step, waits while the exchange and the outer step run, until the next round opens.
        False: there is no next round (the run is over, or the peer was closed).
        """
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
        value = math.nan if loss is None else float(loss)
        with self._cond:
            window = self._current()
            if window is None:
                return False
            window.losses.append(value)
            self.steps_done += 1
            if loss is not None and not math.isfinite(value):
                window.bad = f"the loss given to step() is {value} at step {self.steps_done}"
                window.done = True
            elif len(window.losses) >= window.steps or (
                window.should_stop is not None and window.should_stop()
            ):
                window.done = True
            return True if not window.done else self._wait_next()

    def reject(self, why: str) -> bool:
        """The step failed before anything was applied (a non-finite loss or gradient):
        the round's steps are thrown away, as for a non-finite loss given to :meth:`step`,
        with ``why`` as the reason logged. Returns as :meth:`step` does."""
        with self._cond:
            window = self._current()
            if window is None:
                return False
            window.bad, window.done = why, True
            return self._wait_next()

    def _current(self) -> _Window | None:
        """The open window (the lock held); None when stopped; misuse is an error."""
        window = self._window
        if window is None or window.done:
            if self._check_running():
                return None
            raise RuntimeError(
                "step() with no round open: call Peer.start() (or enter the Peer's "
                "'with' block) before the first step, and step from one thread only"
            )
        return window

    def _wait_next(self) -> bool:
        """The window is done: hand θ to the training thread and wait (the lock held)
        until the next window opens; False when there is none."""
        self._cond.notify_all()
        opened = self._opened
        while self._opened == opened:
            if self._check_running():
                return False
            self._cond.wait(POLL_S)
        return True

    def stop(self, why: str, failed: bool = False) -> None:
        """No more windows: an open one ends now (its steps so far count); a waiting user
        thread's :meth:`step` returns False, or raises :class:`PeerStopped` if ``failed``.
        Call it from the user's thread, or when that thread is waiting: a window must end
        at a step boundary."""
        with self._cond:
            if self._stopped is None:
                self._stopped, self._failed = why, failed
            if self._window is not None:
                self._window.done = True
            self._cond.notify_all()

    @property
    def stopped(self) -> str | None:
        return self._stopped

    def _check_running(self) -> bool:
        """True when stopped; raises :class:`PeerStopped` when that was a failure."""
        if self._stopped is None and not self.alive():
            self._stopped, self._failed = "the peer's daemon thread has ended", True
        if self._failed:
            raise PeerStopped(self._stopped)
        return self._stopped is not None


def take_over(worker: Worker, alive: Callable[[], bool]) -> tuple[UserLoop, InnerTrainer]:
    """gaslocd's own inner loop as a user of the library API: the worker's
    :class:`InnerTrainer` becomes the user's side of a :class:`UserLoop` (its steps, its
    evaluation, its checkpoint entry, unchanged), so ``gaslocd join`` trains through the
    same window handshake as any :class:`~gaslocd.Peer`. Returns (the loop, the trainer
    whose ``step`` the loop's user calls)."""
    inner = worker.trainer
    if not isinstance(inner, InnerTrainer):
        raise TypeError(f"the worker's trainer is a {type(inner).__name__}, not gaslocd's own")
    loop = UserLoop(
        evaluate=partial(inner.evaluate, worker.eval_batches),
        tokens_per_step=inner.tokens_per_step,
        alive=alive,
        state=inner,
        timer=inner.time_step,
    )
    loop.precision = inner.precision
    loop.steps_done = inner.steps_done
    worker.trainer = loop
    return loop, inner


def own_loop(loop: UserLoop, inner: InnerTrainer) -> None:
    """gaslocd's own inner loop, a user of the handshake like any other: a step, then
    :meth:`UserLoop.step` (or :meth:`UserLoop.reject` for a step refused as non-finite),
    until there is no next round."""
    more = True
    while more:
        try:
            loss = inner.step()
        except NonFiniteLossError as exc:
            more = loop.reject(str(exc))
        else:
            more = loop.step(loss)
