"""Hostile input against a live, training daemon (issue 7): refused, counted, harmless.

Two real daemons train together with a join token; the test attacks the one that accepts
its partner's calls with hypothesis-drawn bad messages (see :mod:`tests.faults.fuzz`),
then with floods of connections. It asserts that every message was refused with a status
other than OK, that the daemon counted each refusal under the reason it gave, that it
kept training and exchanging with its real partner, that its memory stayed bounded, and
that its parameters are finite at the end. ``GASLOCD_FUZZ_EXAMPLES`` makes it longer.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import pytest
import torch
from hivemind.utils.crypto import RSAPrivateKey
from hypothesis import HealthCheck, example, given, settings

from gaslocd.net.auth import CallAuth
from gaslocd.net.roster_auth import peer_id_of_owner
from tests.daemon.procs import FAST_FLAGS, Daemon, start_first, wait_checkpoint
from tests.faults.fuzz import (
    SWEEP,
    Case,
    Tally,
    Target,
    cases,
    daemon_round,
    flood,
    free_port,
    kind_of,
    rss_bytes,
    send_case,
)

pytestmark = [pytest.mark.net, pytest.mark.slow]

EXAMPLES = int(os.environ.get("GASLOCD_FUZZ_EXAMPLES", "40"))
TOKEN = "fuzz-s3cret"
# Statuses that are no refusal by *our* code but by gRPC itself, before a handler runs.
GRPC_CORE_REFUSALS = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED}


def _rejected(metrics_port: int) -> Counter[str]:
    """Refusals by reason: of messages (the checks) and of calls (the gate)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    pattern = r'gasloc_(?:rejected_messages|calls_refused)_total\{reason="([^"]+)"\} (\S+)'
    out: Counter[str] = Counter()
    for reason, n in re.findall(pattern, text):
        out[reason] += int(float(n))
    return out


def test_fuzzed_daemon_refuses_counts_and_keeps_training(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    ports = [free_port(), free_port()]
    common = ["--min-peers", "2", "--token", TOKEN, "--checkpoint-every", "1"]
    common += ["--exchange-deadline", "8"]
    first, address = start_first(
        tmp_path, reaper, *common, "--checkpoint-dir", str(tmp_path / "c0"),
        "--metrics-port", str(ports[0]),
    )  # fmt: skip
    second = Daemon(
        ["join", *FAST_FLAGS, "--bootstrap", address, *common,
         "--checkpoint-dir", str(tmp_path / "c1"), "--metrics-port", str(ports[1])],
        reaper, "w1",
    )  # fmt: skip
    second.wait_for(r"round\s+2\s.*exchanged 1/1", 180)
    daemons = [first, second]
    ids = [d.find(r"peer (\S+) run (\S+) gRPC (\S+)") for d in daemons]
    # The smaller id dials; the other accepts, so its partner's slot is the one to steal.
    acc = max(range(2), key=lambda i: ids[i].group(1))
    victim, partner = daemons[acc], ids[1 - acc].group(1)
    saved = wait_checkpoint(tmp_path / f"c{acc}" / "checkpoint.pt", 60)
    theta = saved["theta"]
    assert isinstance(theta, torch.Tensor)
    key = RSAPrivateKey()  # the insider's own: its id is its key's (a self-certified caller)
    insider_id = peer_id_of_owner(key.get_public_key().to_bytes())
    run_id = ids[acc].group(2)
    target = Target(
        address=ids[acc].group(3),
        run_id=run_id,
        token=TOKEN,
        fingerprint=str(saved["fingerprint"]),
        numel=theta.numel(),
        partner=partner,
        peer_id=ids[acc].group(1),
        insider=CallAuth(
            run_id, TOKEN, insider_id, key, lambda _p: None, peer_id_of_key=peer_id_of_owner
        ),
    )
    loop = asyncio.new_event_loop()
    try:
        round_before = loop.run_until_complete(daemon_round(target.address, target.run_id, TOKEN))
        rejected_before = _rejected(ports[acc])
        rss_before = rss_bytes(victim.proc.pid)
        tally = Tally()

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(cases())
        def attack(case: Case) -> None:  # the SWEEP first (explicit examples), then draws
            now = loop.run_until_complete(daemon_round(target.address, target.run_id, TOKEN))
            verdict = loop.run_until_complete(send_case(case, target, now))
            tally.verdicts.append(verdict)
            assert verdict.refused, f"{case.describe()} was accepted"
            # Refused by our checks with a named reason, or by gRPC before any handler.
            assert verdict.reason != "other" or verdict.code in GRPC_CORE_REFUSALS, verdict

        for case in reversed(SWEEP):  # decorators apply inside out: SWEEP runs in order
            attack = example(case)(attack)
        attack()
        floods = [loop.run_until_complete(flood(target.address, 90, 3.0, seed)) for seed in (1, 2)]
        rss_after_first = rss_bytes(victim.proc.pid)
        loop.run_until_complete(flood(target.address, 90, 3.0, 3))
        rss_after = rss_bytes(victim.proc.pid)
        round_after = loop.run_until_complete(daemon_round(target.address, target.run_id, TOKEN))
    finally:
        loop.close()

    print("verdicts by case:", Counter(v.case for v in tally.verdicts).most_common())
    print("verdicts by reason:", Counter(f"{v.code.name}/{v.reason}" for v in tally.verdicts))
    print("floods:", floods, "rss MiB", rss_before >> 20, rss_after_first >> 20, rss_after >> 20)
    # hypothesis runs explicit examples on top of the drawn ones: the sweep, then EXAMPLES.
    assert len(tally.verdicts) == len(SWEEP) + EXAMPLES
    assert [v.case for v in tally.verdicts[: len(SWEEP)]] == [c.describe() for c in SWEEP]
    kinds = Counter(kind_of(v.case) for v in tally.verdicts)
    swept = Counter(kind_of(c.describe()) for c in SWEEP)
    assert all(kinds[kind] >= n for kind, n in swept.items()), (kinds, swept)
    # Every refusal is counted under its reason (the real partner may add refusals too:
    # a slot we stole is refused to it as "duplicate").
    counted = _rejected(ports[acc]) - rejected_before
    for reason, n in tally.by_reason().items():
        assert counted[reason] >= n, (reason, n, counted)
    assert sum(floods[0].values()) == 90
    # It kept training through all that, and still exchanges with its real partner.
    assert victim.proc.poll() is None
    assert round_after > round_before
    victim.wait_for(r"exchanged 1/1", 120)
    # Bounded memory: the floods and bad messages leave no lasting growth.
    assert rss_after - rss_before < 300 << 20, (rss_before, rss_after)
    assert rss_after - rss_after_first < 100 << 20, (rss_after_first, rss_after)
    for d in daemons:
        d.signal(signal.SIGTERM)
    for i, d in enumerate(daemons):
        assert d.finish(90) == 0
        final = torch.load(tmp_path / f"c{i}" / "checkpoint.pt", weights_only=True)
        assert torch.isfinite(final["theta"]).all()
        assert torch.isfinite(final["outer_momentum"]).all()
        # (the last line may be the round SIGTERM stopped before its first step: no loss)
        losses = [m.group("loss") for m in d.rounds()][:-1]
        assert losses and all(x != "nan" and math.isfinite(float(x)) for x in losses)
