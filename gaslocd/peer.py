"""The library API: your model, your optimizer, your loop; gaslocd's rounds.

    peer = gaslocd.Peer(model, optimizer, run_id="my-run", bootstrap=[address])
    with peer:                                   # joins the run (fetches θ if it is live)
        for batch in my_batches():
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if not peer.step(loss):              # at a round's end: exchange + outer step
                break                            # the run is over (max_rounds)

Behind :meth:`Peer.step` runs the daemon itself (:class:`gaslocd.daemon.lifecycle.Daemon`
on a thread of its own): the same discovery, wire, checks, round driver, outer step,
checkpoints and metrics as ``gaslocd join``; only the inner steps are the caller's
(:class:`gaslocd.train.external.UserLoop`). Settings are the daemon's, named as in the
TOML config file (``inner_steps``, ``topology``, ``token``, ``checkpoint_dir``...); the
ones a user's loop owns (model, data, learning rate, precision...) are refused.

``gaslocd start`` and ``join`` go through this API's handshake too: their own inner loop
reports each step as ``peer.step`` does, on a thread of its own, while the main thread
runs the daemon with its signal handling (:mod:`gaslocd.daemon.host`, which
:meth:`Peer.run` uses as well). So every daemon exercises what a user's loop relies on.

One peer per node, not per GPU: under ``torchrun`` data parallelism (DDP) pass the
replicas' process group (``replica_group=torch.distributed.group.WORLD``) and every rank
builds a Peer; rank 0 of the group is the gaslocd peer, the others follow it (after each
step they learn from rank 0 whether a round ended and then receive θ: one small broadcast
a step, one model-sized one a round). The links inside a node are orders of magnitude
faster than the internet links gaslocd is for, and a peer per GPU would multiply the slow
traffic and the pairings for nothing. Parameters must be replicated, not sharded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import torch
from torch import nn

from gaslocd.cli.configs import (
    algo_config,
    daemon_config,
    refuse_open_port,
    train_config,
    wire_config,
)
from gaslocd.cli.settings import BY_NAME, settings_of
from gaslocd.cli.sources import resolve
from gaslocd.daemon.host import serve_with_loop
from gaslocd.daemon.lifecycle import Daemon
from gaslocd.train.external import PeerStopped, UserLoop
from gaslocd.train.flat import FlatParameters
from gaslocd.train.worker import Worker

__all__ = ["Peer", "PeerStopped"]

log = logging.getLogger(__name__)

# What a user's own loop decides: setting these on a Peer would silently do nothing.
LOOP_OWNS = frozenset(
    {
        "model", "data", "seq_len", "batch_size", "inner_lr", "weight_decay",
        "warmup_steps", "lr_schedule", "total_steps", "lr_floor", "eval_batches",
        "device", "precision", "micro_batch", "compile", "threads", "seed",
    }
)  # fmt: skip
NOT_SETTINGS = frozenset({"config", "log_level"})


def peer_settings(command: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The daemon's settings with ``given`` on top; a clear ``ValueError`` for a name the
    daemon lacks or the user's loop owns."""
    known = {s.name for c in ("start", "join") for s in settings_of(c)} - LOOP_OWNS - NOT_SETTINGS
    for name in given:
        if name in LOOP_OWNS:
            raise ValueError(f"{name}: your own loop sets this (the Peer never trains)")
        if name not in known:
            raise ValueError(f"unknown setting {name!r}; known: {', '.join(sorted(known))}")
    lists = {n: tuple(v) for n, v in given.items() if BY_NAME[n].kind == "list"}
    mine = {s.name for s in settings_of(command)}  # start: no bootstrap (it is empty)
    return resolve(command, {n: v for n, v in {**given, **lists}.items() if n in mine}, env={})


class Peer:
    """A gaslocd peer around a model that the caller trains.

    ``optimizer``: the inner optimizer (any torch optimizer), checkpointed with θ when
    ``checkpoint_dir`` is set. ``evaluate``: a function returning a validation loss, run
    between rounds when an evaluation is due (``eval_every``). ``model_name`` is part of
    the model's fingerprint: peers with different names or shapes refuse each other.
    All peers of a run must start from the same θ (seed the initialisation alike), or
    join a live run, whose θ they fetch. ``**settings``: the daemon's (see the module).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        evaluate: Callable[[], float] | None = None,
        tokens_per_step: int = 0,
        model_name: str | None = None,
        progress: Callable[[str], None] | None = None,
        replica_group: Any = None,
        **settings: Any,
    ) -> None:
        self._thread: threading.Thread | None = None
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.replicas = _Replicas(replica_group) if replica_group is not None else None
        self.following = self.replicas is not None and self.replicas.rank != 0
        command = "join" if settings.get("bootstrap") else "start"
        resolved = peer_settings(command, settings)
        refuse_open_port(resolved)
        if self.following:  # rank 0 of the group is the peer; this rank only follows it
            self._flat = FlatParameters(model).flat
            return
        name = model_name or f"user:{type(model).__qualname__}"
        train = train_config({**resolved, "model": name})
        self._loop = UserLoop(optimizer, evaluate, tokens_per_step, alive=self._alive)
        self.worker = Worker.around(model, lambda _flat: self._loop, train)
        self.daemon = Daemon(
            daemon_config(resolved),
            algo_config(resolved),
            train,
            wire_config(resolved),
            role=command,
            progress=progress or log.info,
            worker=self.worker,
        )
        self._flat = self.worker.flat.flat

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout_s: float = 300.0) -> Peer:
        """Join the run and return when the first round is open for :meth:`step`.

        The DHT processes start here, on the calling thread; the daemon's event loop on a
        thread of its own. Raises :class:`~gaslocd.daemon.membership.StartupError` or
        :class:`PeerStopped` when the peer could not start (the reason, as ``gaslocd
        join`` would print it), ``TimeoutError`` after ``timeout_s`` (waiting for
        ``min_peers``, say)."""
        if self.replicas is not None and self.following:
            self.replicas.follow(self._flat)  # θ as the peer starts with it
            return self
        if self._thread is not None:
            raise RuntimeError("the peer is already started")
        self.daemon.prepare()
        self._thread = threading.Thread(target=self._serve, name="gaslocd-peer", daemon=True)
        self._thread.start()
        if not self._loop.wait_open(timeout_s):
            self.close()
            raise TimeoutError(f"no round opened within {timeout_s:.0f} s")
        if self.replicas is not None:
            self.replicas.announce(ROUND, self._flat)
        return self

    def step(self, loss: float | torch.Tensor | None = None) -> bool:
        """Call after each inner step (after ``optimizer.step()``). Inside a round it
        returns True at once; at the round's end, when the exchange and the outer step
        are done and the next round is open. False: the run is over (``max_rounds``) or
        the peer was closed; stop training. A non-finite ``loss`` throws the round's
        steps away (θ goes back to the round's start; fix the cause: your optimizer's
        state may hold it too). Raises :class:`PeerStopped` when the peer failed."""
        if self.replicas is None:
            return self._loop.step(loss)
        if self.following:
            return self.replicas.follow(self._flat) != STOP
        opened = self._loop.opened
        more = self._loop.step(loss)
        changed = self._loop.opened != opened  # θ may have moved between two windows
        self.replicas.announce(
            ROUND if more and changed else CONTINUE if more else STOP, self._flat
        )
        return more

    def close(self, timeout_s: float | None = None) -> int | None:
        """Finish the round in progress (its exchange within the stop budget), write the
        checkpoint, leave the run; returns the daemon's exit status (None: still
        stopping after ``timeout_s``, default ``stop_timeout`` + 30 s)."""
        if self.following:
            if self.replicas is not None and not self.replicas.stopped:
                self.replicas.follow(self._flat)  # the peer's final θ
            return 0
        self._loop.stop("the peer was closed")
        self.daemon.request_stop()
        if self._thread is not None:
            self._thread.join(timeout_s or self.daemon.cfg.stop_timeout_s + 30.0)
        if self.replicas is not None and not self.replicas.stopped:
            self.replicas.announce(STOP, self._flat)
        return self.exit_code

    def run(self, train: Callable[[Peer], object]) -> int:
        """Run the peer on this thread, the main one, and ``train(self)`` (a loop that
        calls :meth:`step`) on a thread of its own; returns the exit status.

        What it adds to ``with peer:``: the daemon owns the signals, as ``gaslocd join``
        does (which runs this way too: :mod:`gaslocd.daemon.host`). SIGTERM or Ctrl-C
        finishes the round (its exchange within ``stop_timeout``), writes the checkpoint
        and leaves with status 0; a second one forces. When ``train`` returns, the peer
        stops the same way; when it raises, too, and the status is 1 (the error is logged
        and kept in :attr:`error`)."""
        if self.replicas is not None or self._thread is not None:
            raise RuntimeError("Peer.run is for a peer without replicas, not yet started")
        self.exit_code, self.error = serve_with_loop(
            self.daemon, lambda: (self._loop, partial(train, self))
        )
        return self.exit_code

    def __enter__(self) -> Peer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- what the run did --------------------------------------------------------------------

    @property
    def round(self) -> int:
        """The round the peer is in (rounds done, counted across the run)."""
        return self._leader().worker.round

    @property
    def peer_id(self) -> str:
        return self._leader().daemon.me

    @property
    def bootstrap(self) -> Sequence[str]:
        """Addresses others pass as ``bootstrap`` to join this peer's run."""
        return self._leader().daemon.discovery.bootstrap_addresses()

    def _leader(self) -> Peer:
        if self.following:
            raise RuntimeError("this rank follows rank 0 of its replica group, the peer")
        return self

    def _serve(self) -> None:
        try:
            self.exit_code = self.daemon.serve()
            self._loop.stop(f"the run is over (exit status {self.exit_code})")
        except BaseException as exc:  # the user's thread gets it through PeerStopped
            self.error = exc
            log.error("the peer stopped: %s", exc)
            self._loop.stop(f"the peer stopped: {exc}", failed=True)

    def _alive(self) -> bool:
        return self._thread is None or self._thread.is_alive()


CONTINUE, ROUND, STOP = 0, 1, 2  # what rank 0 tells its followers after each step


class _Replicas:
    """The data-parallel ranks one peer stands for (``torch.distributed``): rank 0 of the
    group announces after each step whether θ moved (then sends it) or the run stopped."""

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.src = dist.get_global_rank(group, 0)
        self.stopped = False

    def announce(self, what: int, flat: torch.Tensor) -> None:
        flag = torch.tensor([what], dtype=torch.int64, device=flat.device)
        self.dist.broadcast(flag, self.src, group=self.group)
        if what != CONTINUE:
            self.dist.broadcast(flat, self.src, group=self.group)
        self.stopped = what == STOP

    def follow(self, flat: torch.Tensor) -> int:
        flag = torch.zeros(1, dtype=torch.int64, device=flat.device)
        self.dist.broadcast(flag, self.src, group=self.group)
        what = int(flag.item())
        if what != CONTINUE:
            with torch.no_grad():
                self.dist.broadcast(flat, self.src, group=self.group)
        self.stopped = what == STOP
        return what
