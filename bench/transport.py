"""Transport bench: one two-way θ̃ exchange per codec against raw TCP, raw gRPC and hivemind.

    .venv/bin/python bench/transport.py            # 256 MiB and 16 MiB, loopback + 1 Gbit/s
    .venv/bin/python bench/transport.py --quick    # 16 MiB and 4 MiB, < 1 min

Every number comes from two separate processes started here, each side sending its
whole tensor and receiving the other's at the same time (what one round does):
(a) ``tcp``: one socket, sendall + recv_into preallocated buffers (the ceiling);
(b) ``grpc-raw``: a bidirectional gRPC stream of 2 MiB bytes messages, identity
serializers, no codec, no checks, the same message object sent again and again and the
received ones dropped (the best gRPC can do here); ``grpc-tensor`` is the same stream
with the bytes cut from a tensor-sized buffer and copied into another one (the memory
traffic any real transfer has, still no codec and no checks);
(c) ``hivemind``: DecentralizedAverager.step() of the same tensor by two peers (what a
user would reach for); minus the step time of a 4 KiB tensor = its matchmaking floor;
(d) ``exchange/<codec>``: gaslocd's ExchangeServer.open_round + exchange_round.
Throughput = fp32 tensor bytes per direction / time. Then the exchange per codec on a
link shaped to 1 Gbit/s between two network namespaces (bench/netns.py). Ratios only
compare numbers from this one invocation (the machine is shared). Writes
bench/results/transport.md and transport.png; a py-spy profile of three exchanges of
the largest size (fp32 and int8, all threads of one side) goes into the md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MiB = 1 << 20
CHUNK = 2 * MiB
CODECS = ("fp32", "fp16", "bf16", "int8")
ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}


# ---------------------------------------------------------------------------- children


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def commands() -> list[dict]:
    line = sys.stdin.readline()
    return [json.loads(line)] if line else [{"op": "quit"}]


def proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def tcp_child(a: argparse.Namespace) -> None:
    nbytes = a.nbytes
    out, inbuf = bytearray(os.urandom(1024) * (nbytes // 1024)), bytearray(nbytes)
    if a.side == 0:
        lsock = socket.create_server((a.host, 0))
        emit({"op": "ready", "port": lsock.getsockname()[1]})
        conn, _ = lsock.accept()
    else:
        emit({"op": "ready", "port": 0})
        conn = socket.create_connection((a.host, a.port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while commands()[0]["op"] == "go":
        start = time.perf_counter()
        sender = threading.Thread(target=conn.sendall, args=(memoryview(out),))
        sender.start()
        view, got = memoryview(inbuf), 0
        while got < nbytes:
            got += conn.recv_into(view[got:])
        sender.join()
        emit({"op": "done", "elapsed_s": time.perf_counter() - start})


async def grpc_raw_child(a: argparse.Namespace) -> None:
    import grpc

    chunk = os.urandom(CHUNK)
    count = a.nbytes // CHUNK
    touch = a.child == "grpc-tensor"  # bytes come from / go to tensor-sized buffers
    src = memoryview(bytearray(os.urandom(1024) * (a.nbytes // 1024))) if touch else None
    dst = memoryview(bytearray(a.nbytes)) if touch else None
    opts = [("grpc.max_send_message_length", CHUNK + 1024)]
    opts += [("grpc.max_receive_message_length", CHUNK + 1024)]

    async def both(write, read, done_writing=None) -> int:  # type: ignore[no-untyped-def]
        async def send() -> None:
            for i in range(count):
                await write(bytes(src[i * CHUNK : (i + 1) * CHUNK]) if src else chunk)
            if done_writing is not None:
                await done_writing()

        task = asyncio.ensure_future(send())
        got = 0
        while (msg := await read()) is not grpc.aio.EOF:
            if dst is not None:
                dst[got : got + len(msg)] = msg
            got += len(msg)
        await task
        return got

    if a.side == 0:

        async def handler(_req: object, ctx: grpc.aio.ServicerContext) -> None:
            await both(ctx.write, ctx.read)

        server = grpc.aio.server(options=opts)
        method = grpc.stream_stream_rpc_method_handler(handler)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("b.Raw", {"S": method}),)
        )
        port = server.add_insecure_port(f"{a.host}:0")
        await server.start()
        emit({"op": "ready", "port": port})
        while (await asyncio.to_thread(commands))[0]["op"] == "go":
            emit({"op": "done", "elapsed_s": 0.0})  # the caller's time covers both ways
        await server.stop(0)
        return
    emit({"op": "ready", "port": 0})
    async with grpc.aio.insecure_channel(f"{a.host}:{a.port}", options=opts) as chan:
        while (await asyncio.to_thread(commands))[0]["op"] == "go":
            start = time.perf_counter()
            call = chan.stream_stream("/b.Raw/S")(timeout=600)
            await both(call.write, call.read, call.done_writing)
            emit({"op": "done", "elapsed_s": time.perf_counter() - start})


async def exchange_child(a: argparse.Namespace) -> None:
    import torch

    from gaslocd.config import WireConfig
    from gaslocd.net.codecs import ErrorFeedback, get_codec
    from gaslocd.net.server import ExchangeServer
    from gaslocd.net.validation import Identity

    numel = a.nbytes // 4
    theta = torch.randn(numel, generator=torch.Generator().manual_seed(0))  # shared start
    theta += 0.01 * torch.randn(numel, generator=torch.Generator().manual_seed(1 + a.side))
    inbox = torch.zeros(numel).fill_(1.0)  # the daemon's reused buffer, touched once
    me, other = f"peer{a.side}", f"peer{1 - a.side}"
    server = ExchangeServer(WireConfig(token="bench"), Identity("bench", me, "bench"))
    port = await server.start(a.host, 0)
    emit({"op": "ready", "port": port})
    feedback: dict[str, ErrorFeedback] = {}
    round_ = 0
    while (cmd := (await asyncio.to_thread(commands))[0])["op"] != "quit":
        if cmd["op"] == "open":
            codec = cmd["codec"]
            if codec != "fp32" and codec not in feedback:
                feedback[codec] = ErrorFeedback(get_codec(codec), numel)
                feedback[codec].residual.fill_(0.0)  # persistent state, touched up front
            round_ += 1
            await server.open_round(
                round_,
                theta,
                {other: cmd["address"]},
                codec=codec,
                feedback=feedback.get(codec),
                receive_buffers=[inbox],
            )
            emit({"op": "opened"})
            continue
        rss = proc_status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        start = time.perf_counter()
        outcome = (await server.exchange_round(round_, 600))[other]
        elapsed = time.perf_counter() - start
        extra = proc_status("VmHWM") - rss
        report = {"op": "done", "elapsed_s": elapsed, "ok": outcome.ok, "extra_bytes": extra}
        if outcome.ok:
            report.update(transfer_s=outcome.transfer_s, wire_bytes=outcome.bytes_received)
        else:
            report.update(reason=outcome.reason)
        emit(report)
    await server.stop(0.5)


def hivemind_child(a: argparse.Namespace) -> None:
    import hivemind
    import torch
    from hivemind.averaging import DecentralizedAverager

    initial = [a.peers] if a.peers else []
    dht = hivemind.DHT(start=True, host_maddrs=[f"/ip4/{a.host}/tcp/0"], initial_peers=initial)
    maddrs = [str(m) for m in dht.get_visible_maddrs()]
    averagers = {}
    for name, numel in (("big", a.nbytes // 4), ("tiny", 1024)):
        averagers[name] = DecentralizedAverager(
            [torch.randn(numel)],
            dht,
            prefix=f"bench-{name}",
            target_group_size=2,
            min_group_size=2,
            min_matchmaking_time=1.0,
            request_timeout=0.5,
            allreduce_timeout=300,
            next_chunk_timeout=60,
            sender_timeout=60,
            reducer_timeout=120,
            start=True,
        )
    emit({"op": "ready", "port": 0, "maddrs": maddrs})
    while (cmd := commands()[0])["op"] == "go":
        start = time.perf_counter()
        ok = averagers[cmd.get("which", "big")].step(timeout=300) is not None
        emit({"op": "done", "elapsed_s": time.perf_counter() - start, "ok": ok})
    for av in averagers.values():
        av.shutdown()
    dht.shutdown()


# ---------------------------------------------------------------------------- orchestrator


class Child:
    def __init__(
        self,
        role: str,
        side: int,
        nbytes: int,
        host: str,
        prefix: list[str],
        port: int = 0,
        peers: str = "",
    ) -> None:
        argv = [
            sys.executable,
            __file__,
            "--child",
            role,
            "--side",
            str(side),
            "--nbytes",
            str(nbytes),
            "--host",
            host,
            "--port",
            str(port),
            "--peers",
            peers,
        ]
        self.proc = subprocess.Popen(
            [*prefix, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV, text=True
        )
        self.ready = self.recv()

    def send(self, **cmd: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench child exited with {self.proc.wait(30)}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(30)


def pair(
    role: str, nbytes: int, hosts: tuple[str, str], prefixes: tuple[list[str], list[str]]
) -> tuple[Child, Child]:
    a = Child(role, 0, nbytes, hosts[0], prefixes[0])
    maddr = next((m for m in a.ready.get("maddrs", []) if "/tcp/" in m), "")
    b = Child(role, 1, nbytes, hosts[1], prefixes[1], port=a.ready["port"], peers=maddr)
    return a, b


def timed(a: Child, b: Child, repeats: int, **go: object) -> list[float]:
    times = []
    for _ in range(repeats):
        a.send(op="go", **go)
        b.send(op="go", **go)
        times.append(max(a.recv()["elapsed_s"], b.recv()["elapsed_s"]))
    return times


class ExchangePair:
    """Two exchange children that run one round per call of :meth:`one`."""

    def __init__(self, nbytes: int, hosts: tuple[str, str], prefixes: tuple[list[str], list[str]]):
        self.a, self.b = pair("exchange", nbytes, hosts, prefixes)
        self.addresses = [
            f"{hosts[0]}:{self.a.ready['port']}",
            f"{hosts[1]}:{self.b.ready['port']}",
        ]

    def one(self, codec: str) -> dict:
        a, b = self.a, self.b
        for me, there in ((a, self.addresses[1]), (b, self.addresses[0])):
            me.send(op="open", codec=codec, address=there)
        for me in (a, b):
            assert me.recv()["op"] == "opened"
        for me in (a, b):
            me.send(op="exchange")
        reps = [a.recv(), b.recv()]
        if not all(r["ok"] for r in reps):
            raise RuntimeError(f"exchange failed: {reps}")
        return {
            "t": max(r["elapsed_s"] for r in reps),
            "extra": max(r["extra_bytes"] for r in reps),
            "wire": reps[0]["wire_bytes"],
        }

    def close(self) -> None:
        self.a.close()
        self.b.close()


def interleaved(runners: dict[str, Callable[[], dict]], repeats: int) -> dict[str, list[dict]]:
    """One warm-up each, then ``repeats`` rounds of every method in turn: the load other
    jobs put on a shared machine comes and goes, and round-robin spreads it evenly."""
    for run in runners.values():
        run()
    out: dict[str, list[dict]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            out[name].append(run())
    return out


def exchange_results(runs: dict[str, list[dict]]) -> dict[str, dict]:
    return {
        c: {
            "times": [r["t"] for r in runs[f"exchange/{c}"]],
            "extra_bytes": max(r["extra"] for r in runs[f"exchange/{c}"]),
            "wire_bytes": runs[f"exchange/{c}"][0]["wire"],
        }
        for c in CODECS
    }


class spy:  # a context manager that reads like a function
    """py-spy sampling every thread of ``pid`` while the block runs; a text summary."""

    def __init__(self, pid: int) -> None:
        self.pid, self.path, self.text = pid, RESULTS / f".spy-{pid}.txt", []

    def __enter__(self) -> list[str]:
        exe = Path(sys.executable).with_name("py-spy")
        if not exe.exists():
            self.proc = None
            self.text.append("py-spy is not installed: no profile")
            return self.text
        argv = [
            str(exe),
            "record",
            "--pid",
            str(self.pid),
            "--threads",
            "--format",
            "raw",
            "-r",
            "400",
            "-o",
            str(self.path),
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches
        return self.text

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(2)  # SIGINT: py-spy writes its samples and exits
        self.proc.wait(60)
        by_thread: dict[str, int] = {}
        leaves: dict[str, int] = {}
        for line in self.path.read_text().splitlines():
            stack, count = line.rsplit(" ", 1)
            frames = stack.split(";")
            thread = frames[0].split(": ", 1)[-1]
            by_thread[thread] = by_thread.get(thread, 0) + int(count)
            key = f"{thread} | {frames[-1]}"
            leaves[key] = leaves.get(key, 0) + int(count)
        self.path.unlink()
        total = sum(by_thread.values()) or 1
        self.text.append(f"{total} samples (400 Hz; waiting in C code counts as active)")
        self.text += [
            f"{n / total:6.1%}  thread {t}"
            for t, n in sorted(by_thread.items(), key=lambda x: -x[1])
        ]
        self.text.append("top leaf frames:")
        self.text += [
            f"{n / total:6.1%}  {k}" for k, n in sorted(leaves.items(), key=lambda x: -x[1])[:14]
        ]


def loopback(nbytes: int, repeats: int, profile: bool) -> dict:
    hosts = ("127.0.0.1", "127.0.0.1")
    kids = {
        role: pair(role, nbytes, hosts, ([], [])) for role in ("tcp", "grpc-raw", "grpc-tensor")
    }
    kids["hivemind"] = pair("hivemind", nbytes, hosts, ([], []))
    ex = ExchangePair(nbytes, hosts, ([], []))

    def time_of(role: str, **go: object) -> Callable[[], dict]:
        return lambda: {"t": timed(*kids[role], 1, **go)[0]}

    runners = {role: time_of(role) for role in ("tcp", "grpc-raw", "grpc-tensor")}
    runners["hivemind"] = time_of("hivemind", which="big")
    runners["hivemind-floor"] = time_of("hivemind", which="tiny")
    for c in CODECS:
        runners[f"exchange/{c}"] = lambda c=c: ex.one(c)  # type: ignore[misc]
    try:
        runs = interleaved(runners, repeats)
        res: dict = {k: [r["t"] for r in v] for k, v in runs.items() if "/" not in k}
        res["exchange"] = exchange_results(runs)
        if profile:
            for c in ("fp32", "int8"):
                with spy(ex.a.proc.pid) as summary:
                    for _ in range(3):
                        ex.one(c)
                res["exchange"][c]["profile"] = summary
    finally:
        ex.close()
        for a, b in kids.values():
            a.close()
            b.close()
    return res


def shaped(nbytes: int, repeats: int, rate_mbit: float) -> dict | str:
    sys.path.insert(0, str(HERE))
    import netns

    ok, why = netns.available()
    if not ok:
        return why
    netns.cleanup_stale()
    with netns.NetLab(2, rate_mbit=rate_mbit) as lab:
        prefixes = (lab.exec_argv(0, []), lab.exec_argv(1, []))
        hosts = (lab.address(0), lab.address(1))
        a = Child("tcp", 0, nbytes, hosts[0], prefixes[0])
        b = Child("tcp", 1, nbytes, hosts[0], prefixes[1], port=a.ready["port"])
        ex = ExchangePair(nbytes, hosts, prefixes)
        runners: dict[str, Callable[[], dict]] = {"tcp": lambda: {"t": timed(a, b, 1)[0]}}
        for c in CODECS:
            runners[f"exchange/{c}"] = lambda c=c: ex.one(c)  # type: ignore[misc]
        try:
            runs = interleaved(runners, repeats)
        finally:
            ex.close()
            a.close()
            b.close()
        return {"tcp": [r["t"] for r in runs["tcp"]], "exchange": exchange_results(runs)}


def machine() -> str:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    import grpc
    import torch

    return (
        f"`{' '.join(platform.uname())}`; nproc {os.cpu_count()}; CPU {cpu}; Python "
        f"{platform.python_version()}, torch {torch.__version__}, grpcio {grpc.__version__}"
    )


def med(xs: list[float]) -> float:
    return statistics.median(xs)


PROFILE_READING = [
    "Where the time goes: the wire threads mostly wait (`_worker` at thread.py:81 is the",
    "idle queue wait, which py-spy counts as active); codec and check work (`_encode_rows`,",
    "`_decode_rows`, `norm`, `_decode`) is a few % of the samples. The event-loop thread",
    "spends its time inside grpc.aio's `_write`/`_read` (copies into and out of gRPC core,",
    "completion-queue waits): gRPC Python's per-message cost plus the memory passes every",
    "real transfer makes, as `grpc-tensor` shows, and one more pass over θ̃_i for the norm",
    "bound. What would close the gap to raw gRPC: fusing that norm pass with the send-side",
    "read of the same chunk of θ̃_i, larger chunks, or a C++ stream handler.",
]


def report(args: argparse.Namespace, loop: dict[int, dict], link: dict | str, took_s: float) -> str:
    rows = [
        "| size | method | median s | best s | GB/s | time / exchange-fp32 | extra mem / encoded |",
        "|---|---|---|---|---|---|---|",
    ]
    checks: list[tuple[str, float, float, bool]] = []
    for nbytes, res in loop.items():
        ex = res["exchange"]
        t32 = med(ex["fp32"]["times"])
        names = ("tcp", "grpc-raw", "grpc-tensor", "hivemind", "hivemind-floor")
        entries = [(k, res[k], "") for k in names]
        for c in CODECS:
            enc = ex[c]["wire_bytes"]
            entries.append((f"exchange/{c}", ex[c]["times"], f"{ex[c]['extra_bytes'] / enc:.2f}"))
        for name, times, mem in entries:
            gbs = "" if name == "hivemind-floor" else f"{nbytes / med(times) / 1e9:.3f}"
            rows.append(
                f"| {nbytes // MiB} MiB | {name} | {med(times):.3f} | {min(times):.3f} "
                f"| {gbs} | {med(times) / t32:.2f} | {mem} |"
            )
        size = f"{nbytes // MiB} MiB"
        g = med(res["grpc-raw"]) / t32
        checks.append((f"{size}: fp32 exchange / raw gRPC throughput ≥ 0.8", g, 0.8, g >= 0.8))
        h = med(res["hivemind"]) / t32
        checks.append((f"{size}: fp32 exchange vs hivemind averaging ≥ 5×", h, 5, h >= 5))
        for c in CODECS:
            m = ex[c]["extra_bytes"] / ex[c]["wire_bytes"]
            checks.append((f"{size}: {c} peak extra memory / encoded < 1.5", m, 1.5, m < 1.5))
    lines = [
        f"# Transport bench ({'quick' if args.quick else 'full'})",
        "",
        f"- command: `{' '.join(sys.argv)}`",
        f"- machine: {machine()}",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}; took {took_s:.0f} s",
        "- each time: one two-way exchange between two processes (both directions at once); "
        "GB/s = fp32 tensor bytes per direction / median time",
        "",
        "## Loopback",
        "",
        *rows,
    ]
    lines += [
        "",
        f"## Link shaped to {args.rate_mbit:g} Mbit/s (two network namespaces, tc tbf)",
        "",
    ]
    if isinstance(link, str):
        lines.append(f"Not run: {link}")
    else:
        ex = link["exchange"]
        t32 = med(ex["fp32"]["times"])
        lines += [
            "| method | median s | best s | fp32 time / this |",
            "|---|---|---|---|",
            f"| tcp (raw bytes) | {med(link['tcp']):.3f} | {min(link['tcp']):.3f} | |",
        ]
        for c in CODECS:
            t = ex[c]["times"]
            lines.append(f"| exchange/{c} | {med(t):.3f} | {min(t):.3f} | {t32 / med(t):.2f} |")
        for c, goal in (("bf16", 1.8), ("int8", 3.0)):
            r = t32 / med(ex[c]["times"])
            checks.append(
                (
                    f"shaped {args.shaped_mib} MiB: {c} ≥ {goal}× sooner than fp32",
                    r,
                    goal,
                    r >= goal,
                )
            )
    lines += ["", "## Targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    notes = [
        "",
        "Reading these numbers: both ends run on the same cores, shared with other jobs;",
        "methods are run round-robin (repeat i of every method, then repeat i+1) so load",
        "changes hit all of them alike, yet medians still move ±30% between invocations.",
        "`grpc-raw` resends one hot 2 MiB object and drops what it receives; `grpc-tensor`",
        "reads and writes tensor-sized memory like any real transfer: the exchange's own",
        "overhead is best judged against the latter. Extra memory = peak RSS during the",
        "exchange minus RSS before it (receive buffer and error-feedback state preallocated,",
        "as a daemon holds them); for small models the fixed few chunks in flight dominate.",
    ]
    lines += [f"| {n} | {v:.2f} | {g} | {'yes' if ok else 'NO'} |" for n, v, g, ok in checks]
    lines += notes
    big = max(loop)
    for c in ("fp32", "int8"):
        prof = loop[big]["exchange"][c].get("profile")
        if prof:
            lines += [
                "",
                f"## Profile: three {big // MiB} MiB {c} exchanges, the dialer (py-spy)",
                "",
            ]
            lines += ["```", *prof, "```"]
    if any(loop[big]["exchange"][c].get("profile") for c in ("fp32", "int8")):
        lines += ["", *PROFILE_READING]
    return "\n".join(lines) + "\n"


def plot(loop: dict[int, dict], link: dict | str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    methods = ["tcp", "grpc-raw", "grpc-tensor", "hivemind", *(f"exchange/{c}" for c in CODECS)]
    width = 0.8 / len(loop)
    for i, (nbytes, res) in enumerate(sorted(loop.items())):
        vals = [
            nbytes / med(res[m] if "/" not in m else res["exchange"][m[9:]]["times"]) / 1e9
            for m in methods
        ]
        axes[0].bar(
            [x + i * width for x in range(len(methods))], vals, width, label=f"{nbytes // MiB} MiB"
        )
    axes[0].set_xticks(
        [x + width * (len(loop) - 1) / 2 for x in range(len(methods))], methods, rotation=30
    )
    axes[0].set_ylabel("GB/s of fp32 tensor per direction")
    axes[0].set_title("loopback, two-way exchange")
    axes[0].legend()
    if not isinstance(link, str):
        times = [med(link["exchange"][c]["times"]) for c in CODECS]
        axes[1].bar(CODECS, times, color="tab:orange")
        axes[1].set_ylabel("seconds per two-way exchange")
        axes[1].set_title("1 Gbit/s shaped link (netns + tc)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, < 1 min")
    p.add_argument("--rate-mbit", type=float, default=1000.0)
    p.add_argument("--child", help=argparse.SUPPRESS)
    for name, kind in (("--side", int), ("--nbytes", int), ("--port", int)):
        p.add_argument(name, type=kind, default=0, help=argparse.SUPPRESS)
    p.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    p.add_argument("--peers", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import uvloop

        if args.child in ("tcp", "hivemind"):
            {"tcp": tcp_child, "hivemind": hivemind_child}[args.child](args)
        else:
            roles = {"grpc-raw": grpc_raw_child, "grpc-tensor": grpc_raw_child}
            uvloop.run(roles.get(args.child, exchange_child)(args))
        return
    sizes = [16 * MiB, 4 * MiB] if args.quick else [256 * MiB, 16 * MiB]
    repeats = 3 if args.quick else 5
    args.shaped_mib = 16 if args.quick else 256
    start = time.monotonic()
    loop = {}
    for i, n in enumerate(sizes):
        print(f"loopback {n // MiB} MiB ...", flush=True)
        loop[n] = loopback(n, repeats, profile=i == 0)
    print(f"shaped link {args.rate_mbit:g} Mbit/s, {args.shaped_mib} MiB ...", flush=True)
    link = shaped(args.shaped_mib * MiB, 3, args.rate_mbit)
    text = report(args, loop, link, time.monotonic() - start)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    (RESULTS / f"transport{suffix}.md").write_text(text)
    plot(loop, link, RESULTS / f"transport{suffix}.png")
    print(text.split("## Profile")[0])


if __name__ == "__main__":
    main()
