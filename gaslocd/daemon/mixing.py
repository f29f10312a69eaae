"""How a round's θ̃ meets the others': gossip with this round's partners, or DiLoCo's
all-reduce. Both sit behind :class:`Mixer`, so the round driver does not know which runs.

Both end in the train layer's outer step (:class:`~gaslocd.train.worker.Worker`), the
same code the simulator calls; which exchanges count and the row of W they give come
from the protocol (:func:`~gaslocd.protocol.policy.counted_exchanges`,
:func:`~gaslocd.protocol.policy.mixing_row`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gaslocd.daemon.runtime import Runtime
from gaslocd.net.allreduce import AllReduceFailed, HivemindAllReduce
from gaslocd.net.codecs import ErrorFeedback, get_codec
from gaslocd.net.rendezvous import ExchangeResult
from gaslocd.protocol.account import split_exchange
from gaslocd.protocol.plan import RoundSetup
from gaslocd.protocol.policy import counted_exchanges, mixing_row
from gaslocd.train.device import on_host

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixResult:
    consensus: float | None  # RMS distance to the partners' θ̃ (None: nothing mixed)
    exchanged: int  # partners (or all-reduce group members) whose θ̃ entered the mix
    row: dict[str, float] = field(default_factory=dict)  # our row of W as applied
    # The exchange's time by activity (wait_ready, transfer, slow_link); the outer step
    # and bookkeeping are the driver's "other".
    parts: dict[str, float] = field(default_factory=dict)
    clipped: int = 0  # partners whose θ̃ robust mixing pulled in to the trust radius
    rescaled: int = 0  # partners within it whose norm gap alone was cut


class Mixer(Protocol):
    async def mix(self, setup: RoundSetup) -> MixResult:
        """Exchange this round's θ̃, then take the outer step (advances the round)."""


class GossipMixer:
    """Stream θ̃ to this round's partners over gRPC and mix what arrives."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.codec = get_codec(rt.cfg.codec)
        numel = rt.state.numel
        self.feedback = None if self.codec.lossless else ErrorFeedback(self.codec, numel)
        self._buffers: list[torch.Tensor] = []

    async def mix(self, setup: RoundSetup) -> MixResult:
        rt, me = self.rt, self.rt.me
        if not setup.partners or setup.plan is None:
            row = {me: 1.0}
            await rt.thread.call(rt.state.outer_update, row, {}, me, rt.algo.outer)
            return MixResult(None, 0, row)
        tilde = await rt.thread.call(rt.state.tilde_on_host)  # a GPU's copy off the loop
        await rt.server.open_round(
            setup.round,
            tilde,
            setup.partners,
            codec=rt.cfg.codec,
            feedback=self.feedback,
            roster_digest=setup.digest,
            receive_buffers=self._receive_buffers(len(setup.partners)),
        )
        began = rt.clock()
        outcomes = await rt.server.exchange_round(setup.round, setup.deadline_s)
        elapsed = rt.clock() - began
        received: dict[str, torch.Tensor] = {}
        refused_ours: set[str] = set()
        slowest: ExchangeResult | None = None
        for peer, outcome in outcomes.items():
            if not isinstance(outcome, ExchangeResult):
                log.info(
                    "round %d: no exchange with %s: %s (%s)",
                    setup.round,
                    peer,
                    outcome.reason,
                    outcome.detail,
                )
                continue
            received[peer] = outcome.theta
            if outcome.peer_refusal is not None:
                log.info("round %d: %s refused our θ̃ (%s)", setup.round, peer, outcome.peer_refusal)
                rt.telemetry.count_failure("one-sided")
                refused_ours.add(peer)
                continue
            rt.links.record_transfer(peer, outcome.transfer_s, outcome.bytes_received)
            if slowest is None or outcome.wait_s + outcome.transfer_s > (
                slowest.wait_s + slowest.transfer_s
            ):
                slowest = outcome
        counted = counted_exchanges(received, refused_ours)
        row = mixing_row(setup, me, counted)
        used = {p: received[p] for p in counted}
        result = await rt.thread.call(rt.state.outer_update, row, used, me, rt.algo.outer)
        clip = result.clip
        for peer in clip.clipped:
            log.warning(
                "round %d: clipped %s's θ̃ (distance %.4g > trust radius %.4g)",
                setup.round,
                peer,
                clip.distances[peer],
                clip.radius,
            )
        return MixResult(
            result.consensus if used else None,
            len(used),
            row,
            self._parts(elapsed, slowest),
            clipped=len(clip.clipped),
            rescaled=len(clip.rescaled),
        )

    def _parts(self, elapsed: float, slowest: ExchangeResult | None) -> dict[str, float]:
        """The exchange phase by activity: the partner that finished last sets it (the
        others ran alongside); what it does not explain — partners that failed or were
        waited for until the deadline — is waiting too."""
        if slowest is None:
            return {"wait_ready": elapsed}
        parts = split_exchange(
            slowest.wait_s, slowest.transfer_s, slowest.bytes_received, self.rt.links.best_rate()
        )
        parts["wait_ready"] += max(0.0, elapsed - sum(parts.values()))
        return parts

    def _receive_buffers(self, n: int) -> list[torch.Tensor]:
        """Model-sized float32 buffers for partners' θ̃, reused across rounds (one per
        partner): allocating fresh ones every round costs more than the copy itself."""
        while len(self._buffers) < n:
            self._buffers.append(torch.empty(self.rt.state.numel, dtype=torch.float32))
        return self._buffers[:n]


class AllReduceMixer:
    """DiLoCo: all-reduce the pseudo-gradient Δ = θ − θ̃ through hivemind's averager."""

    def __init__(self, rt: Runtime, allreduce: HivemindAllReduce) -> None:
        self.rt, self.allreduce = rt, allreduce

    async def mix(self, setup: RoundSetup) -> MixResult:
        rt = self.rt
        state = rt.state
        delta = await rt.thread.call(lambda: on_host(state.theta_start - state.flat.flat))
        began = rt.clock()
        try:
            average, group = await self.allreduce.average(
                setup.round, delta, timeout_s=setup.deadline_s
            )
        except AllReduceFailed as exc:
            log.info(
                "round %d: no all-reduce (%s); stepping on our own pseudo-gradient",
                setup.round,
                exc,
            )
            rt.telemetry.count_failure("allreduce")
            average, group = delta, 1
        await rt.thread.call(state.outer_update_from_average, average, rt.algo.outer)
        # Idle: the wait for the group to form (everyone waits for the last arrival at the
        # barrier); with no group, the whole failed attempt.
        elapsed = rt.clock() - began
        idle = min(elapsed, self.allreduce.last_group_wait_s) if group > 1 else elapsed
        return MixResult(None, group - 1, {}, {"wait_ready": idle, "transfer": elapsed - idle})
