"""One worker's training state, and the only code that mutates it.

θ (the round's starting point), the outer momentum m, the inner AdamW state and the data
position live here, for a daemon and for each of the simulator's workers alike: both
drivers take their outer step through :meth:`Worker.outer_update`, so the simulator
measures the update a daemon applies. In a daemon, training and the outer step run on
the training thread; the event loop only reads snapshots, taken under ``lock`` so that a
newcomer's ``GetState`` or a checkpoint never sees θ from one round and m from another.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gaslocd.algorithm.outer import outer_step_
from gaslocd.algorithm.robust import ClipReport, TrustConfig, TrustRadius, all_finite, distance
from gaslocd.algorithm.robust import robust_mix as _robust_mix
from gaslocd.config import OuterConfig, TrainConfig
from gaslocd.train.checkpoint import CHECKPOINT_NAME, build_payload, load_newest, save_checkpoint
from gaslocd.train.data import BatchSampler, Corpus, held_out_batches
from gaslocd.train.device import on_host, resolve_device
from gaslocd.train.flat import FlatParameters, model_fingerprint
from gaslocd.train.inner import InnerTrainer, NonFiniteLossError, Trainer
from gaslocd.train.model import build_model

log = logging.getLogger(__name__)


def worker_index_for(peer_id: str) -> int:
    """A data-stream index derived from a peer id: distinct streams without coordination."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of (round, θ, m): safe to stream while training goes on."""

    round: int
    theta: torch.Tensor
    momentum: torch.Tensor
    data_position: int


@dataclass(frozen=True)
class OuterResult:
    """What one outer step did: the consensus distance to the partners' θ̃ as received,
    and what robust mixing clipped."""

    consensus: float
    clip: ClipReport


# Why a round's local result was thrown away (θ back to the round's start), as counted.
NON_FINITE_LOSS = "non-finite-loss"
NON_FINITE_OUTER = "non-finite-outer"


class Worker:
    """θ, m, the inner trainer and the data stream of one worker.

    Every worker of a run starts from the same θ0 (the same init seed, as DiLoCo does);
    they differ by their data streams (``worker_index``).
    """

    def __init__(
        self,
        train: TrainConfig,
        corpus: Corpus,
        worker_index: int,
        eval_batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        trust: TrustConfig | None = None,
    ) -> None:
        model = build_model(
            train.model,
            vocab_size=corpus.vocab_size,
            seq_len=train.seq_len,
            seed=train.seed,
            device=resolve_device(train.device),
        )
        flat = FlatParameters(model)
        sampler = BatchSampler(
            corpus.train,
            batch_size=train.batch_size,
            seq_len=train.seq_len,
            seed=train.seed,
            worker=worker_index,
        )
        self._setup(
            train, worker_index, model, flat, InnerTrainer(model, flat, sampler, train), trust
        )
        if eval_batches is None:
            eval_batches = held_out_batches(corpus, train)
        self.eval_batches = eval_batches

    @classmethod
    def around(
        cls,
        model: nn.Module,
        make_trainer: Callable[[FlatParameters], Trainer],
        train: TrainConfig,
        trust: TrustConfig | None = None,
    ) -> Worker:
        """A worker around a model someone else trains (the library API's
        :class:`~gaslocd.train.external.UserLoop`): same θ, m, outer step and checkpoint
        code as a daemon's, with the model's own device and initial values."""
        self = cls.__new__(cls)
        flat = FlatParameters(model)
        self._setup(train, 0, model, flat, make_trainer(flat), trust)
        return self

    def _setup(
        self,
        train: TrainConfig,
        worker_index: int,
        model: nn.Module,
        flat: FlatParameters,
        trainer: Trainer,
        trust: TrustConfig | None = None,
    ) -> None:
        self.train_config = train
        self.worker_index = worker_index
        self.device = flat.flat.device
        self.fingerprint = model_fingerprint(model, train.model)
        self.flat = flat
        self.trainer = trainer
        self.eval_batches = []
        self.momentum = torch.zeros_like(self.flat.flat)
        self.theta_start = self.flat.clone()  # θ at the start of `round`
        # Overlap (docs/design.md §1): θ̃ of the round whose exchange is still on the wire,
        # kept unchanged while the next round trains on; None when nothing is in flight.
        self.pending: torch.Tensor | None = None
        self.pending_base: torch.Tensor | None = None  # θ_t of that round (trust radius)
        # Our θ̃ of rounds whose long exchange (a link too slow for a round) is still on
        # the wire: kept until it lands, for the pairwise mix (see apply_pair_mix).
        # One entry per long partner: our θ̃ then, and its round's progress and norm
        # change (the trust radius the late mix is clipped to, as a round's mix is).
        self.long_own: dict[int, list[tuple[torch.Tensor, float, float]]] = {}
        self.round = 0
        self.lock = threading.Lock()
        self.trust = TrustRadius(trust)  # robust mixing's memory (docs/design.md §1)
        self.rollbacks: Counter[str] = Counter()  # local results thrown away, by reason
        self.rolled_back = False  # this round's local steps were thrown away

    @property
    def numel(self) -> int:
        return self.flat.numel

    # -- training-thread operations -------------------------------------------------------

    def begin_round(self) -> None:
        """Make the live parameters the round's starting point (they already are, after
        an outer step; after loading state they are copied in here). With an exchange in
        flight (overlap) the live parameters are θ̃ of that round and training goes on
        from them: that is the point of overlapping."""
        if self.pending is None:
            self.flat.load_(self.theta_start)
        self.rolled_back = False

    def hold_tilde(self, cfg: OuterConfig) -> torch.Tensor:
        """Overlap: keep this round's θ̃ aside and take its outer step *eagerly*, on our
        own pseudo-gradient alone, so the next round trains from there while θ̃ is on
        the wire; returns θ̃ as the wire encodes it (a host tensor nobody changes).

        The eager step is the outer step with the mix replaced by our own θ̃ (the
        "eager" overlapped outer update of the DiLoCo literature). When the partners' θ̃
        arrive, :meth:`outer_update` adds the difference to the true step, so θ and m end
        up exactly where the step with the mix would have put them; only the next
        round's first steps were taken from the eager point. Training on from θ̃
        instead (the outer step simply one round late) was measured to cost far more:
        with Nesterov momentum the outer step is a large move to skip for a round.

        The round number advances now, not at the outer step: the next round's pairing
        is planned while this one's exchange is still on the wire.
        """
        with self.lock:
            self.pending = self.flat.flat.clone()
            self.pending_base = self.theta_start
            eager = self.theta_start.clone()
            outer_step_(eager, self.momentum, self.pending, cfg)  # the mix: our own θ̃
            if not all_finite(eager):
                eager.copy_(self.pending)
                self.momentum.zero_()
                self.rollbacks[NON_FINITE_OUTER] += 1
            self.theta_start = eager
            self.flat.load_(eager)
            self.round += 1
        return on_host(self.pending)

    def train(self, steps: int, should_stop: Callable[[], bool] | None = None) -> list[float]:
        """Up to ``steps`` inner steps; their losses. Both drivers train through here.

        A non-finite loss or gradient (a poisoned θ, a bad batch) must not end the run:
        θ goes back to the round's start, which keeps everything trained before this
        round, the round's θ̃ is that θ (Δ = 0), and the reason is counted in
        ``rollbacks``. The AdamW moments of the round's earlier steps stay (copying them
        every round would cost two models' worth of memory traffic); the failed step
        itself was never applied.
        """
        if self.rolled_back:
            return []
        try:
            return self.trainer.train_steps(steps, should_stop)
        except NonFiniteLossError as exc:
            log.warning("%s: θ goes back to the start of round %d", exc, self.round)
            with self.lock:
                self.flat.load_(self.theta_start)
            self.rolled_back = True
            self.rollbacks[NON_FINITE_LOSS] += 1
            return []

    def outer_update(
        self,
        weights: Mapping[str, float],
        received: Mapping[str, torch.Tensor],
        me: str,
        cfg: OuterConfig,
    ) -> OuterResult:
        """Mix θ̃ with the partners' and take the outer step.

        ``received`` must hold exactly the partners in ``weights`` other than ``me``.
        Each partner's θ̃ is first clipped to the trust radius (robust mixing,
        :mod:`gaslocd.algorithm.robust`); W is applied unchanged, and what clipping
        altered moves θ once, beside the outer step, never through m (``split_mix``). A
        step that would make θ non-finite is not taken: θ stays, m restarts from zero,
        and it is counted.

        Under overlap (a θ̃ held by :meth:`hold_tilde`) this completes that round's
        eager step: with D = θ̃_t − Σ_j W_ij θ̃_j, the difference between the mixed and
        the eager outer gradients, m gains D and θ (and the live parameters, which trained
        on from the eager point) move by −η(1 + μ)·D: exactly the Nesterov step with the
        mix, the round's local progress riding on top.
        """
        if self.pending is not None:
            return self._complete_eager(weights, received, me, cfg)
        mixed, direct, consensus, report = _robust_mix(
            self.trust, self.flat.flat, self.theta_start, weights, received, me, cfg.gossip
        )
        with self.lock:
            self.flat.load_(self.theta_start)
            outer_step_(self.flat.flat, self.momentum, mixed, cfg)
            if direct is not None:
                self.flat.flat.add_(direct)
            if not all_finite(self.flat.flat):
                log.warning("round %d: the outer step made θ non-finite; not taken", self.round)
                self.flat.load_(self.theta_start)
                self.momentum.zero_()
                self.rollbacks[NON_FINITE_OUTER] += 1
            self.theta_start = self.flat.clone()
            self.round += 1
        return OuterResult(consensus, report)

    def _complete_eager(
        self,
        weights: Mapping[str, float],
        received: Mapping[str, torch.Tensor],
        me: str,
        cfg: OuterConfig,
    ) -> OuterResult:
        tilde, base = self.pending, self.pending_base
        assert tilde is not None and base is not None
        mixed, direct, consensus, report = _robust_mix(
            self.trust, tilde, base, weights, received, me, cfg.gossip
        )
        diff = tilde.sub(mixed)  # D
        with self.lock:
            self.pending = self.pending_base = None
            if not all_finite(diff) or (direct is not None and not all_finite(direct)):
                log.warning("round %d: the mixed outer step is non-finite; not taken", self.round)
                self.rollbacks[NON_FINITE_OUTER] += 1
                return OuterResult(consensus, report)
            self.momentum.add_(diff)
            step = diff.mul_(-cfg.lr * (1.0 + cfg.momentum))
            if direct is not None:
                step.add_(direct)
            self.theta_start = self.theta_start + step
            self.flat.flat.add_(step)
        return OuterResult(consensus, report)

    def keep_for_long(self, round_: int) -> None:
        """Keep the held θ̃ of ``round_`` for one long exchange landing rounds later (call
        once per long partner; the copy is shared and freed with the last of them)."""
        with self.lock:
            if self.pending is not None and self.pending_base is not None:
                kept = self.long_own.setdefault(round_, [])
                if not kept:
                    base, tilde = self.pending_base, self.pending
                    change = abs(float(tilde.norm()) - float(base.norm()))
                    kept.append((tilde.clone(), distance(base, tilde), change))
                else:
                    kept.append(kept[0])

    def apply_pair_mix(self, round_: int, weight: float, other: torch.Tensor | None) -> bool:
        """A long exchange of ``round_`` has landed (``other``: the partner's θ̃ then; None:
        it failed): move by ``weight``·(θ̃_other − θ̃_own) of that round.

        Both ends apply the opposite move, so their sum, and the network mean, stay put:
        the pairwise average of a doubly stochastic W, only late. The round's own outer
        step already ran without that partner (its weight went to the self weight). θ
        and the live parameters move together, so no pseudo-gradient counts it; a θ̃ on
        the wire is what was sent and stays.
        The partner's θ̃ is clipped to the trust radius of that round first, as in a
        round's mix: a long exchange is no way around robust mixing. Returns whether it
        was applied (False: failed, or our copy went with a resync).
        """
        with self.lock:
            kept = self.long_own.get(round_)
            entry = kept.pop() if kept else None
            if not kept:
                self.long_own.pop(round_, None)
        if entry is None or other is None:
            return False
        own, progress, change = entry
        theirs = other.to(self.device, torch.float32, copy=True)
        used, _ = self.trust.clip(own, {"partner": theirs}, progress, change)
        with self.lock:
            step = used["partner"].sub_(own).mul_(weight)
            if not all_finite(step):
                return False
            self.theta_start = self.theta_start + step  # a new tensor: θ_t may be held
            self.flat.flat.add_(step)
        return True

    def outer_update_from_average(self, average_delta: torch.Tensor, cfg: OuterConfig) -> None:
        """DiLoCo: the outer step on the all-reduced pseudo-gradient Δ̄ = mean(θ − θ̃)."""
        with self.lock:
            mixed = self.theta_start - average_delta.to(self.device)
            self.flat.load_(self.theta_start)
            outer_step_(self.flat.flat, self.momentum, mixed, cfg)
            self.theta_start = self.flat.clone()
            self.round += 1

    def evaluate(self) -> float:
        return self.trainer.evaluate(self.eval_batches)

    # -- snapshots, state transfer, checkpoints ---------------------------------------------

    def snapshot(self) -> Snapshot:
        """Host copies (what GetState streams and checkpoints hold), whatever the device."""
        with self.lock:
            return Snapshot(
                self.round,
                self.theta_start.to("cpu", copy=True),
                self.momentum.to("cpu", copy=True),
                self.trainer.steps_done,
            )

    def tilde_on_host(self) -> torch.Tensor:
        """θ̃ as the wire encodes it: on the CPU (the live vector itself on a CPU worker,
        so it must not change until the exchange is over)."""
        return on_host(self.flat.flat)

    def adopt(self, round_: int, theta: torch.Tensor, momentum: torch.Tensor) -> None:
        """Take a live peer's state (a newcomer): θ, m and the round; inner state stays fresh."""
        for name, t in (("theta", theta), ("outer_momentum", momentum)):
            if t.numel() != self.numel or not bool(torch.isfinite(t).all()):
                raise ValueError(f"peer state {name} is not {self.numel} finite values")
        with self.lock:
            self.theta_start = theta.detach().to(self.device, torch.float32).reshape(-1).clone()
            self.momentum.copy_(momentum.reshape(-1))
            self.round = round_
            self.pending = self.pending_base = None  # in flight: the state left behind
            self.long_own.clear()
            self.flat.load_(self.theta_start)

    def save(self, directory: Path, extra: dict[str, Any], keep: int = 1) -> Path:
        """Write θ (the round's start), m, the inner state and the round, atomically,
        keeping ``keep`` checkpoints in all (the older ones as ``checkpoint.pt.1``, …)."""
        path = Path(directory) / CHECKPOINT_NAME
        with self.lock:
            payload = build_payload(
                fingerprint=self.fingerprint,
                round=self.round,
                # Under overlap, the eager step's θ (with its m): the held round's mixing
                # is what a restart loses, not its steps.
                theta=self.theta_start.to("cpu", copy=True),
                outer_momentum=self.momentum.to("cpu", copy=True),
                inner=self.trainer.state_dict(),
                extra={
                    **extra,
                    "worker_index": self.worker_index,
                    "trust": self.trust.state_dict(),
                },
            )
            save_checkpoint(path, payload, keep=keep)
        return path

    def restore(self, directory: Path, keep: int = 1) -> dict[str, Any]:
        """Load the newest whole checkpoint :meth:`save` wrote for this model (a damaged
        newest one falls back to an older copy); returns its ``extra``."""
        payload, _ = load_newest(
            Path(directory) / CHECKPOINT_NAME, keep=keep, expected_fingerprint=self.fingerprint
        )
        with self.lock:
            self.theta_start = payload["theta"].to(self.device, torch.float32).reshape(-1).clone()
            self.momentum.copy_(payload["outer_momentum"])
            self.round = int(payload["round"])
            self.pending = self.pending_base = None
            self.trainer.load_state_dict(payload["inner"])
            self.flat.load_(self.theta_start)
        extra = dict(payload.get("extra", {}))
        if "trust" in extra and not self.trust.load_state_dict(extra["trust"]):
            log.warning("the checkpoint's trust radius history is damaged: warming up again")
        return extra
