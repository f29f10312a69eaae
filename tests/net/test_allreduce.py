"""DiLoCo all-reduce through hivemind's averager: real DHT nodes and averager processes.

Each peer here is one Discovery (a DHT child process) plus one HivemindAllReduce (an
averager child process), driven from one event loop as the daemon would drive its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from gaslocd.net.allreduce import AllReduceFailed, HivemindAllReduce
from gaslocd.net.discovery import Discovery

NUMEL = 100_003  # not a multiple of hivemind's part size, so the last part is short
MATCHMAKING_S = 2.0


def _peers(
    count: int, run_id: str, numel: int = NUMEL
) -> tuple[list[Discovery], list[HivemindAllReduce]]:
    nodes: list[Discovery] = []
    averagers: list[HivemindAllReduce] = []
    try:
        for _ in range(count):
            bootstrap = nodes[0].bootstrap_addresses() if nodes else []
            nodes.append(Discovery(run_id, initial_peers=bootstrap))
            nodes[-1].start()
            averagers.append(
                HivemindAllReduce(
                    nodes[-1],
                    prefix=f"{run_id}_avg",
                    numel=numel,
                    target_group_size=count,
                    matchmaking_time_s=MATCHMAKING_S,
                    request_timeout_s=0.5,
                    next_chunk_timeout_s=2.0,
                    allreduce_timeout_s=10.0,
                )
            )
            averagers[-1].start()
    except BaseException:
        _stop(nodes, averagers)
        raise
    return nodes, averagers


def _stop(nodes: list[Discovery], averagers: list[HivemindAllReduce]) -> None:
    for averager in averagers:
        averager.shutdown()
    for node in nodes:
        node.shutdown()


@pytest.fixture
def pair() -> Iterator[list[HivemindAllReduce]]:
    nodes, averagers = _peers(2, "pair")
    yield averagers
    _stop(nodes, averagers)


def _inputs(count: int, numel: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=generator) for _ in range(count)]


def _assert_mean(results: list[Any], inputs: list[torch.Tensor]) -> None:
    """Everyone got the float64 mean of the inputs, to float32 rounding.

    hivemind adds (mean - own) to own, so peers may differ from each other by an ulp.
    """
    mean = torch.stack(inputs).double().mean(0)
    for result in results:
        assert isinstance(result, tuple), result
        tensor, group_size = result
        assert group_size == len(inputs)
        assert tensor.dtype == torch.float32 and tensor.shape == inputs[0].shape
        torch.testing.assert_close(tensor.double(), mean, rtol=0, atol=2e-6)


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
def test_two_peers_get_the_mean_and_rounds_never_mix(pair: list[HivemindAllReduce]) -> None:
    async def body() -> None:
        inputs = _inputs(2, NUMEL, seed=0)
        results = await asyncio.gather(
            *(peer.average(7, x, timeout_s=10.0) for peer, x in zip(pair, inputs, strict=True))
        )
        _assert_mean(results, inputs)
        # A wrong-sized tensor is refused before anything is sent.
        with pytest.raises(ValueError, match="expected"):
            await pair[0].average(8, torch.zeros(3), timeout_s=10.0)
        # Peers in different rounds never form a group: each fails within its timeout.
        began = time.monotonic()
        outcomes = await asyncio.gather(
            pair[0].average(8, inputs[0], timeout_s=MATCHMAKING_S + 1.5),
            pair[1].average(9, inputs[1], timeout_s=MATCHMAKING_S + 1.5),
            return_exceptions=True,
        )
        assert all(isinstance(o, AllReduceFailed) for o in outcomes), outcomes
        assert time.monotonic() - began < MATCHMAKING_S + 3.0
        # ... and a failed round leaves the averagers usable for the next one.
        inputs = _inputs(2, NUMEL, seed=1)
        results = await asyncio.gather(
            *(peer.average(10, x, timeout_s=10.0) for peer, x in zip(pair, inputs, strict=True))
        )
        _assert_mean(results, inputs)

    asyncio.run(body())


async def _kill_at(stage: str, node: Discovery, peer: HivemindAllReduce) -> None:
    """SIGKILL a peer's averager and DHT processes once its step reaches ``stage``."""
    end = time.monotonic() + 10.0
    while peer.stage != stage:
        assert time.monotonic() < end, f"the step never reached {stage}"
        await asyncio.sleep(0.005)
    for pid in (peer._averager.pid, node.dht.pid):  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)  # a machine losing power


async def _average_all(
    peers: list[HivemindAllReduce], round: int, inputs: list[torch.Tensor], timeout_s: float
) -> list[tuple[torch.Tensor, int] | BaseException]:
    calls = [p.average(round, x, timeout_s=timeout_s) for p, x in zip(peers, inputs, strict=True)]
    return await asyncio.gather(*calls, return_exceptions=True)


@pytest.mark.net
@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "numel"),
    [("LOOKING_FOR_GROUP", NUMEL), ("RUNNING_ALLREDUCE", 8_000_000)],
    ids=["dies-matchmaking", "dies-mid-allreduce"],
)
def test_a_peer_dying_costs_the_others_at_most_their_timeout(stage: str, numel: int) -> None:
    nodes, peers = _peers(3, "trio", numel)

    async def body() -> None:
        inputs = _inputs(3, numel, seed=2)
        _assert_mean(await _average_all(peers, 0, inputs, timeout_s=20.0), inputs)
        timeout_s = MATCHMAKING_S + 4.0
        began = time.monotonic()
        survivors = asyncio.gather(
            _average_all(peers[:2], 1, inputs[:2], timeout_s), _kill_at(stage, nodes[2], peers[2])
        )
        with pytest.raises(AllReduceFailed):  # the dead peer's own call ends too
            await peers[2].average(1, inputs[2], timeout_s=timeout_s)
        outcomes, _ = await survivors
        assert time.monotonic() - began < timeout_s + 1.0
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, AllReduceFailed), outcome
            elif outcome[1] == 2:  # the survivors regrouped without the dead peer
                _assert_mean([outcome], inputs[:2])
            else:  # the dead peer had already delivered everything this survivor needed
                _assert_mean([outcome], inputs)
        if stage == "LOOKING_FOR_GROUP":  # nothing was lost yet: a pair forms
            assert all(not isinstance(o, BaseException) for o in outcomes), outcomes
        # The survivors go on as a pair in the next round.
        _assert_mean(await _average_all(peers[:2], 2, inputs[:2], timeout_s=10.0), inputs[:2])

    try:
        asyncio.run(body())
    finally:
        _stop(nodes, peers)


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
