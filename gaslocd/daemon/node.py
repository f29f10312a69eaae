"""One daemon's life: startup → rounds → graceful shutdown (DESIGN §2).

Order matters. The hivemind DHT (and, in DiLoCo mode, its averager) are child processes
started first, from the main thread, before any gRPC object or torch thread pool exists:
a fork copies those in a broken state. Then one uvloop event loop on the main thread owns
signals, the gRPC server and channels, the heartbeat and the metrics; inner steps run on
one training thread (:class:`~gaslocd.daemon.worker.TrainingThread`).

A round is one coroutine (:meth:`Daemon._round`): roster → partners and H → train →
exchange within a deadline → outer step → evaluate / checkpoint when due. The first
SIGTERM or Ctrl-C stops training after the current step, finishes that round's exchange
within its deadline, writes the checkpoint and withdraws the peer record; a second one
abandons the round (the checkpoint then holds the round's starting point, which is
consistent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import torch
import uvloop

from gaslocd import __version__
from gaslocd.algorithm.outer import renormalized_weights
from gaslocd.config import AlgoConfig, DaemonConfig, TrainConfig, WireConfig
from gaslocd.daemon.metrics import DaemonMetrics
from gaslocd.daemon.replica import Replica, checkpoint_worker_index, worker_index_for
from gaslocd.daemon.report import RunLog
from gaslocd.daemon.rounds import (
    FIRST_DEADLINE_S,
    LinkEstimates,
    RoundSetup,
    catch_up_round,
    plan_this_round,
)
from gaslocd.daemon.worker import TrainingThread
from gaslocd.net.allreduce import AllReduceFailed, HivemindAllReduce
from gaslocd.net.codecs import ErrorFeedback, get_codec
from gaslocd.net.discovery import Discovery, DiscoveryError, PeerRecord
from gaslocd.net.rendezvous import ExchangeResult
from gaslocd.net.server import ExchangeServer
from gaslocd.net.state import PeerState
from gaslocd.net.validation import Identity, WireStats
from gaslocd.train.checkpoint import CheckpointError
from gaslocd.train.data import load_corpus
from gaslocd.train.model import count_parameters

log = logging.getLogger(__name__)

EXIT_OK, EXIT_STARTUP = 0, 3
# A peer waits before running more than MAX_LEAD_ROUNDS ahead of the slowest active peer
# it sees, and jumps forward only when others are at least CATCH_UP_ROUNDS ahead: the gap
# between the two keeps normal jitter (a partner one round ahead, waiting for us) from
# ever skipping a round.
MAX_LEAD_ROUNDS = 1
CATCH_UP_ROUNDS = 2
RESYNC_ROUNDS = 5  # a resumed checkpoint further behind the network takes the network's θ
RESYNC_AFTER_FAILED_ROUNDS = 3  # then take a live peer's state (a healed partition)
READY_TIMEOUT_S = 5.0  # a Ready notice is tiny; a partner that does not take it is gone
RESUME_LOOKAROUND_S = 10.0  # how long a resumed daemon looks for peers before going alone


class StartupError(RuntimeError):
    """The daemon could not start; the message is for the user (exit status 3)."""


class Daemon:
    """Build with validated configs (no I/O), then :meth:`run` it."""

    def __init__(
        self,
        daemon: DaemonConfig,
        algo: AlgoConfig,
        train: TrainConfig,
        wire: WireConfig,
        *,
        role: str,
        progress: Callable[[str], None] = print,
    ) -> None:
        if role not in ("start", "join"):
            raise ValueError(f"role must be start or join, got {role!r}")
        if role == "join" and not daemon.bootstrap:
            raise ValueError("join needs --bootstrap ADDRESS (printed by 'gaslocd start')")
        self.cfg, self.algo, self.train, self.wire = daemon, algo.resolved(), train, wire
        self.role, self.progress = role, progress
        self.stats = WireStats()
        self.links = LinkEstimates()
        self.stopping = False
        self._signals = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._main: asyncio.Task[Any] | None = None
        self._buffers: list[torch.Tensor] = []
        self._others_seen_at = -math.inf  # when the roster last held another peer
        self._failed_rounds = 0  # consecutive rounds with partners and no exchange

    # -- entry point ---------------------------------------------------------------------

    def run(self) -> int:
        """Start the child processes, then the event loop; returns the exit status."""
        corpus = load_corpus(self.train.data)
        numel = count_parameters(
            self.train.model, vocab_size=corpus.vocab_size, seq_len=self.train.seq_len
        )
        self.discovery = Discovery(
            self.cfg.run_id,
            initial_peers=self.cfg.bootstrap,
            host=self.cfg.host,
            dht_port=self.cfg.dht_port,
            announce_host=self.cfg.announce_host,
            record_ttl_s=self.cfg.record_ttl_s,
        )
        self.allreduce: HivemindAllReduce | None = None
        try:
            self.discovery.start()
            if self.algo.algo == "diloco":
                self.allreduce = HivemindAllReduce(
                    self.discovery,
                    prefix=f"{self.cfg.run_id}-diloco",
                    numel=numel,
                    target_group_size=max(2, self.cfg.min_peers),
                    codec=self.cfg.codec,
                )
                self.allreduce.start()
        except (DiscoveryError, AllReduceFailed) as exc:
            self.discovery.shutdown()
            raise StartupError(str(exc)) from exc
        try:
            worker_index = worker_index_for(self.discovery.peer_id)
            if self.cfg.resume and self.cfg.checkpoint_dir:
                worker_index = (
                    checkpoint_worker_index(Path(self.cfg.checkpoint_dir)) or worker_index
                )
            self.replica = Replica(self.train, corpus, worker_index)
            self.me = self.discovery.peer_id
            self.codec = get_codec(self.cfg.codec)
            self.message_bytes = self.codec.encoded_nbytes(self.replica.numel)
            self.feedback = (
                None if self.codec.lossless else ErrorFeedback(self.codec, self.replica.numel)
            )
            self.metrics = DaemonMetrics(
                self.stats,
                peer_id=self.me,
                run_id=self.cfg.run_id,
                settings={
                    "algo": self.algo.algo,
                    "topology": self.algo.topology,
                    "codec": self.cfg.codec,
                    "model": self.train.model,
                },
            )
            self.runlog = RunLog(self.me)
            return uvloop.run(self._main_coroutine())
        finally:
            if self.allreduce is not None:
                self.allreduce.shutdown()
            self.discovery.shutdown()

    async def _main_coroutine(self) -> int:
        self._main = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        self.worker = TrainingThread()
        self.server = ExchangeServer(
            self.wire, Identity(self.cfg.run_id, self.me, self.replica.fingerprint), self.stats
        )
        started = False
        try:
            await self._startup()
            started = True
            self.runlog.start_clock()  # idle fraction counts from the first round
            while not self.stopping and not (
                self.cfg.max_rounds and self.replica.round >= self.cfg.max_rounds
            ):
                await self._round()
            return EXIT_OK
        except asyncio.CancelledError:
            if self._signals == 0:
                raise
            log.warning("second signal: abandoning the round")
            return EXIT_OK
        finally:
            await self._shutdown(started)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            self.progress(
                "stopping: finishing this round's exchange, then checkpoint and leave "
                "(again to force)"
            )
            self.stopping = True
            self.worker.stop.set()
        elif self._main is not None:
            self._main.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- startup -------------------------------------------------------------------------

    async def _startup(self) -> None:
        try:
            port = await self.server.start(self.cfg.host, self.cfg.port)
        except Exception as exc:
            raise StartupError(
                f"cannot listen on {self.cfg.host}:{self.cfg.port} ({exc}); "
                "is another daemon using that port? pass --port 0 for a free one"
            ) from exc
        self.address = self.cfg.grpc_address(port)
        self.server.set_state_provider(self._state_for_newcomer)
        self.server.set_status_provider(self._status_fields)
        if self.cfg.metrics_port is not None:
            try:
                self.metrics_port = self.metrics.serve(self.cfg.metrics_port, self.cfg.host)
            except OSError as exc:
                raise StartupError(
                    f"cannot serve metrics on port {self.cfg.metrics_port}: {exc}"
                ) from exc
        active_from = 0
        if self.cfg.resume:
            await self._restore()
        if self.role == "join" or self.cfg.resume:
            network_round = await self._join_network()
            if network_round is not None and (network_round > 0 or self.cfg.min_peers == 1):
                active_from = max(self.replica.round, network_round) + self.cfg.join_lead_rounds
        self.active_from = active_from
        await self._publish()
        # Heartbeats start now, not after the lobby: a record not refreshed while we wait
        # for peers would expire and make us invisible to the very peers we wait for.
        self._spawn(self._heartbeat())
        bootstrap = self.discovery.bootstrap_addresses()
        if self.cfg.address_file:
            path = Path(self.cfg.address_file)
            path.write_text("\n".join(bootstrap) + "\n")
        self.progress(
            f"gaslocd {__version__} {self.role}: peer {self.me} run {self.cfg.run_id} "
            f"gRPC {self.address} round {self.replica.round} (active from {active_from}), "
            f"model {self.train.model} {self.replica.numel:,} params, "
            f"{self.algo.algo}/{self.algo.topology} "
            f"codec {self.cfg.codec}"
            + (f" metrics :{self.metrics_port}" if self.cfg.metrics_port is not None else "")
        )
        self.progress(f"bootstrap address: {bootstrap[0]}")
        if self.cfg.min_peers > 1 and active_from == 0:  # a run that has not started yet
            await self._lobby()

    async def _restore(self) -> None:
        directory = Path(self.cfg.checkpoint_dir or ".")
        try:
            await self.worker.call(self.replica.restore, directory)
        except CheckpointError as exc:
            raise StartupError(f"cannot resume: {exc}") from exc
        self.progress(f"resumed from {directory} at round {self.replica.round}")

    async def _others(self) -> list[PeerRecord]:
        records = await self.discovery.roster(self.replica.fingerprint)
        return [r for r in records if r.peer_id != self.me]

    async def _join_network(self) -> int | None:
        """Find live peers; a newcomer takes the most advanced one's state (GetState).

        A resumed daemon keeps its own θ unless its checkpoint is more than
        ``RESYNC_ROUNDS`` behind the network: then its θ is far from everyone's (peers
        would refuse it by the norm bound for good), and the network's θ, which already
        holds what this peer contributed before it stopped, is the better start. Its
        AdamW state and data position still come from the checkpoint.
        """
        wait_s = (
            min(self.cfg.min_peers_timeout_s, RESUME_LOOKAROUND_S)
            if self.cfg.resume
            else self.cfg.min_peers_timeout_s
        )
        deadline = time.monotonic() + wait_s
        others: list[PeerRecord] = []
        while not others:
            if self.stopping or time.monotonic() > deadline:
                if self.cfg.resume:
                    return None  # resume alone
                raise StartupError(
                    f"no peer of run {self.cfg.run_id!r} with this model answered within "
                    f"{wait_s:g} s (check --bootstrap, --run-id and --model)"
                )
            with contextlib.suppress(DiscoveryError):
                others = await self._others()
            if not others:
                await asyncio.sleep(0.25)  # polling the DHT, bounded by the deadline above
        network_round = max(r.round for r in others)
        if self.cfg.resume:
            lag = network_round - self.replica.round
            if lag <= RESYNC_ROUNDS:
                self.replica.round = max(self.replica.round, network_round)
                return network_round
            self.progress(
                f"checkpoint is {lag} rounds behind the network: taking its θ and outer "
                "momentum (AdamW state and data position kept from the checkpoint)"
            )
        return await self._fetch_state(others)

    async def _fetch_state(self, others: list[PeerRecord]) -> int:
        expected = {"theta": self.replica.numel, "outer_momentum": self.replica.numel}
        errors = []
        for record in sorted(others, key=lambda r: -r.round):
            try:
                state = await self.server.client.fetch_state(record.address, expected, 120.0)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    raise StartupError(
                        f"peer {record.address} refused our join token: {exc.details()}"
                    ) from exc
                errors.append(f"{record.address}: {exc.code().name} {exc.details()}")
                continue
            except Exception as exc:  # a refused or malformed state: try another peer
                errors.append(f"{record.address}: {exc}")
                continue
            # Never step back: the wire refuses to reopen a round it already served.
            await self.worker.call(
                self.replica.adopt,
                max(state.round, self.replica.round),
                state.tensors["theta"],
                state.tensors["outer_momentum"],
            )
            self.progress(f"took state of round {state.round} from {record.address}")
            return state.round
        raise StartupError("could not fetch the run's state from any peer: " + "; ".join(errors))

    async def _lobby(self) -> None:
        """Wait until ``min_peers`` peers (self included) are in the roster of the next round."""
        deadline = time.monotonic() + self.cfg.min_peers_timeout_s
        while not self.stopping:
            with contextlib.suppress(DiscoveryError):
                records = await self.discovery.roster(self.replica.fingerprint)
                if (
                    len([r for r in records if r.active_from <= self.replica.round])
                    >= self.cfg.min_peers
                ):
                    return
            if time.monotonic() > deadline:
                raise StartupError(
                    f"fewer than {self.cfg.min_peers} peers joined within "
                    f"{self.cfg.min_peers_timeout_s:g} s"
                )
            await asyncio.sleep(0.25)  # polling the DHT, bounded by the deadline above

    # -- records -------------------------------------------------------------------------

    def _record(self) -> PeerRecord:
        return PeerRecord(
            peer_id=self.me,
            address=self.address,
            fingerprint=self.replica.fingerprint,
            round=self.replica.round,
            inner_steps=self.runlog.last_inner_steps or self.algo.inner_steps,
            step_time_s=float(self.links.step_time_s or 0.0),
            bandwidth_bytes_per_s=float(self.links.own_bandwidth()),
            version=__version__,
            started_at=self.runlog.started_at,
            active_from=self.active_from,
        )

    async def _publish(self) -> None:
        try:
            await self.discovery.publish(self._record())
        except DiscoveryError as exc:
            log.warning("publishing our record failed (retrying at the next heartbeat): %s", exc)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            try:
                await self._publish()
            except Exception:  # a heartbeat that dies silently would drop us from rosters
                log.exception("heartbeat failed; retrying at the next one")

    # -- one round -----------------------------------------------------------------------

    async def _round(self) -> None:
        t = self.replica.round
        try:
            records = await self.discovery.roster(self.replica.fingerprint)
        except DiscoveryError as exc:
            log.warning("roster unavailable this round, training alone: %s", exc)
            records = []
        if any(r.peer_id != self.me for r in records):
            self._others_seen_at = time.monotonic()
        t = self._catch_up(t, records)
        records = await self._pace(t, records)
        self._spawn(self._publish())  # peers pace and catch up on our current round
        setup = plan_this_round(
            self.algo,
            self.cfg.run_id,
            self.me,
            t,
            records,
            self.links,
            self.message_bytes,
            self.cfg.exchange_deadline_s,
        )
        await self.worker.call(self.replica.begin_round)
        began = time.monotonic()
        losses = await self.worker.call(
            self.replica.trainer.train_steps, setup.inner_steps, self.worker.should_stop
        )
        if self.replica.trainer.last_step_s is not None and losses:
            self.links.record_step_time(self.replica.trainer.last_step_s)
        if self.algo.algo != "diloco" and self.algo.adapt_h and setup.partners:
            losses += await self._fill_wait(setup, len(losses))
        exchange_began = time.monotonic()
        compute_s = exchange_began - began
        if self.algo.algo == "diloco":
            consensus, idle_s, ok = await self._allreduce(setup)
        else:
            consensus, idle_s, ok = await self._exchange(setup)
            await self._resync_if_cut_off(setup, ok, records)
        exchange_s = time.monotonic() - exchange_began
        if not setup.partners and time.monotonic() - self._others_seen_at < self.cfg.record_ttl_s:
            await self._pace_solo_round(setup, began)
        self.metrics.exchange_seconds.observe(exchange_s)
        val = None
        due = self.cfg.eval_every and (self.replica.round % self.cfg.eval_every == 0)
        last = self.cfg.max_rounds and self.replica.round >= self.cfg.max_rounds
        if due or last or self.stopping:
            val = await self.worker.call(self.replica.evaluate)
        if self.cfg.checkpoint_dir and self.replica.round % self.cfg.checkpoint_every == 0:
            await self._checkpoint()
        tokens = len(losses) * self.replica.trainer.tokens_per_step
        self.metrics.tokens += tokens
        self.metrics.idle_seconds += idle_s
        line = self.runlog.add(
            setup,
            losses,
            val,
            consensus,
            idle_s,
            time.monotonic() - began,
            tokens,
            ok,
            self.stats,
            compute_s=compute_s,
            exchange_s=exchange_s,
        )
        self._export(setup, losses, val, consensus)
        self.progress(line)

    async def _fill_wait(self, setup: RoundSetup, done: int) -> list[float]:
        """Tell this round's partners we are ready, and train on until they are too.

        H is chosen from estimates, and on shared or busy machines a partner can start or
        step later than expected; rather than idle until its θ̃ arrives, the peer that
        finished first keeps taking steps (up to H_max, and for at most the exchange
        deadline: a dead partner is then handled as before) until every partner's Ready
        notice is in. The exchange then starts at most one step after the last partner
        is ready, and no one waits with a GPU idle.
        """
        for address in setup.partners.values():
            self._spawn(self._notify_ready(address, setup.round))
        partners = list(setup.partners)
        room = self.algo.h_upper - done
        if room <= 0 or self.server.partners_ready(setup.round, partners):
            return []
        limit = time.monotonic() + setup.deadline_s
        stop = self.worker.should_stop

        def enough() -> bool:
            return (
                stop()
                or self.server.partners_ready(setup.round, partners)
                or time.monotonic() >= limit
            )

        return await self.worker.call(self.replica.trainer.train_steps, room, enough)

    async def _notify_ready(self, address: str, round_: int) -> None:
        try:
            await self.server.client.notify_ready(address, round_, READY_TIMEOUT_S)
        except Exception as exc:  # the exchange itself reports an unreachable partner
            log.debug("round %d: Ready notice to %s failed: %s", round_, address, exc)

    def _catch_up(self, t: int, records: list[PeerRecord]) -> int:
        """Jump to the round active peers are in, if they are ahead of us.

        Round numbers only name pairings; skipping some loses no training. Without this,
        a peer that fell behind (a long pause, a missed roster, a restart) would ask for
        rounds its partners have left, be refused as stale, and never pair again.
        """
        ahead = catch_up_round(t, records, self.me, CATCH_UP_ROUNDS)
        if ahead == t:
            return t
        log.info("round %d: peers are at round %d, catching up", t, ahead)
        with self.replica.lock:
            self.replica.round = ahead
        return ahead

    async def _resync_if_cut_off(
        self, setup: RoundSetup, ok: int, records: list[PeerRecord]
    ) -> None:
        """After RESYNC_AFTER_FAILED_ROUNDS rounds in a row with partners but no exchange,
        take a live peer's state (GetState), keeping our AdamW state and data position.

        This is how a peer comes back after a partition: while cut off it trained alone,
        and once its θ is further from its partners' than their norm bound allows, every
        exchange is refused for good; gossip alone cannot pull it back.
        """
        if not setup.partners or ok:
            self._failed_rounds = 0
            return
        self._failed_rounds += 1
        if self._failed_rounds < RESYNC_AFTER_FAILED_ROUNDS:
            return
        others = [r for r in records if r.peer_id != self.me]
        if not others:
            return
        self._failed_rounds = 0
        try:
            round_ = await self._fetch_state(others)
        except StartupError as exc:  # nobody answered: keep training, try again later
            log.warning("could not resynchronize: %s", exc)
            return
        self.metrics.count_failure("resync")
        log.warning(
            "no exchange succeeded for %d rounds: took the state of round %d",
            RESYNC_AFTER_FAILED_ROUNDS,
            round_,
        )

    async def _pace_solo_round(self, setup: RoundSetup, began: float) -> None:
        """A round without partners (sitting out, or alone in a transient roster) still
        takes the target round time T when others exist: otherwise it would run rounds
        back to back and leave the network behind, as a round's pairing needs everyone
        at the same round."""
        if setup.target_round_s is None:
            return
        remaining = setup.target_round_s - (time.monotonic() - began)
        if remaining > 0:
            await asyncio.sleep(min(remaining, setup.target_round_s))

    async def _pace(self, t: int, records: list[PeerRecord]) -> list[PeerRecord]:
        """Wait (bounded) while an active peer is more than ``MAX_LEAD_ROUNDS`` behind us.

        The counterpart of :meth:`_catch_up`. A peer whose partners fail fast (refused as
        stale or future, or gone) would otherwise run rounds alone as fast as it can and
        leave the others behind for good; with both rules the rounds of live peers stay
        within a couple of each other. A peer that never catches up (dead, partitioned)
        costs at most one deadline here, then its record expires.
        """
        deadline = time.monotonic() + (self.cfg.exchange_deadline_s or FIRST_DEADLINE_S)
        while not self.stopping and time.monotonic() < deadline:
            behind = [
                r
                for r in records
                if r.peer_id != self.me and r.active_from <= r.round < t - MAX_LEAD_ROUNDS
            ]
            if not behind:
                break
            await asyncio.sleep(0.1)  # polling the DHT, bounded by the deadline above
            with contextlib.suppress(DiscoveryError):
                records = await self.discovery.roster(self.replica.fingerprint)
        return records

    async def _exchange(self, setup: RoundSetup) -> tuple[float | None, float, int]:
        """Gossip: stream θ̃ to this round's partners and mix what arrives."""
        if not setup.partners or setup.plan is None:
            await self.worker.call(
                self.replica.outer_update, {self.me: 1.0}, {}, self.me, self.algo.outer
            )
            return None, 0.0, 0
        await self.server.open_round(
            setup.round,
            self.replica.flat.flat,
            setup.partners,
            codec=self.cfg.codec,
            feedback=self.feedback,
            roster_digest=setup.digest,
            receive_buffers=self._receive_buffers(len(setup.partners)),
        )
        began = time.monotonic()
        outcomes = await self.server.exchange_round(setup.round, setup.deadline_s)
        elapsed = time.monotonic() - began
        received: dict[str, torch.Tensor] = {}
        transfer = 0.0
        for peer, outcome in outcomes.items():
            if isinstance(outcome, ExchangeResult) and outcome.peer_refusal is not None:
                # We got θ̃_j but j refused ours: mixing it would make this round's W
                # one-sided (not doubly stochastic), so neither side uses the exchange.
                log.info("round %d: %s refused our θ̃ (%s)", setup.round, peer, outcome.peer_refusal)
                self.metrics.count_failure("one-sided")
            elif isinstance(outcome, ExchangeResult):
                received[peer] = outcome.theta
                self.links.record_transfer(peer, outcome.transfer_s, outcome.bytes_received)
                transfer = max(transfer, outcome.transfer_s)
            else:
                log.info(
                    "round %d: no exchange with %s: %s (%s)",
                    setup.round,
                    peer,
                    outcome.reason,
                    outcome.detail,
                )
        row = renormalized_weights(setup.plan.mixing_weights(self.me), self.me, set(received))
        consensus = await self.worker.call(
            self.replica.outer_update, row, received, self.me, self.algo.outer
        )
        return (consensus if received else None), max(0.0, elapsed - transfer), len(received)

    def _receive_buffers(self, n: int) -> list[torch.Tensor]:
        """Model-sized float32 buffers for partners' θ̃, reused across rounds (one per
        partner): allocating fresh ones every round costs more than the copy itself."""
        while len(self._buffers) < n:
            self._buffers.append(torch.empty(self.replica.numel, dtype=torch.float32))
        return self._buffers[:n]

    async def _allreduce(self, setup: RoundSetup) -> tuple[float | None, float, int]:
        """DiLoCo: all-reduce the pseudo-gradient Δ = θ − θ̃ through hivemind's averager."""
        assert self.allreduce is not None
        delta = await self.worker.call(lambda: self.replica.theta_start - self.replica.flat.flat)
        began = time.monotonic()
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
            self.metrics.count_failure("allreduce")
            average, group = delta, 1
        await self.worker.call(self.replica.outer_update_from_average, average, self.algo.outer)
        # Idle: the wait for the group to form (everyone waits for the last arrival at the
        # barrier); with no group, the whole failed attempt.
        idle = self.allreduce.last_group_wait_s if group > 1 else time.monotonic() - began
        return None, idle, group - 1

    def _export(
        self, setup: RoundSetup, losses: list[float], val: float | None, consensus: float | None
    ) -> None:
        m = self.metrics
        m.rounds += 1
        m.round.set(self.replica.round)
        m.inner_steps.set(setup.inner_steps)
        m.peers.set(setup.roster_size)
        m.partners.set(len(setup.partners))
        if losses:
            m.train_loss.set(sum(losses) / len(losses))
        if val is not None:
            m.val_loss.set(val)
        if consensus is not None:
            m.consensus.set(consensus)
        if self.links.step_time_s is not None:
            m.step_seconds.set(self.links.step_time_s)
        if self.links.bandwidth:
            m.bandwidth.set(self.links.own_bandwidth())
        m.idle_ratio.set(self.runlog.idle_fraction())

    # -- state for others, status, checkpoints ---------------------------------------------

    def _state_for_newcomer(self) -> PeerState:
        snap = self.replica.snapshot()
        return PeerState(
            round=snap.round,
            data_position=snap.data_position,
            tensors={"theta": snap.theta, "outer_momentum": snap.momentum},
        )

    def _status_fields(self) -> dict[str, object]:
        return {
            "round": self.replica.round,
            "inner_steps": self.runlog.last_inner_steps,
            "train_loss": self.runlog.last_train_loss,
            "val_loss": self.runlog.last_val_loss,
            "peers": self.runlog.last_roster_size,
            "idle_fraction": round(self.runlog.idle_fraction(), 4),
            "algo": f"{self.algo.algo}/{self.algo.topology}",
            "codec": self.cfg.codec,
            "model": self.train.model,
            "address": self.address,
        }

    async def _checkpoint(self) -> None:
        directory = Path(self.cfg.checkpoint_dir or ".")
        directory.mkdir(parents=True, exist_ok=True)
        extra = {"run_id": self.cfg.run_id, "peer_id": self.me, "saved_at": time.time()}
        path = await self.worker.call(self.replica.save, directory, extra)
        log.info("checkpoint of round %d written to %s", self.replica.round, path)

    # -- shutdown ------------------------------------------------------------------------

    async def _shutdown(self, started: bool) -> None:
        """Ordered and bounded: stop tasks, checkpoint, withdraw, stop serving, report."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if started and self.cfg.checkpoint_dir:
            try:
                await asyncio.wait_for(self._checkpoint(), self.cfg.shutdown_grace_s)
            except Exception:
                log.exception("final checkpoint failed")
        if started:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.discovery.withdraw(), 5.0)
        await self.server.stop(2.0)
        self.metrics.stop()
        self.worker.shutdown()
        if started and self.cfg.summary_json:
            self.runlog.write_summary(Path(self.cfg.summary_json), self._summary_args(), self.stats)
        if started:
            self.progress(self.runlog.closing_line(self.stats))

    def _summary_args(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "role": self.role,
            "daemon": asdict(self.cfg),
            "algo": asdict(self.algo),
            "train": asdict(self.train),
        }
