"""Real daemons on real (namespaced, shaped) links (issue 7): a partition that heals, and
5% packet loss. Each daemon runs in its own network namespace of a :class:`NetLab`, made
and removed by the test; as root only (the test says why it skips otherwise)."""

from __future__ import annotations

import json
import math
import re
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.procs import FAST_FLAGS, Daemon, gaslocd_argv, summary_rounds

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import netns

pytestmark = [pytest.mark.net, pytest.mark.slow]

_OK, _WHY = netns.available()
if not _OK:
    pytestmark.append(pytest.mark.skip(reason=f"network namespaces unavailable: {_WHY}"))

FLAGS = ["--min-peers", "2", "--exchange-deadline", "5", "--inner-steps", "6", "--token", "netns"]
FLAGS += ["--record-ttl", "8"]


class NsDaemon(Daemon):
    """A :class:`Daemon` started inside leaf ``i`` of ``lab``, listening on its address."""

    def __init__(
        self, lab: netns.NetLab, i: int, args: list[str], reaper: list[subprocess.Popen[bytes]]
    ) -> None:
        argv = gaslocd_argv([*args, "--host", lab.address(i)])
        super().__init__(args, reaper, f"n{i}", command=lab.exec_argv(i, argv))


_SINK = """
import socket, sys, time
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
got, first = 0, None
while chunk := conn.recv(1 << 16):
    first = first or time.monotonic()
    got += len(chunk)
print(got, time.monotonic() - first, flush=True)
"""
_SOURCE = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60) as conn:
    conn.sendall(bytes(int(sys.argv[3])))
"""


def test_a_slow_link_carries_a_message_smaller_than_a_bucket_at_its_rate() -> None:
    """What the straggler benches and the slow-link test build on: 150 kB (a q4 θ̃ of the
    tiny model) over a 1 Mbit/s upload takes its 1.2 s, not the instant a 256 KiB bucket
    gave it (bench/netns.py shapes slow links one MTU per packet)."""
    nbytes = 150_000
    with netns.NetLab(2, rate_mbit=[1.0, 1000]) as lab:
        sink = subprocess.Popen(
            lab.exec_argv(1, [sys.executable, "-c", _SINK, lab.address(1)]),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert sink.stdout is not None
            port = sink.stdout.readline().strip()
            argv = [sys.executable, "-c", _SOURCE, lab.address(1), port, str(nbytes)]
            subprocess.run(lab.exec_argv(0, argv), check=True, timeout=60)
            got, seconds = sink.communicate(timeout=60)[0].split()
        finally:
            sink.kill()
    mbit = int(got) * 8 / float(seconds) / 1e6
    assert int(got) == nbytes and 0.7 < mbit < 1.3, f"{mbit:.3f} Mbit/s over a 1 Mbit/s link"


@pytest.fixture
def lab4() -> Iterator[netns.NetLab]:
    with netns.NetLab(4, rate_mbit=1000) as lab:
        yield lab


def _start(
    lab: netns.NetLab,
    n: int,
    reaper: list[subprocess.Popen[bytes]],
    *extra: str,
    summaries: Path | None = None,
) -> list[NsDaemon]:
    """``summaries``: each daemon writes its --json summary there as host<i>.json."""

    def own(i: int) -> list[str]:
        return [] if summaries is None else ["--json", str(summaries / f"host{i}.json")]

    first = NsDaemon(lab, 0, ["start", *FAST_FLAGS, *FLAGS, *extra, *own(0)], reaper)
    address = first.wait_for(r"bootstrap address: (\S+)", 120).group(1)
    join = ["join", *FAST_FLAGS, "--bootstrap", address, *FLAGS, *extra]
    rest = [NsDaemon(lab, i, [*join, *own(i)], reaper) for i in range(1, n)]
    return [first, *rest]


def _consensus(d: Daemon, after: int = 0) -> list[float]:
    return [
        float(m.group("consensus"))
        for m in d.rounds()
        if m.group("consensus") != "-" and int(m.group("round")) > after
    ]


def test_partition_then_heal_consensus_falls_back(
    lab4: netns.NetLab, reaper: list[subprocess.Popen[bytes]]
) -> None:
    daemons = _start(lab4, 4, reaper, "--min-peers", "4")
    cut = daemons[3]
    for d in daemons:
        d.wait_for(r"peers 4\s+exchanged 1/1", 180)
    for _ in range(3):
        cut.wait_for(r"exchanged 1/1", 120)
    baseline = statistics.median(_consensus(cut))
    lab4.set_link(3, up=False)
    # Cut off: it trains alone (roster unreachable or partners gone), the others go on
    # as three once its record expires.
    cut.wait_for(r"exchanged 0/\d", 60)
    for d in daemons[:3]:
        d.wait_for(r"peers 3\s", 60)
    alone_from = int(cut.wait_for(r"round\s+(\d+)\s", 60).group(1))
    cut.wait_for(rf"round\s+{alone_from + 5}\s", 120)  # several rounds apart
    mark = len(cut.lines)
    lab4.set_link(3, up=True)
    healed = cut.wait_for(r"round\s+(\d+)\s.*exchanged 1/1", 120)
    healed_round = int(healed.group(1))
    # After the heal it exchanges again (by gossip, or after taking a live peer's state
    # when its θ fell outside the partners' norm bound) and its consensus distance comes
    # back near where it was before the cut. How fast: robust mixing clips the drifted
    # partner's pull to the trust radius (≥ one local update per round, never amplified by
    # the outer momentum), so it takes rounds, more the longer the cut lasted (which the
    # machine's load sets): CI saw 3× the baseline right after the heal and 1.5× after 7
    # exchanges. Up to 16 exchanges are allowed. (How far it drifted depends on the
    # learning-rate phase, so no lower bound on the first value is asserted.)
    after: list[float] = []
    for n in range(16):
        cut.wait_for(r"exchanged 1/1", 120)
        after = _consensus(cut, after=healed_round - 1)
        if n >= 5 and min(after[-3:]) < 1.5 * baseline:
            break
    print("HEAL", baseline, after)
    assert len(after) >= 6 and all(math.isfinite(c) for c in after), after
    assert min(after[-3:]) < 1.5 * baseline, (baseline, after)
    assert len(cut.lines) > mark
    for d in daemons:
        assert all(m.group("loss") != "nan" for m in d.rounds()[:-1])
        d.signal(signal.SIGTERM)
    for d in daemons:
        assert d.finish(90) == 0, d.output()


_LOSS_OK, _LOSS_WHY = netns.loss_available() if _OK else (False, _WHY)


@pytest.mark.skipif(not _LOSS_OK, reason=f"random packet loss unavailable: {_LOSS_WHY}")
def test_five_percent_packet_loss_still_trains(reaper: list[subprocess.Popen[bytes]]) -> None:
    with netns.NetLab(3, rate_mbit=200, loss_pct=5) as lab:
        daemons = _start(lab, 3, reaper, "--eval-every", "1")
        first_val = float(daemons[0].wait_for(r"round\s+\d+\s.*val ([\d.]+)", 240).group(1))
        for d in daemons:
            for _ in range(3):
                d.wait_for(r"exchanged 1/1", 240)
        last_val = float(daemons[0].wait_for(r"round\s+\d+\s.*val ([\d.]+)", 120).group(1))
        assert last_val < first_val
        for d in daemons:
            assert all(m.group("loss") != "nan" for m in d.rounds())
            d.signal(signal.SIGTERM)
        for d in daemons:
            assert d.finish(120) == 0, d.output()
        # The loss was real: every host's rules dropped packets of these exchanges.
        assert all(netns.dropped_packets(lab.ns(i)) > 0 for i in range(3))


@pytest.mark.timeout(900)  # its waits add up to more than the default 300 s
def test_a_link_too_slow_for_a_round_sits_out_and_its_long_exchanges_land(
    reaper: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Leaf 3 behind 1 Mbit/s: its q4 θ̃ (0.14 MB) takes over a second against rounds of
    well under one, so an exchange spans several rounds (on a loaded machine more than
    the two a caller may run ahead: the partner of the round it rejoins must still be
    waited for, and called again). Under --overlap it announces that it sits out of the
    pairings, its long exchanges land and mix, and the others go on
    exchanging among themselves. (How much time each spends where is
    bench/stragglers_net.py's to say.)"""
    with netns.NetLab(4, rate_mbit=[200, 200, 200, 1.0]) as lab:
        extra = ("--min-peers", "4", "--overlap", "--eval-every", "0", "--inner-steps", "20")
        # The default inner lr, not FAST_FLAGS' 3e-3: at that rate the tiny model drifts
        # to the norm bound between the leaf's exchanges (a later long exchange refused
        # as norm-bound in 2 of 11 runs), and a leaf that misses a few may not come back:
        # each state it fetches over 1 Mbit/s is rounds stale on arrival (issue 13).
        # Before the first sit-out named its round (sit_from), the leaf's first long
        # exchanges failed in 4 runs of 5 and 3 of 8 runs (and a CI run) locked it out.
        extra += ("--inner-lr", "1e-3")
        # Info logs: a failure then shows why each exchange failed, at every end.
        daemons = _start(lab, 4, reaper, *extra, "--log-level", "INFO", summaries=tmp_path)
        slow, fast = daemons[3], daemons[:3]
        try:
            slow.wait_for(r"paired every \d+ rounds from round \d+", 300)
            slow.wait_for(r"long \+1", 240)  # a long exchange landed and mixed at the slow end
            for d in fast:
                for _ in range(3):
                    d.wait_for(r"exchanged 1/1", 120)
            # (At the fast end the same exchange may have been planned as a regular one
            # and mixed within its own round: no "long +" is required there.)
        except AssertionError as failed:
            others = "".join(f"\n--- {d.name}:\n" + "\n".join(d.lines[-25:]) for d in daemons)
            raise AssertionError(f"{failed}\n{others}") from None
        for d in daemons:
            d.signal(signal.SIGTERM)
        for d in daemons:
            assert d.finish(120) == 0, d.output()
        for d in daemons:
            assert "Traceback" not in d.output(), d.output()
            # (a round cut short by the stop trains no step: its mean loss reads nan)
            assert all(m.group("loss") != "nan" for m in d.rounds() if int(m.group("h")) > 0)
        # The slow leaf's stop withdrew its record over its 1 Mbit/s link.
        assert "shutdown step failed" not in slow.output(), slow.output()
        # Before a round it sits out it reads no roster from the network (every node would
        # answer with every record, on its slow link): its own DHT node's copy does.
        summary = json.loads((tmp_path / "host3.json").read_text())
        sat_out = sum(1 for r in summary["rounds"] if len(r["roster"]) == 1)
        reads = summary["roster_reads"]
        assert sat_out >= 3 and reads["quick"] >= sat_out - 1, (sat_out, reads)


_NAT_OK, _NAT_WHY = netns.nat_available() if _OK else (False, _WHY)


@pytest.mark.skipif(not _NAT_OK, reason=f"a NAT router cannot be made here: {_NAT_WHY}")
@pytest.mark.timeout(600)
def test_peers_behind_nat_dial_out_and_exchange_with_reachable_ones(
    reaper: list[subprocess.Popen[bytes]],
) -> None:
    """Leaves 2 and 3 sit behind NAT routers (nftables masquerade): they can dial out,
    nobody can dial them, and both hold the same private address, as two homes would.
    Nobody is told: with ``--reachable auto`` (the default) each joiner asks a live peer
    to dial it back, and 2 and 3 find that nobody can (seen as their routers' address),
    make their DHT nodes clients and print no bootstrap address; 1 finds it can be. Then
    every round each NATed peer is paired with a reachable peer, which it dials; the
    Ready it cannot be sent it asks for. Without the rule a third of the pairings would
    join the two NATed peers and half the others would dial one of them: most of their
    exchanges would fail."""
    with netns.NetLab(4, rate_mbit=1000, nat=frozenset({2, 3})) as lab:
        flags = [*FAST_FLAGS, *FLAGS, "--min-peers", "4"]
        first = NsDaemon(lab, 0, ["start", *flags], reaper)
        address = first.wait_for(r"bootstrap address: (\S+)", 120).group(1)
        join = ["join", *flags, "--bootstrap", address]
        rest = [NsDaemon(lab, i, join, reaper) for i in (1, 2, 3)]
        daemons = [first, *rest]
        rest[0].wait_for(r"reachable: gRPC yes, DHT yes \(seen as 10\.231\.", 120)
        for i, d in enumerate(rest[1:], start=2):
            seen = re.escape(lab.public_address(i))  # its router's
            d.wait_for(rf"reachable: gRPC no, DHT no \(seen as {seen} ", 120)
            d.wait_for(r"bootstrap address: none \(this peer cannot be dialled", 60)
        for d in daemons:
            d.wait_for(r"peers 4\s", 180)
        for d in daemons:
            for _ in range(6):
                d.wait_for(r"exchanged 1/1", 120)
        for d in rest[1:]:  # behind NAT
            paired = [m for m in d.rounds() if m.group("partners") != "0"]
            ok = sum(m.group("ok") == m.group("partners") for m in paired)
            assert len(paired) >= 6 and ok >= 0.8 * len(paired), d.output()
        # `gaslocd status` from behind NAT: its own daemon, and a reachable one outside
        own = rest[2].find(r"gRPC (\S+) round").group(1)
        outside = first.find(r"gRPC (\S+) round").group(1)
        for where, expect in ((own, False), (outside, True)):
            argv = gaslocd_argv(["status", where, "--json", "--token", "netns"])
            done = subprocess.run(lab.exec_argv(3, argv), capture_output=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["reachable"] == str(expect)
        for d in daemons:
            d.signal(signal.SIGTERM)
        for d in daemons:
            assert d.finish(90) == 0, d.output()


@pytest.mark.skipif(not _NAT_OK, reason=f"a NAT router cannot be made here: {_NAT_WHY}")
@pytest.mark.timeout(600)
def test_diloco_peer_behind_nat_averages_as_a_client(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    """DiLoCo behind NAT: leaf 2 sits behind a NAT router. On ``auto`` it finds out and
    stops with the reason (its averager was forked as one others can dial); with
    ``--reachable no`` its averager is hivemind's client, which the reachable members'
    all-reduce includes: all three average in most rounds, and with no failed round the
    replicas stay one model."""
    with netns.NetLab(3, rate_mbit=1000, nat=frozenset({2})) as lab:
        # fp32 on the wire: with fp16 a reducer keeps its own part exact and the others'
        # rounded, and replicas drift apart by ~2e-4 in validation loss within 3 rounds
        flags = [*FAST_FLAGS, *FLAGS, "--algo", "diloco", "--min-peers", "3", "--codec", "fp32"]
        flags += ["--max-rounds", "3", "--eval-every", "1"]
        first = NsDaemon(lab, 0, ["start", *flags, "--json", str(tmp_path / "0.json")], reaper)
        address = first.wait_for(r"bootstrap address: (\S+)", 120).group(1)
        join = ["join", *flags, "--bootstrap", address]
        second = NsDaemon(lab, 1, [*join, "--json", str(tmp_path / "1.json")], reaper)
        second.wait_for(r"reachable: gRPC yes, DHT yes", 120)
        probed = NsDaemon(lab, 2, join, reaper)
        assert probed.finish(120) == 3
        assert "start again with --reachable no" in probed.output()
        natted = NsDaemon(
            lab, 2, [*join, "--reachable", "no", "--json", str(tmp_path / "2.json")], reaper
        )
        for d in (first, second, natted):
            assert d.finish(300) == 0, d.output()
    runs = [summary_rounds(tmp_path / f"{i}.json") for i in range(3)]
    logs = "\n".join(d.output() for d in (first, second, natted))
    # Everyone, the NATed peer included, averages with both others in most rounds.
    counts = [[r["exchanged"] for r in rounds] for rounds in runs]
    assert all(c.count(2) >= 2 for c in counts), logs
    if counts == [[2, 2, 2]] * 3:  # no failed round: one model (a failed one leaves each
        # peer on its own pseudo-gradient, and DiLoCo replicas then stay apart)
        vals = [[r["val_loss"] for r in rounds] for rounds in runs]
        assert all(v == pytest.approx(vals[2], abs=1e-4) for v in vals), logs
