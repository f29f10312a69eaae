"""DiLoCo's all-reduce of pseudo-gradients through hivemind's DecentralizedAverager.

This is how OpenDiLoCo averages: every peer hands its pseudo-gradient to a hivemind
averager (a child process), the averagers that look for a group at the same time agree on
one through the DHT and then butterfly-all-reduce the tensor in parts. hivemind leaves
its stream timeouts at ``None`` by default and one of 62 rounds measured here hung for
ever (docs/design.md §3), so every timeout hivemind exposes is set and the whole call is bounded.

Two choices a reader may question:

* The round goes into the matchmaking key (as group bits), so averagers of different
  rounds never form a group together; the gathered round numbers are checked as well.
* A group member that dies *during* the all-reduce makes hivemind keep the local values
  for the parts that member was reducing and report success. Those peers then hold a
  tensor that is not the group's mean, so such a round is turned into
  :class:`AllReduceFailed` here. Peers that did not see the failure cannot know it: a run
  that needs identical replicas should compare a digest of the result afterwards.
* The caller's timeout bounds the *matchmaking* only (as hivemind's step timeout does);
  a formed group waits for its all-reduce (``allreduce_timeout_s``). The averager child
  reduces whatever its parent does: a peer that gave up at its deadline stepped on its
  own pseudo-gradient while its partners, served by its child, stepped on the mean (CI
  saw DiLoCo replicas drift apart so). Nor is a running all-reduce cancelled (hivemind's
  cancel acts in matchmaking only): the next call waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from typing import Any, TypeVar

import torch
from hivemind import DHT
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import AveragingStage
from hivemind.averaging.group_info import GroupInfo
from hivemind.compression import (
    CompressionBase,
    Float16Compression,
    NoCompression,
    Uniform8BitQuantization,
)

from gaslocd.net.children import scratch_event_loop, stop_process, watch_parent
from gaslocd.net.discovery import Discovery

logger = logging.getLogger(__name__)
T = TypeVar("T")

_ROUND_BITS = 32  # rounds are told apart modulo 2**32 in the group key
_LIVENESS_PERIOD_S = 0.5  # how often a waiting call checks that the averager still lives
_STAGE_PERIOD_S = 0.02  # how often it looks whether the group has formed (idle accounting)


def compression_for(codec: str) -> CompressionBase:
    """hivemind's wire compression closest to a gossip codec, so that DiLoCo and GASLoC
    runs compared in a benchmark move the same bytes per value (hivemind has no bfloat16:
    ``bf16`` maps to float16, the same size)."""
    table: dict[str, CompressionBase] = {
        "fp32": NoCompression(),
        "fp16": Float16Compression(),
        "bf16": Float16Compression(),
        "int8": Uniform8BitQuantization(),
    }
    if codec not in table:
        raise ValueError(f"no all-reduce compression for codec {codec!r}")
    return table[codec]


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a fresh daemon thread, awaited.

    Not ``asyncio.to_thread``: calls into the averager wait on its child process, and one
    that dies (or is stopped at shutdown) mid-call leaves that wait unanswered for ever.
    A default-executor thread stuck so would make the event loop's close, and with it the
    daemon's exit, hang (seen: DiLoCo daemons that never exited after SIGTERM). A daemon
    thread is abandoned at exit instead.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="gaslocd-averager-call", daemon=True).start()
    return await future


class AllReduceFailed(RuntimeError):
    """No average this round (no group, timeout, a member failed); keep the local tensor."""


class _Averager(DecentralizedAverager):
    """hivemind's averager that reports an incomplete all-reduce instead of hiding it.

    ``_aggregate_with_group`` is hivemind-internal (pinned to hivemind <1.2); the returned
    value becomes the step's result in the parent process.
    """

    def run(self) -> None:
        watch_parent(self._parent_pid)
        super().run()

    async def _aggregate_with_group(
        self, group_info: GroupInfo, min_vector_size: int, **kwargs: Any
    ) -> Any:
        gathered = await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
        incomplete = False
        future = self._running_groups.get(group_info.group_id)
        if future is not None and future.done() and not future.cancelled():
            runner = future.result()
            container = getattr(runner, "tensor_part_container", None)
            failed_size = getattr(container, "failed_size", 0)
            incomplete = bool(failed_size or getattr(runner, "banned_senders", ()))
        return {"gathered": gathered, "incomplete": incomplete}


class HivemindAllReduce:
    """Average one flat float32 tensor of ``numel`` values with the peers of the same round.

    :meth:`start` forks the averager process; call it from the main thread right after
    :meth:`Discovery.start`, before any gRPC object, CUDA context or extra thread exists.
    (hivemind's ``run_in_background`` also sets SIGINT to ignored in the *calling*
    process; :meth:`start` restores the previous handler.)

    Timeouts, all in seconds: ``matchmaking_time_s`` is how long a peer waits for others
    to join its group (the group starts earlier once it has ``target_group_size``
    members); ``request_timeout_s`` bounds each matchmaking request (must be shorter);
    ``next_chunk_timeout_s`` drops a member that sends nothing for that long;
    ``allreduce_timeout_s`` bounds the all-reduce once a group is formed.
    """

    def __init__(
        self,
        discovery_or_dht: Discovery | DHT,
        *,
        prefix: str,
        numel: int,
        target_group_size: int,
        min_group_size: int = 2,
        matchmaking_time_s: float = 3.0,
        request_timeout_s: float = 1.0,
        next_chunk_timeout_s: float = 5.0,
        allreduce_timeout_s: float = 60.0,
        start_timeout_s: float = 30.0,
        codec: str = "fp32",
        client_mode: bool = False,
    ) -> None:
        """``client_mode``: behind NAT, it joins groups that a reachable peer leads and
        sends its part; the reachable members reduce it (hivemind's client mode)."""
        if not prefix or "." in prefix or not prefix.isprintable():
            raise ValueError(f"averager prefix must be printable, non-empty, no '.': {prefix!r}")
        if numel < 1:
            raise ValueError(f"numel must be >= 1, got {numel}")
        if not 2 <= min_group_size <= target_group_size:
            raise ValueError(
                f"need 2 <= min_group_size ({min_group_size}) <= "
                f"target_group_size ({target_group_size})"
            )
        for name, value in (
            ("matchmaking time", matchmaking_time_s),
            ("request timeout", request_timeout_s),
            ("next chunk timeout", next_chunk_timeout_s),
            ("all-reduce timeout", allreduce_timeout_s),
            ("start timeout", start_timeout_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        if request_timeout_s >= matchmaking_time_s:
            raise ValueError(
                f"request timeout ({request_timeout_s} s) must be shorter than the matchmaking "
                f"time ({matchmaking_time_s} s): hivemind can deadlock otherwise"
            )
        self._compression = compression_for(codec)
        self._source = discovery_or_dht
        self.prefix, self.numel = prefix, numel
        self._target_group_size, self._min_group_size = target_group_size, min_group_size
        self.matchmaking_time_s = matchmaking_time_s
        self._request_timeout_s = request_timeout_s
        self._next_chunk_timeout_s = next_chunk_timeout_s
        self._allreduce_timeout_s = allreduce_timeout_s
        self._start_timeout_s = start_timeout_s
        self._client_mode = client_mode
        self._averager: _Averager | None = None
        self._lock = asyncio.Lock()
        self._generation = 0  # bumped per call, so a stale worker thread never touches data
        self._pending: Any = None  # the StepControl of a call that timed out
        # Seconds the latest successful call waited for its group to form: at DiLoCo's
        # barrier, the time spent waiting for the last peer to arrive (its idle time).
        self.last_group_wait_s = 0.0

    def start(self) -> None:
        """Fork the averager process (blocks until it is ready); main thread only."""
        if self._averager is not None:
            raise RuntimeError("HivemindAllReduce.start() was already called")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("start the averager from the main thread (it installs signals)")
        dht = self._source.dht if isinstance(self._source, Discovery) else self._source
        buffer = torch.zeros(self.numel, dtype=torch.float32)  # shared with the child
        began = time.monotonic()
        previous = signal.getsignal(signal.SIGINT)
        with scratch_event_loop():
            averager = _Averager(
                [buffer],
                dht,
                start=False,
                prefix=self.prefix,
                target_group_size=self._target_group_size,
                min_group_size=self._min_group_size,
                min_matchmaking_time=self.matchmaking_time_s,
                request_timeout=self._request_timeout_s,
                allreduce_timeout=self._allreduce_timeout_s,
                next_chunk_timeout=self._next_chunk_timeout_s,
                sender_timeout=self._next_chunk_timeout_s,
                reducer_timeout=2 * self._next_chunk_timeout_s,
                compression=self._compression,
                allow_state_sharing=False,  # newcomers fetch state over gRPC (docs/design.md §3)
                shutdown_timeout=5,
                client_mode=self._client_mode,
            )
            try:
                averager.run_in_background(await_ready=True, timeout=self._start_timeout_s)
            except Exception as error:
                stop_process(averager)
                raise AllReduceFailed(f"the averager did not start: {error}") from error
            finally:
                signal.signal(signal.SIGINT, previous)
        self._averager = averager
        logger.info("averager %s up in %.2f s", self.prefix, time.monotonic() - began)

    @property
    def stage(self) -> str:
        """The latest step's stage, e.g. LOOKING_FOR_GROUP or RUNNING_ALLREDUCE (for status)."""
        return "IDLE" if self._pending is None else str(self._pending.stage.name)

    def shutdown(self, *, quick: bool = False) -> None:
        """Stop the averager process (idempotent); the DHT is the caller's to stop."""
        averager, self._averager = self._averager, None
        if averager is not None:
            stop_process(averager, quick=quick)

    async def average(
        self, round: int, tensor: torch.Tensor, *, timeout_s: float
    ) -> tuple[torch.Tensor, int]:
        """The mean of ``tensor`` over this round's group, and the group size (>= 2).

        Every peer that calls this for the same ``round`` within the matchmaking window
        joins one group (up to ``target_group_size``) and gets the same mean. Raises
        :class:`AllReduceFailed` after at most ``timeout_s`` when no group formed, a
        member failed mid-way or the averager is gone: the caller then skips averaging.
        """
        averager = self._averager
        if averager is None:
            raise RuntimeError("HivemindAllReduce is not started")
        if tensor.numel() != self.numel:
            raise ValueError(f"expected {self.numel} values, got {tensor.numel()}")
        if not round >= 0:
            raise ValueError(f"round must be >= 0, got {round}")
        if not timeout_s > self.matchmaking_time_s:
            raise ValueError(
                f"timeout ({timeout_s} s) must exceed the matchmaking time "
                f"({self.matchmaking_time_s} s)"
            )
        if not averager.is_alive():
            raise AllReduceFailed("the averager process is gone")
        began = time.monotonic()
        deadline = began + timeout_s
        # A wedged averager (a pipe nobody answers) must not hold the caller for ever.
        hard = deadline + self._allreduce_timeout_s + self._next_chunk_timeout_s
        async with self._lock:
            self._generation += 1
            try:
                return await asyncio.wait_for(
                    self._run(averager, self._generation, round, tensor, deadline),
                    max(0.0, hard - time.monotonic()),
                )
            except TimeoutError:
                self._generation += 1  # a worker thread still starting this step must stop
                waited = time.monotonic() - began
                raise AllReduceFailed(f"round {round}: no average within {waited:.1f} s") from None

    async def _run(
        self,
        averager: _Averager,
        generation: int,
        round: int,
        tensor: torch.Tensor,
        deadline: float,
    ) -> tuple[torch.Tensor, int]:
        flat = tensor.detach().reshape(-1).to(torch.float32, copy=False)
        step = await off_loop(self._begin, averager, generation, round, flat, deadline)
        waiter = _settled_on_loop(step)
        began = time.monotonic()
        grouped_at: float | None = None
        last_check = began
        try:
            while not (await asyncio.wait({waiter}, timeout=_STAGE_PERIOD_S))[0]:
                now = time.monotonic()
                if grouped_at is None and _grouped(step):
                    grouped_at = now
                if grouped_at is None and now >= deadline:
                    _cancel_matchmaking(step)
                    raise AllReduceFailed(f"round {round}: no group formed in time")
                if now - last_check >= _LIVENESS_PERIOD_S:
                    last_check = now
                    if not averager.is_alive():  # a dead child never answers: do not wait
                        raise AllReduceFailed(f"round {round}: the averager process died")
            outcome = waiter.result()
        except (asyncio.CancelledError, AllReduceFailed):
            raise
        except Exception as error:  # hivemind fails with many types; all mean "no average"
            raise AllReduceFailed(f"round {round}: {type(error).__name__}: {error}") from error
        gathered = outcome["gathered"]
        if outcome["incomplete"]:
            raise AllReduceFailed(f"round {round}: a group member failed during the all-reduce")
        if any(other != round for other in gathered.values()):  # a group key collision
            others = sorted({repr(other) for other in gathered.values()})
            raise AllReduceFailed(f"round {round}: group mixed rounds {', '.join(others)}")
        result = await off_loop(self._read, averager)
        self.last_group_wait_s = (grouped_at or time.monotonic()) - began
        return result.view_as(tensor).to(tensor.dtype), len(gathered)

    def _begin(
        self,
        averager: _Averager,
        generation: int,
        round: int,
        flat: torch.Tensor,
        deadline: float,
    ) -> Any:
        """Load the input and start a step; runs in a worker thread (it waits on pipes).
        A step left over from a call that gave up is cancelled while it still looks for a
        group (it must not hold the group key) and waited for while it reduces."""
        pending = self._pending
        if pending is not None and not pending.done():
            if not _grouped(pending):
                _cancel_matchmaking(pending)
            while not pending.done() and time.monotonic() < deadline:
                time.sleep(_STAGE_PERIOD_S)
        with averager.get_tensors() as tensors:
            if generation != self._generation:
                raise AllReduceFailed("superseded by a newer call")
            tensors[0].copy_(flat)
        averager.set_group_bits(format(round % 2**_ROUND_BITS, f"0{_ROUND_BITS}b"))
        timeout = deadline - time.monotonic()
        if generation != self._generation:
            raise AllReduceFailed("superseded by a newer call")
        if timeout <= self.matchmaking_time_s:
            raise AllReduceFailed(f"round {round}: too little time left to find a group")
        self._pending = averager.step(gather=round, weight=1.0, timeout=timeout, wait=False)
        return self._pending

    @staticmethod
    def _read(averager: _Averager) -> torch.Tensor:
        with averager.get_tensors() as tensors:
            result: torch.Tensor = tensors[0].clone()
        return result


def _grouped(step: Any) -> bool:
    """Whether the step is past matchmaking (reducing, or finished either way)."""
    return bool(step.stage.value >= AveragingStage.RUNNING_ALLREDUCE.value)


def _cancel_matchmaking(step: Any) -> None:
    """Stop a step that still looks for a group (hivemind's ``StepControl.cancel`` is not
    idempotent: a second call raises). A group that forms between the caller's look at
    the stage and this cancel would still reduce without us: a window of microseconds
    against the matchmaking's seconds, left open."""
    if not step.done():
        with contextlib.suppress(InvalidStateError, asyncio.InvalidStateError):
            step.cancel()


def _settled_on_loop(step: Any) -> asyncio.Future[Any]:
    """An asyncio future that takes the step's outcome; nothing flows back.

    Not ``asyncio.wrap_future``: it chains cancellation both ways, so cancelling the
    step cancels the wrapper, whose callback cancels the step a second time — which
    hivemind's StepControl answers with InvalidStateError, logged from the event loop.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(source: Any) -> None:
        if future.done():
            return
        if source.cancelled():
            future.cancel()
        elif (error := source.exception()) is not None:
            future.set_exception(error)
        else:
            future.set_result(source.result())

    def on_done(source: Any) -> None:  # hivemind's update thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, source)

    step.add_done_callback(on_done)
    return future
