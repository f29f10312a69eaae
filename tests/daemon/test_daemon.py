"""Real daemons on 127.0.0.1 (real DHT, real gRPC, real processes): training together,
late joining, killing, resuming, leaving, and the errors a volunteer would hit."""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.daemon.procs import FAST_FLAGS, Daemon, start_first, summary_rounds

pytestmark = [pytest.mark.net, pytest.mark.slow]


def _join(address: str, reaper: list[subprocess.Popen[bytes]], name: str, *extra: str) -> Daemon:
    return Daemon(["join", *FAST_FLAGS, "--bootstrap", address, *extra], reaper, name)


def test_demo_three_daemons_train_and_stay_close(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    demo = ["demo", "--workers", "3", "--rounds", "6", "--json", str(out)]
    training = [*FAST_FLAGS[:-8], "--inner-steps", "6"]  # the demo picks ports and heartbeats
    proc = subprocess.run(
        [sys.executable, "-m", "gaslocd", *demo, *training],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    curve = [p["val_loss"] for p in summary["val_loss_curve"]]
    assert len(curve) >= 4
    # Every evaluation far below an untrained byte-level model (ln 256 ≈ 5.55), and no round's
    # mixing set training back beyond the 2-batch validation's scatter. Not "improves after
    # its first evaluation": 6 steps already reach the byte-unigram plateau (~2.9) and the
    # points scatter around it by ±0.1 (CI saw 2.860 first, then 2.95, 2.92, 2.93, 2.98, 2.90;
    # runs here: 2.96 → 2.85, 3.16 → 2.89). A broken mix lands far above the plateau.
    assert all(c < math.log(256) - 2.0 for c in curve), curve
    assert max(curve) < curve[0] + 0.3, curve
    assert summary["workers_reporting"] == 3
    consensus = [p["consensus"] for p in summary["consensus_curve"]]
    # Relative distance of partners' θ̃ after H Adam steps on tiny batches: noisy, but
    # bounded well below 1 (1 would mean unrelated models).
    assert consensus and all(math.isfinite(c) and 0 <= c < 0.8 for c in consensus)
    assert all(b > 0 for b in summary["bytes_sent_per_worker"])
    for key in ("final_val_loss", "wall_clock_s", "idle_fraction", "args"):
        assert key in summary
    progress = [
        line for line in proc.stdout.splitlines() if re.match(r"\[w\d\] round +\d+ +H", line)
    ]
    # One line per daemon per round it ran; a daemon that fell two rounds behind jumps
    # ahead (round numbers only name pairings), so a round may be skipped now and then.
    assert 3 * 6 - 3 <= len(progress) <= 3 * 6


def test_late_joiner_takes_the_networks_state(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    first, address = start_first(tmp_path, reaper, "--min-peers", "2")
    second = _join(address, reaper, "w1", "--min-peers", "2")
    fresh_loss = float(first.wait_for(r"round\s+1\s.*", 120).group(0).split("loss ")[1].split()[0])
    network = first.wait_for(r"round\s+8\s+H\s+\d+\s+loss (\S+)", 120)
    network_loss = float(network.group(1))
    late = _join(address, reaper, "w2")
    # --reachable auto (the default): a live peer dialled it back, where it saw it call from
    late.wait_for(r"reachable: gRPC yes, DHT yes \(seen as 127\.0\.0\.1 by 1 peer\)", 60)
    took = late.wait_for(r"took state of round (\d+)", 120)
    assert int(took.group(1)) >= 8
    first_round = late.wait_for(r"round\s+\d+\s+H\s+\d+\s+loss (\S+)", 60)
    late_loss = float(first_round.group(1))
    # A fresh model starts ~5; the newcomer starts where the network is.
    assert abs(late_loss - network_loss) < 0.5 * abs(fresh_loss - network_loss)
    # Once active it really exchanges with the others.
    late.wait_for(r"exchanged 1/1", 90)
    for d in (first, second, late):
        d.signal(signal.SIGTERM)
    for d in (first, second, late):
        assert d.finish(60) == 0


def test_sigkill_costs_the_partner_at_most_a_deadline_then_resume_continues(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    ckpt = tmp_path / "w1"
    flags = ["--min-peers", "2", "--exchange-deadline", "5", "--checkpoint-every", "1"]
    first, address = start_first(tmp_path, reaper, *flags, "--checkpoint-dir", str(tmp_path / "w0"))
    second = _join(address, reaper, "w1", *flags, "--checkpoint-dir", str(ckpt))
    second.wait_for(r"round\s+4\s.*exchanged 1/1", 120)
    first.wait_for(r"round\s+4\s", 60)
    second.kill()
    # The survivor keeps going: a dead partner costs at most the 5 s deadline per round,
    # and once its record expires (4 s) the survivor trains alone.
    alone = first.wait_for(r"peers 1\s+exchanged 0/0", 40)
    assert alone is not None
    # Restart the killed daemon from its checkpoint: nothing it trained is lost.
    saved = torch.load(ckpt / "checkpoint.pt", weights_only=True)
    assert saved["round"] >= 4
    assert torch.isfinite(saved["theta"]).all()
    resumed = _join(address, reaper, "w1b", *flags, "--checkpoint-dir", str(ckpt), "--resume")
    line = resumed.wait_for(r"resumed from .* at round (\d+)", 120)
    assert int(line.group(1)) == saved["round"]
    resumed.wait_for(r"exchanged 1/1", 90)
    first.wait_for(r"peers 2\s+exchanged 1/1", 60)
    assert all(m.group("loss") != "nan" for m in resumed.rounds())
    for d in (first, resumed):
        d.signal(signal.SIGTERM)
        assert d.finish(60) == 0


def test_sigterm_checkpoints_and_withdraws_the_record(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    flags = ["--min-peers", "2", "--record-ttl", "60", "--heartbeat", "2"]
    first, address = start_first(tmp_path, reaper, *flags)
    ckpt = tmp_path / "leaver"
    leaver = _join(
        address,
        reaper,
        "w1",
        *flags,
        "--checkpoint-dir",
        str(ckpt),
        "--json",
        str(tmp_path / "l.json"),
    )
    leaver.wait_for(r"round\s+3\s", 120)
    leaver.signal(signal.SIGTERM)
    assert leaver.finish(60) == 0
    assert any(line.startswith("stopped after") for line in leaver.lines)
    saved = torch.load(ckpt / "checkpoint.pt", weights_only=True)
    summary = json.loads((tmp_path / "l.json").read_text())
    assert summary["kind"] == "daemon"
    assert saved["round"] == summary["rounds"][-1]["round"]
    # Its record is withdrawn, not left to expire (ttl 60 s): the other sees it gone at once.
    first.wait_for(r"peers 1\s", 20)
    first.signal(signal.SIGTERM)
    assert first.finish(60) == 0


def test_status_reports_a_running_daemon(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    first, _ = start_first(tmp_path, reaper, "--token", "s3cret")
    port = first.find(r"gRPC 127\.0\.0\.1:(\d+)").group(1)
    first.wait_for(r"round\s+2\s", 60)
    cmd = [sys.executable, "-m", "gaslocd", "status", f"127.0.0.1:{port}", "--json"]
    ok = subprocess.run([*cmd, "--token", "s3cret"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    fields = json.loads(ok.stdout)
    assert int(fields["round"]) >= 2 and fields["algo"] == "gasloc/1peer"
    wrong = subprocess.run([*cmd, "--token", "nope"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr
    first.signal(signal.SIGTERM)
    assert first.finish(60) == 0


def test_diloco_mode_keeps_replicas_identical(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    flags = ["--algo", "diloco", "--min-peers", "2", "--max-rounds", "3", "--eval-every", "1"]
    first, address = start_first(tmp_path, reaper, *flags, "--json", str(tmp_path / "a.json"))
    second = _join(address, reaper, "w1", *flags, "--json", str(tmp_path / "b.json"))
    assert first.finish(180) == 0 and second.finish(60) == 0
    runs = [summary_rounds(tmp_path / name) for name in ("a.json", "b.json")]
    vals = [[r["val_loss"] for r in rounds] for rounds in runs]
    # One model, averaged pseudo-gradients (hivemind averages as own + (mean − own), so
    # replicas may differ in the last bits: compare as the progress line shows them).
    assert len(vals[0]) == 3 and vals[0] == pytest.approx(vals[1], abs=1e-4)
    assert all(r["exchanged"] == 1 for r in runs[0])


# -- errors a volunteer hits -------------------------------------------------------------


def _gaslocd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gaslocd", *args], capture_output=True, text=True, timeout=timeout
    )


def test_wrong_token_is_refused_with_a_clear_message(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    first, address = start_first(tmp_path, reaper, "--token", "right")
    proc = _gaslocd("join", *FAST_FLAGS, "--bootstrap", address, "--token", "wrong")
    assert proc.returncode == 3
    assert "refused our join token" in proc.stderr
    first.signal(signal.SIGTERM)
    assert first.finish(60) == 0


def test_bad_bootstrap_addresses_and_busy_ports_fail_fast(tmp_path: Path) -> None:
    malformed = _gaslocd("join", *FAST_FLAGS, "--bootstrap", "not-an-address")
    assert malformed.returncode == 2 and "bootstrap" in malformed.stderr.lower()
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        port = dead.getsockname()[1]
    unreachable = _gaslocd(
        "join",
        *FAST_FLAGS,
        "--bootstrap",
        f"/ip4/127.0.0.1/tcp/{port}/p2p/QmPFoeGGi5s2buVpaz5BaXD5cQUZr65ojUjk7wrnjjtodK",
    )
    assert unreachable.returncode == 3 and "cannot start" in unreachable.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = _gaslocd("start", *FAST_FLAGS[:-6], "--port", str(busy.getsockname()[1]))
    assert taken.returncode == 3 and "--port 0" in taken.stderr
    for proc in (malformed, unreachable, taken):
        assert "Traceback" not in proc.stderr


def test_checkpoint_of_another_model_is_refused(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    ckpt = tmp_path / "c"
    first, _ = start_first(tmp_path, reaper, "--checkpoint-dir", str(ckpt), "--max-rounds", "1")
    assert first.finish(120) == 0
    before = (ckpt / "checkpoint.pt").read_bytes()
    proc = _gaslocd(
        "start", *FAST_FLAGS, "--model", "small", "--checkpoint-dir", str(ckpt), "--resume"
    )
    assert proc.returncode == 3
    assert "different model" in proc.stderr
    assert (ckpt / "checkpoint.pt").read_bytes() == before  # nothing overwritten


def test_the_partner_that_finishes_first_trains_on_until_the_other_is_ready(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    # Two peers whose rounds differ (H_base 4 vs 16: a smaller GPU, another config): the
    # one that would wait for its partner fills the wait with steps instead of idling.
    common = ["--min-peers", "2", "--max-rounds", "8"]
    out = {name: ["--json", str(tmp_path / f"{name}.json")] for name in ("s", "l", "f", "o")}
    short, address = start_first(tmp_path, reaper, *common, "--inner-steps", "4", *out["s"])
    long = _join(address, reaper, "w1", *common, "--inner-steps", "16", *out["l"])
    assert short.finish(240) == 0 and long.finish(60) == 0, short.output() + long.output()
    rounds = summary_rounds(tmp_path / "s.json")
    filled = [r["inner_steps"] for r in rounds][2:]  # T is known from round 2
    assert len(filled) >= 5 and statistics.median(filled) >= 8, short.output()
    assert max(filled) <= 4 * 4  # never beyond H_max = 4 × H_base
    # The extra steps come from filling the wait, not from a larger plan.
    assert all(r["inner_steps"] >= r["planned_inner_steps"] for r in rounds)
    assert statistics.median(r["planned_inner_steps"] for r in rounds[2:]) < statistics.median(
        filled
    )
    assert all(r["exchanged"] == r["partners"] for r in rounds), short.output()
    # Without adaptation it takes exactly its H, as configured.
    fixed, address = start_first(tmp_path, reaper, *common, "--no-adapt-h", *out["f"], name="w2")
    other = _join(address, reaper, "w3", *common, "--inner-steps", "16", *out["o"])
    assert fixed.finish(240) == 0 and other.finish(60) == 0
    rounds = summary_rounds(tmp_path / "f.json")
    assert len(rounds) >= 5, fixed.output()
    assert {r["inner_steps"] for r in rounds} == {4}, fixed.output()
