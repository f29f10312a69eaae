"""One daemon's life: startup → rounds → graceful shutdown (docs/design.md §2).

Order matters. The hivemind DHT (and, in DiLoCo mode, its averager) are child processes
started first, from the main thread, before any gRPC object or torch thread pool exists:
a fork copies those in a broken state. Then one uvloop event loop on the main thread owns
signals, the gRPC server and channels, the heartbeat and the metrics; inner steps run on
one training thread (:class:`~gaslocd.daemon.worker.TrainingThread`).

The first SIGTERM or Ctrl-C stops training after the current step, finishes that round's
exchange within its deadline and the stop budget (``--stop-timeout``, less what the
checkpoint needs: :class:`~gaslocd.daemon.signals.StopBudget`), writes the checkpoint and
withdraws the peer record. A second one abandons whatever is in progress (the round, or
the final checkpoint, whose write is atomic) and exits promptly. The signal handlers
installed before the daemon ran are restored when it returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

from gaslocd import __version__
from gaslocd.config import AlgoConfig, DaemonConfig, TrainConfig, WireConfig
from gaslocd.daemon import reach, signals
from gaslocd.daemon.checkpoints import prepare as prepare_checkpoints
from gaslocd.daemon.driver import RoundDriver
from gaslocd.daemon.membership import Membership, StartupError
from gaslocd.daemon.metrics import DaemonMetrics
from gaslocd.daemon.mixing import AllReduceMixer, GossipMixer, Mixer
from gaslocd.daemon.report import RunLog
from gaslocd.daemon.runtime import Runtime, call_auth
from gaslocd.daemon.signals import StopBudget
from gaslocd.daemon.telemetry import Telemetry
from gaslocd.daemon.worker import TrainingThread
from gaslocd.net.allreduce import AllReduceFailed, HivemindAllReduce
from gaslocd.net.codecs import get_codec
from gaslocd.net.discovery import Discovery, DiscoveryError
from gaslocd.net.server import ExchangeServer
from gaslocd.net.state import PeerState
from gaslocd.net.tasks import cancel_and_wait
from gaslocd.net.validation import Identity, WireStats
from gaslocd.protocol.policy import RoundPolicy
from gaslocd.train.checkpoint import CheckpointError, checkpoint_worker_index
from gaslocd.train.data import load_corpus
from gaslocd.train.export import SPEC_KEY, TOKENIZER_KEY, ModelSpec
from gaslocd.train.model import count_parameters
from gaslocd.train.worker import Worker, worker_index_for

__all__ = ["EXIT_OK", "EXIT_STARTUP", "Daemon", "StartupError"]

log = logging.getLogger(__name__)

EXIT_OK, EXIT_STARTUP = 0, 3


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
        worker: Worker | None = None,
    ) -> None:
        """``worker``: the library API's worker around a user's model (its loop trains; the
        daemon then runs on the caller's thread of choice and leaves signals alone)."""
        if role not in ("start", "join"):
            raise ValueError(f"role must be start or join, got {role!r}")
        if role == "join" and not daemon.bootstrap:
            raise ValueError("join needs --bootstrap ADDRESS (printed by 'gaslocd start')")
        self.cfg, self.algo, self.train, self.wire = daemon, algo.resolved(), train, wire
        self.role, self.progress = role, progress
        self.stats = WireStats()
        self._signals = 0
        self._force = asyncio.Event()
        self._shutting_down = False
        self._late_signal = False
        self._main: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_asked = False
        self.rt: Runtime | None = None
        self.embedded = worker is not None
        self.handles_signals = not self.embedded  # daemon/host.py sets it: serve is on main
        if worker is not None:
            self.state = worker

    # -- entry point ---------------------------------------------------------------------

    def run(self) -> int:
        """Start the child processes, then the event loop; returns the exit status."""
        self.prepare()
        return self.serve()

    def prepare(self) -> None:
        """Checkpoints, model, the DHT and averager processes: forked before gRPC runs."""
        self.cfg, note = prepare_checkpoints(self.cfg)
        if note:
            self.progress(note)
        corpus, self._spec, self._tokenizer = None, None, None
        if self.embedded:
            numel = self.state.numel
        else:
            corpus = load_corpus(self.train.data)
            self._spec = ModelSpec(self.train.model, corpus.vocab_size, self.train.seq_len)
            self._tokenizer = corpus.tokenizer_json
            numel = count_parameters(
                self.train.model, vocab_size=corpus.vocab_size, seq_len=self.train.seq_len
            )
        self.budget = StopBudget(self.cfg.stop_timeout_s, 4 * numel)
        if why := self.budget.too_short(self.cfg.exchange_deadline_s):
            log.warning(why)
        self._start_children(numel)
        try:
            self.me = self.discovery.peer_id
            if corpus is not None:
                index = worker_index_for(self.me)
                if self.cfg.resume and self.cfg.checkpoint_dir:
                    index = checkpoint_worker_index(Path(self.cfg.checkpoint_dir)) or index
                self.state = Worker(self.train, corpus, index)
            self.metrics = DaemonMetrics(
                self.stats,
                peer_id=self.me,
                run_id=self.cfg.run_id,
                settings={
                    "algo": self.algo.algo,
                    "topology": self.algo.topology,
                    "codec": self.cfg.codec,
                    "model": self.train.model,
                    "device": str(self.state.device),
                    "precision": self.state.trainer.precision,
                },
            )
            self.telemetry = Telemetry(self.metrics, RunLog(self.me), self.stats)
        except BaseException:
            previous = signals.current_handlers()
            signals.stop_children(self.discovery, self.allreduce, self._late_signal)
            signals.restore_handlers(previous)
            raise

    def _start_children(self, numel: int) -> None:
        """The DHT process (and DiLoCo's averager): a failure is a StartupError."""
        cfg = self.cfg
        self.discovery = Discovery(
            cfg.run_id, initial_peers=cfg.bootstrap, host=cfg.host, dht_port=cfg.dht_port,
            announce_host=cfg.announce_host, record_ttl_s=cfg.record_ttl_s,
            heartbeat_s=cfg.heartbeat_s, token=self.wire.token,
            identity_path=cfg.identity_file,
            client_mode=cfg.reachable == "no" or reach.probes(cfg),
        )  # fmt: skip
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
                    client_mode=self.cfg.reachable == "no",  # auto: a server, or it stops
                )
                self.allreduce.start()
        except (DiscoveryError, AllReduceFailed) as exc:
            self.discovery.shutdown()
            raise StartupError(str(exc)) from exc

    def serve(self) -> int:
        """The event loop, until the run ends or a stop; then the children stop."""
        previous = signals.current_handlers()
        try:
            return uvloop.run(self._main_coroutine())
        finally:
            signals.stop_children(self.discovery, self.allreduce, self._late_signal)
            signals.restore_handlers(previous)

    def request_stop(self) -> None:
        """Stop as at a first signal, from any thread (the library API's close)."""
        self._stop_asked = True
        loop = self._loop
        if loop is not None and self.rt is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_signal)

    def _build_runtime(self) -> Runtime:
        me = Identity(self.cfg.run_id, self.me, self.state.fingerprint)
        auth = call_auth(self.cfg.run_id, self.wire.token, self.discovery)
        server = ExchangeServer(self.wire, me, self.stats, auth=auth)
        rt = Runtime(
            cfg=self.cfg,
            algo=self.algo,
            train=self.train,
            wire=self.wire,
            role=self.role,
            me=self.me,
            state=self.state,
            thread=TrainingThread(),
            server=server,
            discovery=self.discovery,
            telemetry=self.telemetry,
            policy=RoundPolicy(self.me, self.cfg.record_ttl_s, self.algo.h_upper),
            progress=self.progress,
            message_bytes=get_codec(self.cfg.codec).encoded_nbytes(self.state.numel),
        )
        mixer: Mixer = (
            AllReduceMixer(rt, self.allreduce) if self.allreduce is not None else GossipMixer(rt)
        )
        self.membership = Membership(rt)
        if isinstance(mixer, GossipMixer):
            mixer.roster = self.membership.roster
        self.driver = RoundDriver(rt, self.membership, mixer, self._checkpoint)
        return rt

    async def _main_coroutine(self) -> int:
        self._main = asyncio.current_task()
        self._force = asyncio.Event()
        self._loop = loop = asyncio.get_running_loop()
        for sig in signals.SIGNALS if self.handles_signals else ():
            loop.add_signal_handler(sig, self._on_signal)
        self.rt = rt = self._build_runtime()
        if self._stop_asked:
            self._on_signal()
        started = False
        try:
            await self._startup()
            started = True
            rt.telemetry.runlog.start_clock()  # the time account starts with the first round
            self.driver.mark = rt.clock()
            while not rt.stopping and not (
                self.cfg.max_rounds and rt.state.round >= self.cfg.max_rounds
            ):
                await self.driver.run_round()
            return EXIT_OK
        except asyncio.CancelledError:
            if self._signals == 0:
                raise
            log.warning("second signal: abandoning the round")
            return EXIT_OK
        finally:
            await self._shutdown(started)
            # Straight from the loop's handler to one that only takes note, never through
            # the default action (remove_signal_handler installs SIG_DFL: a signal then
            # kills with -15), and never raising inside the closing loop, which breaks it.
            # The loop finds its entries already replaced when it closes and leaves them.
            signals.set_handlers(self._note_late_signal)

    def _on_signal(self) -> None:
        self._signals += 1
        assert self.rt is not None
        if self._signals == 1:
            loop = asyncio.get_running_loop()
            cut = self.budget.signalled(loop.time())
            loop.call_later(cut, self.rt.server.board.cut.set)
            self.progress(
                f"stopping: finishing this round's exchange (for {cut:.0f} s at most), then "
                "checkpoint and leave (again to force)"
            )
            self.rt.stopping = True
            self.rt.thread.stop.set()
            return
        self._force.set()  # abandons the final checkpoint, if that is what runs
        if not self._shutting_down and self._main is not None and not self._main.done():
            self._main.cancel()

    def _note_late_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self._late_signal = True

    # -- startup -------------------------------------------------------------------------

    async def _startup(self) -> None:
        rt, cfg = self._runtime(), self.cfg
        try:
            port = await rt.server.start(cfg.host, cfg.port)
        except Exception as exc:
            raise StartupError(
                f"cannot listen on {cfg.host}:{cfg.port} ({exc}); "
                "is another daemon using that port? pass --port 0 for a free one"
            ) from exc
        rt.address = cfg.grpc_address(port)
        rt.server.set_state_provider(self._state_for_newcomer)
        rt.server.status_provider = self._status_fields
        metrics_text = ""
        if cfg.metrics_port is not None:
            try:
                bound = self.metrics.serve(cfg.metrics_port, cfg.metrics_host)
            except OSError as exc:
                raise StartupError(
                    f"cannot serve metrics on port {cfg.metrics_port}: {exc}"
                ) from exc
            metrics_text = f" metrics :{bound}"
        await reach.settle(rt, all_reduce=self.allreduce is not None)
        if cfg.resume:
            await self._restore()
        if self.role == "join" or cfg.resume:
            network_round = await self.membership.join_network()
            if network_round is not None and (network_round > 0 or cfg.min_peers == 1):
                rt.active_from = max(rt.state.round, network_round) + cfg.join_lead_rounds
        if rt.links.step_time_s is None:  # our record's step time: the first plan's T
            rt.links.step_time_s = await rt.thread.call(rt.state.trainer.time_step)
        await self.membership.publish()
        # Heartbeats start now, not after the lobby: a record not refreshed while we wait
        # for peers would expire and make us invisible to the very peers we wait for.
        rt.spawn(self.membership.heartbeat())
        bootstrap = reach.share_bootstrap(rt)
        self.progress(
            f"gaslocd {__version__} {self.role}: peer {rt.me} run {cfg.run_id} "
            f"gRPC {rt.address} round {rt.state.round} (active from {rt.active_from}), "
            f"model {self.train.model} {rt.state.numel:,} params on {rt.state.device} "
            f"{rt.state.trainer.precision}, "
            f"{self.algo.algo}/{self.algo.topology} codec {cfg.codec}{metrics_text}"
        )
        self.progress(bootstrap)
        if cfg.min_peers > 1 and rt.active_from == 0:  # a run that has not started yet
            await self.membership.lobby()

    def _runtime(self) -> Runtime:
        assert self.rt is not None, "the runtime exists once the event loop runs"
        return self.rt

    async def _restore(self) -> None:
        directory = Path(self.cfg.checkpoint_dir or ".")
        try:
            await self._runtime().thread.call(
                self.state.restore, directory, self.cfg.keep_checkpoints
            )
        except CheckpointError as exc:
            raise StartupError(f"cannot resume: {exc}") from exc
        self.progress(f"resumed from {directory} at round {self.state.round}")

    # -- state for others, status, checkpoints ---------------------------------------------

    def _state_for_newcomer(self) -> PeerState:
        snap = self.state.snapshot()
        return PeerState(
            round=snap.round,
            data_position=snap.data_position,
            tensors={"theta": snap.theta, "outer_momentum": snap.momentum},
        )

    def _status_fields(self) -> dict[str, object]:
        runlog = self.telemetry.runlog
        return {
            "round": self.state.round,
            "inner_steps": runlog.last_inner_steps,
            "train_loss": runlog.last_train_loss,
            "val_loss": runlog.last_val_loss,
            "peers": runlog.last_roster_size,
            "idle_fraction": round(runlog.idle_fraction(), 4),
            "training_share": round(runlog.account.training_share(), 4),
            "algo": f"{self.algo.algo}/{self.algo.topology}",
            "codec": self.cfg.codec,
            "model": self.train.model,
            "address": self._runtime().address,
            "reachable": self._runtime().reachable,
        }

    async def _checkpoint(self) -> None:
        directory = Path(self.cfg.checkpoint_dir or ".")
        directory.mkdir(parents=True, exist_ok=True)
        extra = {"run_id": self.cfg.run_id, "peer_id": self.me, "saved_at": time.time()}
        if self._spec is not None:  # what `gaslocd export` rebuilds the model from
            extra[SPEC_KEY] = self._spec.to_extra()
        if self._tokenizer is not None:  # and the tokenizer it writes beside it
            extra[TOKENIZER_KEY] = self._tokenizer
        keep, began = self.cfg.keep_checkpoints, time.monotonic()
        path = await self._runtime().thread.call(self.state.save, directory, extra, keep)
        self.budget.measured(time.monotonic() - began)
        log.info("checkpoint of round %d written to %s", self.state.round, path)

    # -- shutdown ------------------------------------------------------------------------

    async def _shutdown(self, started: bool) -> None:
        """Ordered and bounded: stop tasks, checkpoint, withdraw, stop serving, report.

        Runs even when the main task was cancelled by a second signal; each step that
        could take long gives way to a (further) second signal.
        """
        self._shutting_down = True
        rt = self._runtime()
        await cancel_and_wait(rt.tasks, what="background tasks")
        timeout_s = self.budget.checkpoint_timeout_s(asyncio.get_running_loop().time())
        if (
            started
            and self.cfg.checkpoint_dir
            and not self._force.is_set()
            and not await signals.unless_forced(self._force, self._checkpoint(), timeout_s)
        ):
            log.warning("final checkpoint abandoned; the previous one is kept")
        if started and not self._force.is_set():
            await signals.unless_forced(self._force, self.discovery.withdraw(), 5.0)
        await rt.server.stop(0.5 if self._force.is_set() else 2.0)
        self.metrics.stop()
        rt.thread.shutdown(wait=not self._force.is_set())
        runlog = rt.telemetry.runlog
        if started and self.cfg.summary_json:
            runlog.write_summary(Path(self.cfg.summary_json), self._summary_args(), self.stats)
        if started:
            self.progress(runlog.closing_line(self.stats))

    def _summary_args(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "daemon": asdict(self.cfg),
            "algo": asdict(self.algo),
            "train": asdict(self.train),
        }
