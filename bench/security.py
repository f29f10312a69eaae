"""Honest peers under attack: throughput, loss and memory with and without each attack
(issue 14), on live daemons, in one command.

    .venv/bin/python bench/security.py                 # every scenario, ~15 min
    .venv/bin/python bench/security.py --only none idle-callers --rounds 20

Each scenario starts three honest ``gaslocd`` daemons as a user would (``start`` on one,
``join --bootstrap`` on two, a run token, a lobby of three), lets them exchange once, then
starts the attack and keeps it up until every honest daemon has finished ``--rounds``
rounds. The attackers are the adversarial clients of tests/security (the same code the
CI tests run against live daemons):

- ``dht-records`` (outsider, no token): a DHT node storing forged roster records (round 0,
  a huge round, a dead address) and a plain value over the roster key, without pause;
- ``idle-callers`` (outsider): 100 callers per daemon opening Exchange calls and holding
  them for as long as they are let;
- ``wrong-token`` (outsider): 16 callers per daemon sending GetState calls with
  credentials under a wrong token, back to back;
- ``aborting-insider`` (insider: token and a key of its own): a roster record pointing at
  a server that aborts every exchange after its header and serves a hostile state;
- ``state-flood`` (insider): 64 GetState calls per daemon opened and never read;
- ``poison-insider`` (insider): a fourth, real daemon that offers θ̃ + 0.9‖θ̃‖·u (one
  fixed direction at 0.9 of the norm bound) to every partner, every round.

Measured per honest daemon over the attack window (from the attack's start to its last
round): rounds per minute and inner steps per second (filling the wait included), the
share of planned exchanges that completed, the final validation loss, and the peak
resident memory of its process tree (daemon, DHT process, p2pd), sampled every 0.5 s;
and the calls the daemons refused, by reason, from their /metrics. ``none`` runs first,
in the middle and last: the baselines show the spread of the measurement itself. All
daemons share this machine's cores, the attackers at nice 19 (:class:`Renicer`): compare
rows of one invocation only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import grpc
import matplotlib.pyplot as plt
import torch
from hivemind.utils.crypto import RSAPrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gaslocd.net.auth import CallAuth
from gaslocd.net.client import GET_STATE
from gaslocd.net.proto import peer_pb2 as pb
from gaslocd.net.roster_auth import peer_id_of_owner
from tests.daemon.procs import FAST_FLAGS, Daemon, gaslocd_argv
from tests.faults.fuzz import free_port
from tests.security.nodes import HostileNode, IdleStrangers, Site, identity_above, refused_counts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RUN, TOKEN = "bench-sec", "bench-s3cret-token"
SECURITY = ROOT / "tests" / "security"
ORDER = (
    "none",
    "dht-records",
    "idle-callers",
    "wrong-token",
    "aborting-insider",
    "state-flood",
    "poison-insider",
)


def honest_flags(rounds: int, tmp: Path, k: int, port: int, peers: int) -> list[str]:
    return [
        *FAST_FLAGS, "--run-id", RUN, "--token", TOKEN, "--min-peers", str(peers),
        "--exchange-deadline", "3", "--max-rounds", str(rounds), "--json",
        str(tmp / f"w{k}.json"), "--metrics-port", str(port), "--checkpoint-dir",
        str(tmp / f"c{k}"), "--checkpoint-every", "5", "--seed", "0", "--inner-steps", "16",
    ]  # fmt: skip


def start_site(rounds: int, tmp: Path, insider: bool) -> Site:
    """Three honest daemons, and with ``insider`` a poisoning fourth one in their lobby
    (so that it takes part from the first round, as an insider who planned it would)."""
    procs: list[subprocess.Popen[bytes]] = []
    ports = [free_port() for _ in range(3)]
    peers = 4 if insider else 3
    first = Daemon(["start", *honest_flags(rounds, tmp, 0, ports[0], peers)], procs, "w0")
    bootstrap = first.wait_for(r"bootstrap address: (\S+)", 180).group(1)
    poisoner = start_poisoner(bootstrap, procs) if insider else None
    daemons = [first] + [
        Daemon(
            ["join", "--bootstrap", bootstrap, *honest_flags(rounds, tmp, k, ports[k], peers)],
            procs,
            f"w{k}",
        )
        for k in (1, 2)
    ]
    for d in daemons:
        d.wait_for(r"exchanged [1-9]", 240)
    return Site.of(daemons, ports, bootstrap, tmp, procs=procs, poisoner=poisoner)


# -- attacks: each starts its attacker and returns how to stop it ----------------------------


class _Callers:
    """``per_address`` coroutines per honest daemon on an event loop of their own."""

    def __init__(self, site: Site, per_address: int) -> None:
        self.site = site
        self.codes: Counter[str] = Counter()
        self.loop = asyncio.new_event_loop()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(per_address,), daemon=True)
        self.thread.start()

    def _run(self, per_address: int) -> None:
        async def all_callers() -> None:
            await asyncio.gather(
                *(
                    self.caller(k)
                    for k in range(len(self.site.addresses))
                    for _ in range(per_address)
                ),
                return_exceptions=True,
            )

        self.loop.run_until_complete(all_callers())
        self.loop.close()

    async def caller(self, k: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)

    def request(self, me: str) -> bytes:
        return pb.StateRequest(
            run_id=RUN, sender=me, fingerprint=self.site.fingerprint
        ).SerializeToString()


class WrongToken(_Callers):
    """GetState calls with credentials under a wrong token, back to back."""

    async def caller(self, k: int) -> None:
        key = RSAPrivateKey()
        me = peer_id_of_owner(key.get_public_key().to_bytes())
        auth = CallAuth(RUN, "not-the-token", me, key, lambda _p: None)
        async with grpc.aio.insecure_channel(self.site.addresses[k]) as chan:
            while not self.stopping.is_set():
                md = auth.metadata(self.site.ids[k], "GetState")[0]
                try:
                    async for _ in chan.unary_stream(GET_STATE)(
                        self.request(me), timeout=10, metadata=md
                    ):
                        pass
                    self.codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    self.codes[exc.code().name] += 1


class StateFlood(_Callers):
    """An insider's GetState calls, opened and never read, each held 20 s then renewed."""

    async def caller(self, k: int) -> None:
        key = RSAPrivateKey()
        me = peer_id_of_owner(key.get_public_key().to_bytes())
        auth = CallAuth(RUN, TOKEN, me, key, lambda _p: None)
        async with grpc.aio.insecure_channel(self.site.addresses[k]) as chan:
            while not self.stopping.is_set():
                md = auth.metadata(self.site.ids[k], "GetState")[0]
                call = chan.unary_stream(GET_STATE)(self.request(me), timeout=20, metadata=md)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    code = await call.code()  # never reads: ends at the timeout or a refusal
                    self.codes[code.name] += 1


def attack_dht_records(site: Site) -> Callable[[], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, str(SECURITY / "roster_attacker.py"), RUN, site.bootstrap],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
        cwd=ROOT,
    )
    site.procs.append(proc)
    site.attackers.append(proc.pid)

    def stop() -> dict[str, Any]:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate(timeout=30)[0].decode()
        first = out.splitlines()[0] if out else "{}"
        return {"stores accepted by the run's nodes": json.loads(first).get("accepted")}

    return stop


def attack_idle_callers(site: Site) -> Callable[[], dict[str, Any]]:
    strangers = IdleStrangers(site.addresses, per_address=100)

    def stop() -> dict[str, Any]:
        strangers.stop()
        return {"call outcomes": dict(strangers.codes)}

    return stop


def _callers(kind: type[_Callers], per_address: int) -> Callable[[Site], Callable[[], Any]]:
    def attack(site: Site) -> Callable[[], dict[str, Any]]:
        callers = kind(site, per_address)

        def stop() -> dict[str, Any]:
            callers.stop()
            return {"call outcomes": dict(callers.codes)}

        return stop

    return attack


def attack_aborting_insider(site: Site) -> Callable[[], dict[str, Any]]:
    identity = site.tmp / "hostile.key"
    identity_above(site.ids, identity)  # the honest daemons dial it
    node = HostileNode(RUN, TOKEN, site.bootstrap, site.fingerprint, site.numel, identity)

    def stop() -> dict[str, Any]:
        seen = node.exchanges_seen()
        leaked = any(TOKEN.encode() in blob for blob in node.peer.seen)
        node.shutdown()
        return {"exchanges it aborted": seen, "token seen": leaked}

    return stop


def start_poisoner(bootstrap: str, procs: list[subprocess.Popen[bytes]]) -> Daemon:
    """tests/security/insider_daemon.py: a real daemon whose θ̃ offers are poisoned."""
    argv = [
        "join", "--bootstrap", bootstrap, *FAST_FLAGS, "--run-id", RUN, "--token", TOKEN,
        "--min-peers", "4", "--exchange-deadline", "3", "--metrics-port", str(free_port()),
        "--seed", "0", "--inner-steps", "16",
    ]  # fmt: skip
    command = [sys.executable, str(SECURITY / "insider_daemon.py"), *gaslocd_argv(argv)[3:]]
    return Daemon([], procs, "insider", command=command)


def attack_poison_insider(site: Site) -> Callable[[], dict[str, Any]]:
    insider = site.poisoner  # in the run since the lobby (start_site)
    assert insider is not None
    site.attackers.append(insider.proc.pid)

    def stop() -> dict[str, Any]:
        insider.signal(signal.SIGTERM)
        with contextlib.suppress(AssertionError):
            insider.finish(90)  # reads its output, which rounds() counts
        return {"insider rounds": len(insider.rounds())}

    return stop


ATTACKS: dict[str, Callable[[Site], Callable[[], dict[str, Any]]]] = {
    "dht-records": attack_dht_records,
    "idle-callers": attack_idle_callers,
    "wrong-token": _callers(WrongToken, 16),
    "aborting-insider": attack_aborting_insider,
    "state-flood": _callers(StateFlood, 64),
    "poison-insider": attack_poison_insider,
}


# -- measurement -----------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (0 once gone)."""
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError):
            found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text())
            total += int(found.group(1)) * 1024 if found else 0  # a zombie has none
    return total


TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants, reaped children's included."""
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICK


@dataclass
class Sampler:
    """Peak memory, CPU time and the last refusal counts of the honest daemons, and the
    attackers' CPU time (this process's, whose threads run the in-process attackers, and
    the attacker processes'), sampled on a thread every 0.5 s."""

    site: Site
    peak: list[int] = field(default_factory=list)
    refused: list[Counter[str]] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # honest CPU seconds since the start
    attacker_cpu: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.site.daemons)
        self.peak, self.cpu = [0] * n, [0.0] * n
        self.refused = [Counter() for _ in range(n)]
        self._cpu0 = [_tree_cpu(d.proc.pid) for d in self.site.daemons]
        self._own0 = time.process_time()
        self._attackers0: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(0.5):  # the sampling period
            self._sample(tick)
            tick += 1

    def _sample(self, tick: int) -> None:
        for k, d in enumerate(self.site.daemons):
            if d.proc.poll() is not None:
                continue  # keep the last values read while it ran
            self.peak[k] = max(self.peak[k], _tree_rss(d.proc.pid))
            self.cpu[k] = max(self.cpu[k], _tree_cpu(d.proc.pid) - self._cpu0[k])
            if tick % 4 == 0:
                with contextlib.suppress(OSError):
                    self.refused[k] = +refused_counts(self.site.metrics[k])
        spent = 0.0
        for pid in self.site.attackers:
            now = _tree_cpu(pid)
            spent += max(0.0, now - self._attackers0.setdefault(pid, now))
        self.attacker_cpu = max(self.attacker_cpu, spent + time.process_time() - self._own0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


class Renicer:
    """Runs the attackers at nice 19 while the honest daemons stay at 0: a real attacker
    burns its own machine's CPU, not the victims'; on one 2-core machine its CPU would
    otherwise come out of the honest daemons' share and be counted as the defences'
    cost. Every second, every thread of this process (the in-process attackers) and of
    its child processes other than the daemons of the run (attacker processes, their
    DHT nodes) is set to nice 19; at the end this process goes back to 0, so that the
    next scenario's daemons start at 0."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self._stop = threading.Event()
        self._pass()  # before the attack starts: what this thread creates inherits 19
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pass(self) -> None:
        runs = [d.proc.pid for d in self.site.daemons]
        if self.site.poisoner is not None:
            runs.append(self.site.poisoner.proc.pid)
        spared = {p for pid in runs for p in _tree(pid)}
        for pid in _tree(os.getpid()):
            if pid not in spared:
                _nice(pid, 19)

    def _run(self) -> None:
        while not self._stop.wait(1.0):  # the renicing period
            self._pass()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        _nice(os.getpid(), 0)


def _nice(pid: int, value: int) -> None:
    """Set every thread of ``pid`` to ``value`` (Linux niceness is per thread)."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), value)


def run_scenario(name: str, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"sec-{name}-") as tmp_name:
        tmp = Path(tmp_name)
        site = start_site(rounds, tmp, insider=name == "poison-insider")
        try:
            sampler = Sampler(site)
            began = time.time()
            renicer = Renicer(site)
            stop = ATTACKS[name](site) if name != "none" else (lambda: {})
            try:
                codes = [d.finish(60 + 20 * rounds) for d in site.daemons]
            finally:
                detail = stop()
                renicer.stop()
                sampler.stop()
            summaries = [json.loads((tmp / f"w{k}.json").read_text()) for k in range(3)]
            clips = sum("clipped " in line for d in site.daemons for line in d.lines)
            return _measure(name, began, codes, summaries, sampler, {**detail, "clips": clips})
        finally:
            for proc in site.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)


def _measure(
    name: str,
    began: float,
    codes: list[int],
    summaries: list[dict[str, Any]],
    sampler: Sampler,
    detail: dict[str, Any],
) -> dict[str, Any]:
    per: list[dict[str, Any]] = []
    for s in summaries:
        rows = [r for r in s["rounds"] if r["unix_time"] >= began]
        window = max(1e-9, rows[-1]["unix_time"] - began) if rows else float("nan")
        planned = sum(r["partners"] for r in rows)
        per.append(
            {
                "rounds": len(rows),
                "rounds_per_min": 60 * len(rows) / window,
                "steps_per_s": sum(r["inner_steps"] for r in rows) / window,
                "exchanged": sum(r["exchanged"] for r in rows) / planned if planned else 0.0,
                "final_val_loss": s["final_val_loss"],
            }
        )
    refused: Counter[str] = Counter()
    for counts in sampler.refused:
        refused.update(counts)
    steps = sum(
        sum(r["inner_steps"] for r in s["rounds"] if r["unix_time"] >= began) for s in summaries
    )
    window = max(max(r["unix_time"] for r in s["rounds"]) for s in summaries) - began
    return {
        "scenario": name,
        "exit_codes": codes,
        "peers": per,
        "rounds_per_min": statistics.fmean(p["rounds_per_min"] for p in per),
        "steps_per_s": statistics.fmean(p["steps_per_s"] for p in per),
        "exchanged": statistics.fmean(p["exchanged"] for p in per),
        "val_loss": statistics.fmean(p["final_val_loss"] for p in per),
        "worst_val_loss": max(p["final_val_loss"] for p in per),
        "peak_rss_mib": max(sampler.peak) / 2**20,
        "honest_cpu_ms_per_step": 1000 * sum(sampler.cpu) / max(1, steps),
        "attacker_cores": sampler.attacker_cpu / max(1e-9, window),
        "refused": dict(refused),
        "detail": detail,
    }


# -- report ----------------------------------------------------------------------------------


def _rows(runs: list[dict[str, Any]]) -> Iterator[str]:
    base = [r for r in runs if r["scenario"] == "none"]
    steps = statistics.fmean(r["steps_per_s"] for r in base)
    cpu = statistics.fmean(r["honest_cpu_ms_per_step"] for r in base)
    loss = statistics.fmean(r["val_loss"] for r in base)
    mem = statistics.fmean(r["peak_rss_mib"] for r in base)
    yield (
        "| scenario | exit codes | inner steps/s | vs none | honest CPU ms/step | vs none | "
        "attacker CPU, cores | exchanges done | val loss (mean, worst) | vs none | "
        "peak memory MiB | vs none | refused calls |"
    )
    yield "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    for r in runs:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(r["refused"].items())) or "-"
        yield (
            f"| {r['scenario']} | {' '.join(map(str, r['exit_codes']))} | "
            f"{r['steps_per_s']:.2f} | {100 * r['steps_per_s'] / steps:.0f}% | "
            f"{r['honest_cpu_ms_per_step']:.1f} | "
            f"{100 * r['honest_cpu_ms_per_step'] / cpu - 100:+.0f}% | "
            f"{r['attacker_cores']:.2f} | {100 * r['exchanged']:.0f}% | "
            f"{r['val_loss']:.4f}, {r['worst_val_loss']:.4f} | {r['val_loss'] - loss:+.4f} | "
            f"{r['peak_rss_mib']:.0f} | {r['peak_rss_mib'] - mem:+.0f} | {refused} |"
        )


def _plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Throughput and CPU per step against the no-attack runs, the band their spread."""
    base = [r for r in runs if r["scenario"] == "none"]
    seen: Counter[str] = Counter()
    labels = []
    for r in runs:
        seen[r["scenario"]] += 1
        repeated = sum(x["scenario"] == r["scenario"] for x in runs) > 1
        labels.append(f"{r['scenario']} {seen[r['scenario']]}" if repeated else r["scenario"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, key, what in (
        (axes[0], "steps_per_s", "honest inner steps/s, % of no attack"),
        (axes[1], "honest_cpu_ms_per_step", "honest CPU per inner step, % of no attack"),
    ):
        mean = statistics.fmean(r[key] for r in base)
        values = [100 * r[key] / mean for r in runs]
        low, high = (100 * f(r[key] for r in base) / mean for f in (min, max))
        ax.axhspan(low, high, color="0.85", label="spread of the no-attack runs")
        ax.bar(labels, values, color=["0.5" if r in base else "C0" for r in runs])
        if key == "steps_per_s":
            ax.axhline(80, color="C3", linestyle=":", label="outsider target: 80%")
        ax.set_ylabel(what)
        ax.tick_params(axis="x", rotation=40)
        ax.legend(loc="lower left")
    fig.suptitle("three honest daemons under each attack (one invocation; attackers at nice 19)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(runs: list[dict[str, Any]], out: Path, argv: list[str], seconds: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "security.json").write_text(json.dumps(runs, indent=1))
    _plot(runs, out / "security.png")
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    lines = [
        "# Honest daemons under attack",
        "",
        f"Command: `{shlex.join(['.venv/bin/python', 'bench/security.py', *argv])}`  ",
        f"Machine: `{uname}`, nproc {os.cpu_count()}, torch {torch.__version__}  ",
        f"Date: {now} (UTC), commit {commit}, {seconds:.0f} s in all",
        "",
        "Three honest daemons (tiny model, H = 16, a run token, 3 s exchange deadline) on "
        "127.0.0.1; each attack runs from the daemons' first exchange to their last round. "
        "Rates are over that window, means over the three honest daemons; 'vs none' is "
        "against the mean of the `none` rows. Peak memory: the largest honest daemon's "
        "process tree (daemon, DHT process, p2pd). Honest CPU per step: the honest daemons' "
        "process trees' CPU seconds over the window, per inner step trained: what the "
        "defences cost them. Attacker CPU: what the attackers themselves burned (this "
        "process's threads and the attacker processes), run at nice 19 so that, as on an "
        "attacker's own machine, it is not taken from the honest daemons (nice 0) on these "
        "shared cores. Refused calls: summed over the honest daemons' "
        "`gasloc_calls_refused_total`, read every 2 s while they ran.",
        "",
        *_rows(runs),
        "",
        "What each attacker saw (and `clips`: the partners' θ̃ the honest daemons pulled in "
        "to their trust radius, from their logs):",
        "",
        *(f"- {r['scenario']}: {json.dumps(r['detail'])}" for r in runs),
        "",
        "![throughput and CPU per step per attack](security.png)",
        "",
    ]
    (out / "security.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=ORDER, default=None)
    parser.add_argument("--rounds", type=int, default=80, help="rounds each honest daemon runs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw security.png from security.json"
    )
    args = parser.parse_args(argv)
    if args.plot_only:
        _plot(json.loads((args.out / "security.json").read_text()), args.out / "security.png")
        return 0
    chosen = args.only or [*ORDER[:4], "none", *ORDER[4:], "none"]
    began = time.perf_counter()
    runs = []
    for name in chosen:
        result = run_scenario(name, args.rounds)
        runs.append(result)
        print(
            f"{name:18s} steps/s {result['steps_per_s']:6.2f}  rounds/min "
            f"{result['rounds_per_min']:5.1f}  exchanged {100 * result['exchanged']:3.0f}%  "
            f"val {result['val_loss']:.4f}  peak {result['peak_rss_mib']:.0f} MiB  "
            f"cpu/step {result['honest_cpu_ms_per_step']:.1f} ms  "
            f"attacker {result['attacker_cores']:.2f} cores  "
            f"exits {result['exit_codes']}",
            flush=True,
        )
    if not any(r["scenario"] == "none" for r in runs):
        print("no 'none' baseline chosen: no report written")
        return 0
    given = sys.argv[1:] if argv is None else argv
    write_report(runs, args.out, given, time.perf_counter() - began)
    print("\n".join(_rows(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
