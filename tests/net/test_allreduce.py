"""DiLoCo all-reduce through hivemind's averager: real DHT nodes and averager processes.

Each peer is one process of its own (tests/net/avg_peer.py): a Discovery (a DHT child
process) plus a HivemindAllReduce (an averager child process), driven over stdin/stdout
with one JSON line per command and per answer. Peers must not share a parent: hivemind's
children share their parent's ``MPFuture`` lock, and a peer SIGKILLed while one of its
children held that lock once wedged the survivors (and every later hivemind start in the
test process) when all peers lived here. Every wait for a peer is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from gaslocd.net.allreduce import HivemindAllReduce
from gaslocd.net.discovery import Discovery

ROOT = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).with_name("avg_peer.py")
NUMEL = 100_003  # not a multiple of hivemind's part size, so the last part is short
MATCHMAKING_S = 2.0
START_S = 120.0  # a peer imports torch and hivemind and starts two children: slow on 2 cores
REPLY_SLACK_S = 30.0  # beyond a call's own timeout: loading and saving tensors, scheduling
ALLREDUCE_S = 10.0  # avg_peer.py's all-reduce bound, which a formed group may use up


@dataclass
class Outcome:
    """One peer's answer to one ``average`` call (``tensor`` is None when it failed)."""

    tensor: torch.Tensor | None
    group_size: int
    error: str | None
    message: str
    elapsed_s: float


class Peer:
    """The test's handle on one avg_peer.py process."""

    def __init__(self, proc: subprocess.Popen[bytes], name: str, work: Path) -> None:
        self.proc, self.name, self.work = proc, name, work
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.calls = 0
        self.timeout_s = 0.0  # the latest call's timeout
        self.hello: dict[str, Any] = {}
        threading.Thread(target=self._pump, name=f"pump-{name}", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # end of output: the peer exited

    def stderr_tail(self) -> str:
        return (self.work / f"{self.name}.err").read_text(errors="replace")[-3000:]

    def read(self, limit_s: float) -> dict[str, Any] | None:
        """The peer's next JSON line, or None when it exited; fails after ``limit_s``."""
        try:
            line = self.lines.get(timeout=limit_s)
        except queue.Empty:
            raise AssertionError(
                f"{self.name} said nothing within {limit_s} s:\n{self.stderr_tail()}"
            ) from None
        return None if line is None else json.loads(line)

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    def begin(
        self,
        round: int,
        tensor: torch.Tensor,
        timeout_s: float,
        kill_at: str | None = None,
        freeze: tuple[str, float] | None = None,
    ) -> None:
        """Start an ``average`` call; :meth:`end` collects its outcome."""
        self.calls += 1
        stem = self.work / f"{self.name}-{self.calls}"
        torch.save(tensor, f"{stem}.in")
        command = {"round": round, "input": f"{stem}.in", "output": f"{stem}.out"}
        self.send({**command, "timeout_s": timeout_s, "kill_at": kill_at, "freeze": freeze})
        self.timeout_s = timeout_s

    def end(self) -> Outcome:
        reply = self.read(self.timeout_s + REPLY_SLACK_S)
        assert reply is not None, f"{self.name} exited mid-call:\n{self.stderr_tail()}"
        tensor = None
        if reply["ok"]:
            tensor = torch.load(self.work / f"{self.name}-{self.calls}.out")
        return Outcome(
            tensor,
            reply.get("group_size", 0),
            reply.get("error"),
            reply.get("message", ""),
            reply["elapsed_s"],
        )


def _spawn(
    name: str, run_id: str, bootstrap: str, numel: int, count: int, work: Path, next_chunk_s: float
) -> Peer:
    command = [sys.executable, str(PEER_SCRIPT), run_id, bootstrap, str(numel), str(count)]
    with open(work / f"{name}.err", "wb") as stderr:
        proc = subprocess.Popen(
            [*command, str(MATCHMAKING_S), str(next_chunk_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            start_new_session=True,  # its own process group, which it may kill
        )
    return Peer(proc, name, work)


def _greet(peer: Peer) -> None:
    hello = peer.read(START_S)
    assert hello is not None, f"{peer.name} exited at start:\n{peer.stderr_tail()}"
    peer.hello = hello


@contextmanager
def _peers(
    count: int,
    run_id: str,
    work: Path,
    reaper: list[subprocess.Popen[bytes]],
    numel: int = NUMEL,
    next_chunk_s: float = 2.0,
) -> Iterator[list[Peer]]:
    """``count`` peers of one run, the first one the others' bootstrap; stopped after."""
    peers: list[Peer] = []
    try:
        peers.append(_spawn("peer0", run_id, "-", numel, count, work, next_chunk_s))
        reaper.append(peers[0].proc)
        _greet(peers[0])
        bootstrap = peers[0].hello["bootstrap"][0]
        for index in range(1, count):  # the others start together
            peers.append(
                _spawn(f"peer{index}", run_id, bootstrap, numel, count, work, next_chunk_s)
            )
            reaper.append(peers[-1].proc)
        for peer in peers[1:]:
            _greet(peer)
        yield peers
    finally:
        for peer in peers:  # a clean stop first; the reaper kills whatever is left
            if peer.proc.poll() is None:
                try:
                    peer.send({"quit": True})
                except OSError:
                    continue
        for peer in peers:
            with suppress(subprocess.TimeoutExpired):
                peer.proc.wait(timeout=30)


def _inputs(count: int, numel: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=generator) for _ in range(count)]


def _average_all(
    peers: list[Peer], round: int, inputs: list[torch.Tensor], timeout_s: float
) -> list[Outcome]:
    for peer, tensor in zip(peers, inputs, strict=True):
        peer.begin(round, tensor, timeout_s)
    return [peer.end() for peer in peers]


def _mean_within(
    peers: list[Peer], rounds: Sequence[int], inputs: list[torch.Tensor], timeout_s: float
) -> None:
    """The mean arrives in one of ``rounds``: a round that failed (AllReduceFailed at some
    peer: matchmaking right after start-up or after a member died, seen under load in CI)
    is what a daemon counts as a failed round and mixes in the next one."""
    outcomes: list[Outcome] = []
    for round_ in rounds:
        outcomes = _average_all(peers, round_, inputs, timeout_s)
        if not any(o.error == "AllReduceFailed" for o in outcomes):
            break
    _assert_mean(outcomes, inputs)


def _assert_mean(outcomes: list[Outcome], inputs: list[torch.Tensor]) -> None:
    """Everyone got the float64 mean of the inputs, to float32 rounding.

    hivemind adds (mean - own) to own, so peers may differ from each other by an ulp.
    """
    mean = torch.stack(inputs).double().mean(0)
    for outcome in outcomes:
        assert outcome.tensor is not None, outcome
        assert outcome.group_size == len(inputs)
        tensor = outcome.tensor
        assert tensor.dtype == torch.float32 and tensor.shape == inputs[0].shape
        torch.testing.assert_close(tensor.double(), mean, rtol=0, atol=2e-6)


def _assert_quiet(peer: Peer) -> None:
    """No error escaped into the peer's event loop: a step cancelled twice (hivemind's
    cancel is not idempotent) or one cancelled mid-all-reduce, whose result hivemind then
    cannot set, printed these. (hivemind logs a failed matchmaking with a traceback of its
    own: that one is expected when rounds differ.)"""
    log = (peer.work / f"{peer.name}.err").read_text(errors="replace")
    for sign in (
        "InvalidStateError",
        "Task exception was never retrieved",
        "Exception in callback",
    ):
        assert sign not in log, f"{peer.name}: {sign}:\n{log[-3000:]}"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too
            return stat.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_invalid_settings_are_refused_before_anything_starts() -> None:
    source = Discovery("run")  # never started: the checks need no DHT
    with pytest.raises(ValueError, match="request timeout"):
        HivemindAllReduce(source, prefix="p", numel=4, target_group_size=2, request_timeout_s=5)
    with pytest.raises(ValueError, match=r"no '\.'"):
        HivemindAllReduce(source, prefix="a.b", numel=4, target_group_size=2)
    with pytest.raises(ValueError, match="min_group_size"):
        HivemindAllReduce(source, prefix="p", numel=4, target_group_size=1)


@pytest.mark.net
@pytest.mark.slow
def test_two_peers_get_the_mean_and_rounds_never_mix(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    with _peers(2, "pair", tmp_path, reaper) as pair:
        inputs = _inputs(2, NUMEL, seed=0)
        _mean_within(pair, (7, 17), inputs, timeout_s=10.0)
        # A wrong-sized tensor is refused before anything is sent.
        pair[0].begin(8, torch.zeros(3), timeout_s=10.0)
        refused = pair[0].end()
        assert refused.error == "ValueError" and "expected" in refused.message, refused
        # Peers in different rounds never form a group: each fails within its timeout.
        timeout_s = MATCHMAKING_S + 1.5
        pair[0].begin(8, inputs[0], timeout_s)
        pair[1].begin(9, inputs[1], timeout_s)
        for outcome in (pair[0].end(), pair[1].end()):
            assert outcome.error == "AllReduceFailed", outcome
            assert outcome.elapsed_s < MATCHMAKING_S + 3.0
        # ... and a failed round leaves the averagers usable for the next one.
        inputs = _inputs(2, NUMEL, seed=1)
        _assert_mean(_average_all(pair, 10, inputs, timeout_s=10.0), inputs)
    for peer in pair:  # the failed rounds' steps were stopped once, quietly
        _assert_quiet(peer)


@pytest.mark.net
@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "numel"),
    [("LOOKING_FOR_GROUP", NUMEL), ("RUNNING_ALLREDUCE", 8_000_000)],
    ids=["dies-matchmaking", "dies-mid-allreduce"],
)
def test_a_peer_dying_costs_the_others_at_most_their_timeout_or_the_allreduce_bound(
    stage: str, numel: int, tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    with _peers(3, "trio", tmp_path, reaper, numel) as peers:
        inputs = _inputs(3, numel, seed=2)
        _mean_within(peers, (0, 10, 11), inputs, timeout_s=20.0)
        timeout_s = MATCHMAKING_S + 4.0
        for peer, tensor in zip(peers[:2], inputs[:2], strict=True):
            peer.begin(1, tensor, timeout_s)
        # The third peer SIGKILLs itself and its children once its step reaches the
        # stage: a machine losing power.
        doomed = peers[2]
        doomed.begin(1, inputs[2], timeout_s, kill_at=stage)
        last_words = doomed.read(timeout_s + REPLY_SLACK_S)
        assert last_words is None, f"the step never reached {stage}: {last_words}"
        assert doomed.proc.wait(timeout=10) == -signal.SIGKILL
        end = time.monotonic() + 10.0
        for child in ("dht_pid", "averager_pid"):  # its children died with it
            while not _gone(doomed.hello[child]):
                assert time.monotonic() < end, f"the dead peer's {child} lives on"
                time.sleep(0.05)
        outcomes = [peer.end() for peer in peers[:2]]
        # A group that formed waits for its all-reduce (hivemind drops the dead member).
        bound = timeout_s + 1.0 + (ALLREDUCE_S if stage == "RUNNING_ALLREDUCE" else 0.0)
        for outcome in outcomes:
            assert outcome.elapsed_s < bound, outcome
            if outcome.error is not None:
                assert outcome.error == "AllReduceFailed", outcome
            elif outcome.group_size == 2:  # the survivors regrouped without the dead peer
                _assert_mean([outcome], inputs[:2])
            else:  # the dead peer had already delivered everything this survivor needed
                _assert_mean([outcome], inputs)
        if stage == "LOOKING_FOR_GROUP":  # nothing was lost yet: a pair forms
            assert all(outcome.error is None for outcome in outcomes), outcomes
        # The survivors go on as a pair (in the next round, or after a failed one).
        _mean_within(peers[:2], (2, 3, 4), inputs[:2], timeout_s=10.0)


@pytest.mark.net
@pytest.mark.slow
def test_a_deadline_that_passes_during_the_allreduce_still_gets_the_mean(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    # The caller's timeout bounds the matchmaking; a formed group's members wait for the
    # all-reduce. A peer that gave up at its deadline stepped on its own tensor while its
    # averager, which runs on regardless, still served its partner the mean: DiLoCo
    # replicas drifted apart (seen in CI). Here one member stalls (SIGSTOP, shorter than
    # the members' patience for a silent peer) as soon as the group forms, so both
    # deadlines pass inside the all-reduce.
    numel, stall_s = 8_000_000, 3.0
    with _peers(2, "stall", tmp_path, reaper, numel, next_chunk_s=8.0) as pair:
        inputs = _inputs(2, numel, seed=3)
        timeout_s = MATCHMAKING_S + 0.5
        outcomes: list[Outcome] = []
        for round_ in (0, 1, 2):  # a round with no group (start-up, load) fails for both
            pair[0].begin(round_, inputs[0], timeout_s, freeze=("RUNNING_ALLREDUCE", stall_s))
            pair[1].begin(round_, inputs[1], timeout_s)
            outcomes = [peer.end() for peer in pair]
            if not all(outcome.error == "AllReduceFailed" for outcome in outcomes):
                break
        _assert_mean(outcomes, inputs)  # both, never one of them
        for outcome in outcomes:
            assert timeout_s < outcome.elapsed_s < timeout_s + ALLREDUCE_S + 1.0, outcome
    for peer in pair:
        _assert_quiet(peer)


def test_a_wedged_averager_call_never_blocks_the_process_exit() -> None:
    # A call into a dead averager waits for ever; the daemon must still exit (it once
    # hung in the event loop's close, waiting for such a thread).
    script = (
        "import asyncio, time\n"
        "from gaslocd.net.allreduce import off_loop\n"
        "async def main():\n"
        "    assert await off_loop(lambda a, b: a + b, 2, 3) == 5\n"
        "    try:\n"
        "        await off_loop(int, 'x')\n"
        "    except ValueError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError('the exception was lost')\n"
        "    try:\n"
        "        await asyncio.wait_for(off_loop(time.sleep, 3600), 0.2)\n"
        "    except TimeoutError:\n"
        "        print('timed out', flush=True)\n"
        "asyncio.run(main())\n"
    )
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timed out"
    assert time.monotonic() - began < 60
