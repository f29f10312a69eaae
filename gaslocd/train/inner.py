"""The inner loop: H AdamW steps on a worker's own data stream, between outer rounds.

GASLoC keeps the inner optimizer's state across rounds (docs/design.md §1): the outer step
overwrites θ in place (``FlatParameters.flat``) and AdamW's moments carry over. That works
because the parameters are views into the flat vector: the optimizer keeps stepping the
same parameter objects, whatever was written into their storage in between.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from gaslocd.config import TrainConfig
from gaslocd.train.data import BatchSampler
from gaslocd.train.device import autocast, resolve_precision
from gaslocd.train.flat import FlatParameters
from gaslocd.train.model import model_loss

log = logging.getLogger(__name__)

BETAS = (0.9, 0.95)  # Llama / nanoGPT: a shorter second-moment memory than Adam's 0.999


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm was NaN/inf; the step was not applied.

    Raised before ``optimizer.step()``, so θ and the optimizer state are still those of the
    last good step and a caller can lower the learning rate, reload, or drop the worker.
    """


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """The fraction of ``inner_lr`` at inner step ``step`` (0-based).

    Linear warm-up over ``warmup_steps``; then constant, or a cosine or linear decay from
    1 to ``lr_floor`` reached at ``total_steps`` and held after (filling the wait and
    adaptive H can take a worker past the planned budget).
    """
    warmup = cfg.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if cfg.lr_schedule == "constant" or cfg.total_steps is None:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, cfg.total_steps - warmup))
    if cfg.lr_schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        decay = 1.0 - progress
    return cfg.lr_floor + (1.0 - cfg.lr_floor) * decay


class Trainer(Protocol):
    """What a :class:`~gaslocd.train.worker.Worker` asks of whoever runs the inner steps:
    gaslocd's own loop (:class:`InnerTrainer`) or a user's
    (:class:`~gaslocd.train.external.UserLoop`)."""

    steps_done: int
    last_step_s: float | None
    precision: str
    evaluates: bool  # has a validation loss to report

    @property
    def tokens_per_step(self) -> int: ...

    def train_steps(self, n: int, should_stop: Callable[[], bool] | None = None) -> list[float]: ...

    def time_step(self) -> float | None: ...

    def evaluate(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class InnerTrainer:
    """AdamW with linear warmup then a constant rate, gradient clipping, and a resumable state.

    Weight decay applies to matrices (≥2-D: projections, the tied embedding) only; decaying
    norm gains towards 0 would fight the normalisation they exist to scale.
    """

    evaluates = True

    def __init__(
        self, model: nn.Module, flat: FlatParameters, sampler: BatchSampler, cfg: TrainConfig
    ) -> None:
        self.model = model
        self.flat = flat
        self.sampler = sampler
        self.cfg = cfg
        self.device = flat.flat.device
        self.precision = resolve_precision(cfg.precision, self.device)
        # fp16 overflows without loss scaling; bf16 has fp32's range and needs none.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.steps_done = 0
        self.last_step_s: float | None = None  # mean wall time per step of the last call
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self._lr(0),
            betas=BETAS,
            fused=self.device.type == "cuda" or None,  # one kernel for all parameters
        )
        self._params = params
        # Compiling wraps the module; its parameters are the same tensors (the flat views).
        self._forward: nn.Module = torch.compile(model) if cfg.compile else model  # type: ignore[assignment]
        model.train()

    @property
    def tokens_per_step(self) -> int:
        return self.sampler.batch_size * self.sampler.seq_len

    def _lr(self, step: int) -> float:
        """Learning rate of step ``step`` (0-based): linear warm-up, then the schedule."""
        return self.cfg.inner_lr * lr_factor(self.cfg, step)

    def train_steps(self, n: int, should_stop: Callable[[], bool] | None = None) -> list[float]:
        """Run up to ``n`` steps; return their losses. ``should_stop`` is checked before each.

        Runs in the daemon's worker thread; the check between steps is what lets the event
        loop stop a round promptly (a step itself is not interrupted).
        """
        losses: list[float] = []
        start = time.perf_counter()
        for _ in range(n):
            if should_stop is not None and should_stop():
                log.debug("stopping after %d of %d steps", len(losses), n)
                break
            losses.append(self.step())
        if losses:
            self.last_step_s = (time.perf_counter() - start) / len(losses)
        return losses

    def step(self) -> float:
        """One inner step; its loss. Raises :class:`NonFiniteLossError` (nothing applied)
        for a non-finite loss or gradient. Public: ``gaslocd join``'s loop calls it
        through the library API (:func:`gaslocd.train.external.take_over`)."""
        x, y = self.sampler.next_batch()  # (B, T) each
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        self.optimizer.zero_grad(set_to_none=True)
        value = self._forward_backward(x, y)
        self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip_gradients()
        if not math.isfinite(grad_norm) and not self.scaler.is_enabled():
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"gradient norm is {grad_norm} at inner step {self.steps_done} (loss {value})"
            )
        lr = self._lr(self.steps_done)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # With fp16 loss scaling an overflowing step is skipped and the scale lowered: a
        # normal event, not a poisoned θ.
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.steps_done += 1
        return value

    def time_step(self) -> float | None:
        """Seconds of a step's forward and backward, with nothing applied and no batch
        drawn (None if it is not finite). A daemon's first round needs the round time T to
        classify its links (a link slower than a round must be planned long from the
        start, docs/design.md §3), and T needs a step time before any step was taken."""
        shape = (self.sampler.batch_size, self.sampler.seq_len)
        x = torch.zeros(shape, dtype=torch.long, device=self.device)
        seconds = None
        try:
            for _ in range(2):  # the first pass pays for first-call allocations
                began = time.perf_counter()
                self._forward_backward(x, x)
                seconds = time.perf_counter() - began
        except NonFiniteLossError:
            return None
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        return seconds

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """The batch's mean loss, its gradients accumulated over micro-batches."""
        parts = max(1, x.shape[0] // self.cfg.micro_batch) if self.cfg.micro_batch else 1
        total = 0.0
        for xs, ys in zip(x.chunk(parts), y.chunk(parts), strict=True):
            with autocast(self.device, self.precision):
                loss = model_loss(self._forward, xs, ys) / parts
            # .item() waits for the device; that is the price of refusing a bad loss before
            # anything is applied, and is small next to a step of a real model.
            value = loss.item()
            if not math.isfinite(value):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(f"loss is {value} at inner step {self.steps_done}")
            self.scaler.scale(loss).backward()
            total += value
        return total

    def _clip_gradients(self) -> float:
        """Clip to ``cfg.grad_clip`` (0: no clipping); return the pre-clip global norm."""
        grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return 0.0
        if self.cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self._params, self.cfg.grad_clip)
        else:  # the norm is still needed to refuse a non-finite gradient
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads])
            )
        return float(norm)

    @torch.no_grad()
    def evaluate(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """Mean loss over ``batches`` in eval mode (then back to train mode)."""
        if not batches:
            raise ValueError("evaluate needs at least one batch")
        self.model.eval()
        try:
            total = 0.0
            for x, y in batches:
                with autocast(self.device, self.precision):
                    loss = model_loss(self._forward, x.to(self.device), y.to(self.device))
                total += loss.item()
        finally:
            self.model.train()
        return total / len(batches)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer moments, step count and data position: for checkpoints, not the wire.

        The optimizer tensors are the live ones (as ``torch.optim`` returns them): save or
        deep-copy the result before the next step, or the copy will move with training.
        """
        return {
            "optimizer": self.optimizer.state_dict(),
            "steps_done": self.steps_done,
            "sampler": self.sampler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = int(state["steps_done"])
        self.sampler.load_state_dict(state["sampler"])
