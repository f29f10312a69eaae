"""The ``gaslocd`` command (also ``python -m gaslocd``).

Settings resolve as flag > ``GASLOCD_<NAME>`` environment variable > ``--config FILE.toml``
> built-in default, here and only here: nothing below this layer reads the environment.
A wrong value exits with status 2 and one readable line, before anything starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gaslocd import __version__
from gaslocd.config import (
    ALGOS,
    CODECS,
    TOPOLOGIES,
    AlgoConfig,
    DaemonConfig,
    OuterConfig,
    SimConfig,
    Straggler,
    TrainConfig,
    WireConfig,
)

log = logging.getLogger("gaslocd")

EXIT_USAGE = 2

# Defaults that depend on --algo when the user did not set them (DiLoCo's published outer
# settings; DAdam is H = 1 by definition).
_ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "gasloc": {},
    "diloco": {"topology": "complete"},
    "dadam": {"inner_steps": 1},
    "local-dadam": {},
}


class _Settings:
    """Lookup of a setting's default: environment, then config file, then built-in."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def __call__(self, dest: str, fallback: Any) -> Any:
        env = os.environ.get(f"GASLOCD_{dest.upper()}")
        if env is not None:
            return env  # argparse applies the option's type to string defaults
        if dest in self.config:
            return self.config[dest]
        return fallback


def _load_config_file(argv: Sequence[str]) -> dict[str, Any]:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path)
    known, _ = pre.parse_known_args(argv)
    path = known.config or (
        Path(os.environ["GASLOCD_CONFIG"]) if "GASLOCD_CONFIG" in os.environ else None
    )
    if path is None:
        return {}
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    return {key.replace("-", "_"): value for key, value in raw.items()}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_training_flags(p: argparse.ArgumentParser, d: _Settings) -> None:
    g = p.add_argument_group("training (the inner loop)")
    g.add_argument(
        "--model",
        default=d("model", "tiny"),
        help="model config (tiny, small, 134m, 551m) or a factory 'pkg.module:function' "
        "returning an nn.Module whose forward(tokens, targets) gives (logits, loss)",
    )
    g.add_argument(
        "--data",
        default=d("data", None),
        help="text file, folder of text files, or uint16 .bin shards; "
        "default: the Python standard library's own sources (no download)",
    )
    g.add_argument(
        "--seq-len", type=_positive_int, default=d("seq_len", 128), help="tokens per sequence"
    )
    g.add_argument(
        "--batch-size",
        type=_positive_int,
        default=d("batch_size", 16),
        help="sequences per inner step",
    )
    g.add_argument(
        "--inner-lr", type=float, default=d("inner_lr", 1e-3), help="AdamW learning rate (β)"
    )
    g.add_argument(
        "--weight-decay", type=float, default=d("weight_decay", 0.1), help="AdamW weight decay"
    )
    g.add_argument(
        "--warmup-steps",
        type=int,
        default=d("warmup_steps", 50),
        help="linear LR warm-up, in inner steps",
    )
    g.add_argument(
        "--eval-batches",
        type=_positive_int,
        default=d("eval_batches", 8),
        help="held-out batches per validation loss",
    )
    g.add_argument(
        "--seed", type=int, default=d("seed", 0), help="seed of init, data streams and pairings"
    )
    g.add_argument(
        "--threads",
        type=_positive_int,
        default=d("threads", 1),
        help="torch intra-op threads (tiny models step fastest on one; raise for big ones)",
    )


def _add_algo_flags(p: argparse.ArgumentParser, d: _Settings) -> None:
    g = p.add_argument_group("algorithm (the outer loop)")
    g.add_argument(
        "--algo",
        choices=ALGOS,
        default=d("algo", "gasloc"),
        help="gasloc; diloco (= complete graph); dadam / local-dadam (η=1, μ=0 gossip)",
    )
    g.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default=d("topology", None),
        help="1peer: random pairs; 2peer: random ring; ring/exp/complete: baselines "
        "(default: 1peer, complete for diloco)",
    )
    g.add_argument(
        "--inner-steps",
        type=_positive_int,
        default=d("inner_steps", None),
        help="H, local steps per round (H_base when adapting; default 30, 1 for dadam)",
    )
    g.add_argument(
        "--outer-lr",
        type=float,
        default=d("outer_lr", None),
        help="outer learning rate η (default 0.7; 1 for dadam)",
    )
    g.add_argument(
        "--outer-momentum",
        type=float,
        default=d("outer_momentum", None),
        help="outer Nesterov momentum μ (default 0.9; 0 for dadam)",
    )


def _algo_config(ns: argparse.Namespace, adapt_h: bool) -> AlgoConfig:
    implied = _ALGO_DEFAULTS[ns.algo]
    topology = ns.topology or implied.get("topology", "1peer")
    inner_steps = ns.inner_steps or implied.get("inner_steps", 30)
    algo = AlgoConfig(algo=ns.algo, topology=topology, inner_steps=inner_steps, adapt_h=adapt_h)
    if ns.algo in ("dadam", "local-dadam"):
        if ns.outer_lr is not None or ns.outer_momentum is not None:
            raise ValueError(f"{ns.algo} is gossip with η=1, μ=0; use --algo gasloc to set them")
        return algo
    outer = OuterConfig(
        lr=0.7 if ns.outer_lr is None else ns.outer_lr,
        momentum=0.9 if ns.outer_momentum is None else ns.outer_momentum,
    )
    return AlgoConfig(
        algo=algo.algo, topology=topology, inner_steps=inner_steps, outer=outer, adapt_h=adapt_h
    )


def _train_config(ns: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        model=ns.model,
        data=ns.data,
        seq_len=ns.seq_len,
        batch_size=ns.batch_size,
        inner_lr=ns.inner_lr,
        weight_decay=ns.weight_decay,
        warmup_steps=ns.warmup_steps,
        eval_batches=ns.eval_batches,
        seed=ns.seed,
    )


# -- simulate -------------------------------------------------------------------------


def _add_simulate(sub: argparse._SubParsersAction, d: _Settings) -> None:
    p = sub.add_parser(
        "simulate",
        help="N workers in one process, a simulated network and clock (for research)",
        description="Train N workers in one process with the daemon's algorithm over an "
        "in-memory wire; a simulated clock turns step time, bandwidth and latency into "
        "wall-clock, so algorithms and topologies compare on time-to-loss.",
    )
    p.add_argument(
        "--workers", type=_positive_int, default=d("workers", 8), help="number of workers N"
    )
    p.add_argument("--rounds", type=_positive_int, default=d("rounds", 20), help="outer rounds")
    _add_algo_flags(p, d)
    _add_training_flags(p, d)
    g = p.add_argument_group("simulated network")
    g.add_argument("--codec", choices=CODECS, default=d("codec", "fp32"), help="wire encoding of θ̃")
    g.add_argument(
        "--adapt-h",
        action="store_true",
        default=bool(d("adapt_h", False)),
        help="choose H per worker and round from step time and this round's links",
    )
    g.add_argument(
        "--bandwidth",
        type=float,
        default=d("bandwidth", 1000.0),
        metavar="MBPS",
        help="each worker's access link, megabits per second",
    )
    g.add_argument(
        "--latency",
        type=float,
        default=d("latency", 10.0),
        metavar="MS",
        help="one-way latency, ms",
    )
    g.add_argument(
        "--step-time",
        type=float,
        default=d("step_time", None),
        metavar="S",
        help="seconds per inner step on the simulated clock (default: measured here)",
    )
    g.add_argument(
        "--message-bytes",
        type=int,
        default=d("message_bytes", None),
        help="bytes per message on the simulated clock (default: the encoded model), "
        "to time a bigger model's exchange",
    )
    g.add_argument(
        "--straggler",
        action="append",
        default=[],
        metavar="I:FRACTION",
        help="worker I gets FRACTION of the bandwidth (repeatable), e.g. 0:0.1",
    )
    g.add_argument(
        "--eval-every",
        type=_positive_int,
        default=d("eval_every", 1),
        help="rounds between validations",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=d("json", None),
        metavar="FILE",
        help="write a JSON summary here",
    )
    p.set_defaults(run=_run_simulate)


def _fmt_steps(steps: Sequence[int]) -> str:
    lo, hi = min(steps), max(steps)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _run_simulate(ns: argparse.Namespace) -> int:
    import torch

    from gaslocd.sim.runner import RoundRecord, Simulation
    from gaslocd.sim.summary import simulation_summary, write_json

    torch.set_num_threads(ns.threads)
    algo = _algo_config(ns, ns.adapt_h)
    train = _train_config(ns)
    sim = SimConfig(
        workers=ns.workers,
        rounds=ns.rounds,
        codec=ns.codec,
        bandwidth_mbps=ns.bandwidth,
        latency_ms=ns.latency,
        step_time_s=ns.step_time,
        stragglers=tuple(Straggler.parse(s) for s in ns.straggler),
        eval_every=ns.eval_every,
        message_bytes=ns.message_bytes,
    )
    simulation = Simulation(algo, train, sim)
    resolved = simulation.algo
    adaptive = " adaptive" if resolved.adapt_h else ""
    print(
        f"simulate: {sim.workers} workers, {resolved.algo}/{resolved.topology}, "
        f"H={resolved.inner_steps}{adaptive}, η={resolved.outer.lr} μ={resolved.outer.momentum}, "
        f"model {train.model} ({simulation.workers[0].flat.numel:,} params), codec {sim.codec}, "
        f"corpus {simulation.corpus.source}",
        flush=True,
    )

    def progress(r: RoundRecord) -> None:
        val = f"{r.val_loss:.4f}" if r.val_loss is not None else "   -  "
        failed = f"  failed {r.exchange_failures}" if r.exchange_failures else ""
        print(
            f"round {r.round:4d}/{sim.rounds}  H {_fmt_steps(r.inner_steps):>7}  "
            f"train {r.train_loss:.4f}  val {val}  consensus {r.consensus:.2e}  "
            f"clock {r.wall_clock_s:9.1f}s  idle {100 * r.idle_fraction:5.1f}%{failed}",
            flush=True,
        )

    result = simulation.run(progress)
    print(
        f"done: val loss {result.initial_val_loss:.4f} -> {result.final_val_loss:.4f}, "
        f"simulated {result.wall_clock_s:.1f}s (real {result.real_elapsed_s:.1f}s), "
        f"idle {100 * result.idle_fraction:.1f}%, "
        f"sent {max(result.bytes_sent_per_worker) / 2**20:.1f} MiB per worker (max)",
        flush=True,
    )
    if ns.json is not None:
        args = {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items() if k != "run"
        }
        args["resolved"] = {
            "topology": resolved.topology,
            "inner_steps": resolved.inner_steps,
            "outer_lr": resolved.outer.lr,
            "outer_momentum": resolved.outer.momentum,
        }
        write_json(ns.json, simulation_summary(result, args))
        print(f"summary written to {ns.json}")
    return 0


# -- daemons: start / join / status / demo --------------------------------------------


def _add_daemon_flags(p: argparse.ArgumentParser, d: _Settings) -> None:
    g = p.add_argument_group("network")
    g.add_argument(
        "--run-id",
        default=d("run_id", "gaslocd"),
        help="name of the run; peers of other runs are ignored",
    )
    g.add_argument(
        "--host",
        default=d("host", "127.0.0.1"),
        help="address to listen on (gRPC and DHT); 0.0.0.0 for all interfaces",
    )
    g.add_argument(
        "--port", type=int, default=d("port", 7070), help="gRPC port for exchanges (0: a free one)"
    )
    g.add_argument(
        "--dht-port",
        type=int,
        default=d("dht_port", 0),
        help="DHT port (0: a free one; fix it on a bootstrap peer behind a firewall)",
    )
    g.add_argument(
        "--announce",
        default=d("announce", None),
        metavar="HOST[:PORT]",
        help="address other peers should dial when it differs from --host:--port (NAT, a "
        "port mapping); the DHT is announced on HOST at --dht-port, which must then be fixed",
    )
    g.add_argument(
        "--token",
        default=d("token", ""),
        help="the run's shared join secret (also GASLOCD_TOKEN); every peer must use the same one",
    )
    g.add_argument(
        "--codec",
        choices=CODECS,
        default=d("codec", "fp16"),
        help="wire encoding of θ̃ sent to partners",
    )
    g.add_argument(
        "--tls-cert", default=d("tls_cert", None), help="PEM certificate of this peer (enables TLS)"
    )
    g.add_argument("--tls-key", default=d("tls_key", None), help="PEM private key of --tls-cert")
    g.add_argument(
        "--tls-ca",
        default=d("tls_ca", None),
        help="PEM CA bundle that peers' certificates must chain to",
    )
    g.add_argument(
        "--min-peers",
        type=_positive_int,
        default=d("min_peers", 1),
        help="wait until this many peers (self included) are present before the first round",
    )
    g.add_argument(
        "--exchange-deadline",
        type=float,
        default=d("exchange_deadline", None),
        metavar="S",
        help="give up on a partner after S seconds (default: twice the expected round time)",
    )
    g.add_argument(
        "--heartbeat",
        type=float,
        default=d("heartbeat", 3.0),
        metavar="S",
        help="seconds between refreshes of this peer's DHT record",
    )
    g.add_argument(
        "--record-ttl",
        type=float,
        default=d("record_ttl", 15.0),
        metavar="S",
        help="a peer that stops refreshing its record drops out of rosters after S seconds",
    )
    g.add_argument(
        "--no-adapt-h",
        action="store_true",
        default=bool(d("no_adapt_h", False)),
        help="always take --inner-steps local steps (default: adapt H to speed and links)",
    )
    s = p.add_argument_group("state and output")
    s.add_argument(
        "--checkpoint-dir", default=d("checkpoint_dir", None), help="where checkpoints are written"
    )
    s.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=d("checkpoint_every", 10),
        help="rounds between checkpoints (one is also written on exit)",
    )
    s.add_argument(
        "--resume",
        action="store_true",
        default=bool(d("resume", False)),
        help="continue from the checkpoint in --checkpoint-dir",
    )
    s.add_argument(
        "--metrics-port",
        type=int,
        default=d("metrics_port", None),
        help="serve Prometheus metrics on this port (0: a free one)",
    )
    s.add_argument(
        "--address-file",
        default=d("address_file", None),
        help="write the bootstrap address(es) of this daemon to this file",
    )
    s.add_argument(
        "--max-rounds",
        type=int,
        default=d("max_rounds", 0),
        help="stop after this round (0: run until stopped)",
    )
    s.add_argument(
        "--eval-every",
        type=int,
        default=d("eval_every", 10),
        help="rounds between validation losses on the held-out split (0: never)",
    )
    s.add_argument(
        "--json",
        default=d("json", None),
        metavar="FILE",
        help="write a JSON summary of this daemon's run on exit",
    )


def _daemon_configs(
    ns: argparse.Namespace, bootstrap: tuple[str, ...]
) -> tuple[DaemonConfig, WireConfig]:
    daemon = DaemonConfig(
        run_id=ns.run_id,
        host=ns.host,
        port=ns.port,
        dht_port=ns.dht_port,
        announce=ns.announce,
        bootstrap=bootstrap,
        codec=ns.codec,
        checkpoint_dir=ns.checkpoint_dir,
        checkpoint_every=ns.checkpoint_every,
        resume=ns.resume,
        metrics_port=ns.metrics_port,
        address_file=ns.address_file,
        max_rounds=ns.max_rounds,
        min_peers=ns.min_peers,
        eval_every=ns.eval_every,
        exchange_deadline_s=ns.exchange_deadline,
        summary_json=ns.json,
        heartbeat_s=ns.heartbeat,
        record_ttl_s=ns.record_ttl,
    )
    wire = WireConfig(token=ns.token, tls_cert=ns.tls_cert, tls_key=ns.tls_key, tls_ca=ns.tls_ca)
    return daemon, wire


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run_daemon(ns: argparse.Namespace) -> int:
    import torch

    from gaslocd.daemon.node import EXIT_STARTUP, Daemon, StartupError

    torch.set_num_threads(ns.threads)
    if not ns.token and not _is_loopback(ns.host):
        raise ValueError(
            f"listening on {ns.host} without --token would let anyone who reaches this port "
            "send parameters into the run: set --token (or GASLOCD_TOKEN) on every peer"
        )
    bootstrap = tuple(ns.bootstrap or ()) if ns.command == "join" else ()
    daemon_cfg, wire = _daemon_configs(ns, bootstrap)
    daemon = Daemon(
        daemon_cfg,
        _algo_config(ns, not ns.no_adapt_h),
        _train_config(ns),
        wire,
        role=ns.command,
        progress=lambda line: print(line, flush=True),
    )
    try:
        return daemon.run()
    except StartupError as exc:
        print(f"gaslocd: cannot start: {exc}", file=sys.stderr, flush=True)
        return EXIT_STARTUP


def _add_start_join(sub: argparse._SubParsersAction, d: _Settings) -> None:
    start = sub.add_parser(
        "start",
        help="start the first daemon of a run and print its bootstrap address",
        description="Start a new run: this daemon trains and prints the address that other "
        "machines pass to 'gaslocd join --bootstrap'.",
    )
    join = sub.add_parser(
        "join",
        help="join a run through any live peer's bootstrap address",
        description="Join a run: fetch the current state from a live peer and train with it.",
    )
    join.add_argument(
        "--bootstrap",
        action="append",
        default=_address_list(d("bootstrap", None)),
        metavar="ADDR",
        help="bootstrap address printed by 'gaslocd start' (any live peer's; repeatable)",
    )
    for p in (start, join):
        _add_algo_flags(p, d)
        _add_training_flags(p, d)
        _add_daemon_flags(p, d)
        p.set_defaults(run=_run_daemon)


def _address_list(value: object) -> list[str] | None:
    """Bootstrap addresses from the environment or a config file: a list, or one string
    with addresses separated by commas or spaces (``action="append"`` would otherwise
    extend a string default character by character)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [a for a in value.replace(",", " ").split() if a]
    return [str(a) for a in value]  # type: ignore[attr-defined]


def _add_status(sub: argparse._SubParsersAction, d: _Settings) -> None:
    p = sub.add_parser(
        "status",
        help="ask a running daemon how it is doing",
        description="Query a daemon's Status over gRPC and print it.",
    )
    p.add_argument(
        "address",
        nargs="?",
        default=d("status_address", "127.0.0.1:7070"),
        help="the daemon's gRPC host:port (default 127.0.0.1:7070)",
    )
    p.add_argument("--run-id", default=d("run_id", "gaslocd"), help="the daemon's run id")
    p.add_argument(
        "--token", default=d("token", ""), help="the run's join token (also GASLOCD_TOKEN)"
    )
    p.add_argument(
        "--tls-cert", default=d("tls_cert", None), help="PEM certificate, when the daemon uses TLS"
    )
    p.add_argument("--tls-key", default=d("tls_key", None), help="PEM private key of --tls-cert")
    p.add_argument(
        "--tls-ca",
        default=d("tls_ca", None),
        help="PEM CA bundle the daemon's certificate chains to",
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=_run_status)


def _run_status(ns: argparse.Namespace) -> int:
    from gaslocd.daemon.status import query_status

    wire = WireConfig(token=ns.token, tls_cert=ns.tls_cert, tls_key=ns.tls_key, tls_ca=ns.tls_ca)
    return query_status(
        ns.address, run_id=ns.run_id, wire=wire, timeout_s=ns.timeout, as_json=ns.json
    )


def _add_demo(sub: argparse._SubParsersAction, d: _Settings) -> None:
    p = sub.add_parser(
        "demo",
        help="N real daemons on 127.0.0.1 train the tiny model together",
        description="Start N real daemons (processes with a real DHT and real gRPC) on 127.0.0.1 "
        "training on a corpus every machine has; relay their progress and summarize.",
    )
    p.add_argument(
        "--workers", type=_positive_int, default=d("workers", 3), help="number of daemons"
    )
    p.add_argument(
        "--rounds",
        type=_positive_int,
        default=d("rounds", 10),
        help="outer rounds each daemon runs",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=d("json", None),
        metavar="FILE",
        help="write a JSON summary here",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=d("workdir", None),
        help="keep the daemons' logs, checkpoints and summaries here (default: a temp dir)",
    )
    p.add_argument("--codec", choices=CODECS, default=d("codec", "fp16"), help="wire encoding of θ̃")
    p.add_argument(
        "--metrics", action="store_true", help="serve each daemon's metrics on a free port"
    )
    p.add_argument(
        "--daemon-log-level",
        default=d("daemon_log_level", "WARNING"),
        help="logging level of the daemons (their progress lines are always shown)",
    )
    _add_algo_flags(p, d)
    _add_training_flags(p, d)
    p.set_defaults(run=_run_demo)


def _run_demo(ns: argparse.Namespace) -> int:
    from gaslocd.daemon.demo import run_demo

    forwarded = [
        "--model",
        ns.model,
        "--seq-len",
        str(ns.seq_len),
        "--batch-size",
        str(ns.batch_size),
        "--inner-lr",
        str(ns.inner_lr),
        "--weight-decay",
        str(ns.weight_decay),
        "--warmup-steps",
        str(ns.warmup_steps),
        "--eval-batches",
        str(ns.eval_batches),
        "--seed",
        str(ns.seed),
        "--threads",
        str(ns.threads),
        "--algo",
        ns.algo,
        "--codec",
        ns.codec,
    ]
    for flag, value in (
        ("--data", ns.data),
        ("--topology", ns.topology),
        ("--inner-steps", ns.inner_steps),
        ("--outer-lr", ns.outer_lr),
        ("--outer-momentum", ns.outer_momentum),
    ):
        if value is not None:
            forwarded += [flag, str(value)]
    return run_demo(
        ns.workers,
        ns.rounds,
        forwarded,
        json_path=ns.json,
        workdir=ns.workdir,
        metrics=ns.metrics,
        log_level=ns.daemon_log_level,
    )


# -- entry point ----------------------------------------------------------------------

_COMMANDS: list[Callable[[argparse._SubParsersAction, _Settings], None]] = [
    _add_start_join,
    _add_status,
    _add_demo,
    _add_simulate,
]


def build_parser(config: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    settings = _Settings(config or {})
    parser = argparse.ArgumentParser(
        prog="gaslocd",
        description="Decentralized LLM pretraining with GASLoC: local steps, random gossip "
        "with one or two peers per round, an outer Nesterov optimizer.",
    )
    parser.add_argument("--version", action="version", version=f"gaslocd {__version__}")
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE.toml",
        help="read settings from a TOML file (keys are the long flag names)",
    )
    parser.add_argument("--log-level", default=settings("log_level", "INFO"), help="logging level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(sub, settings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(_load_config_file(args))
    except ValueError as exc:
        print(f"gaslocd: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ns = parser.parse_args(args)
    logging.basicConfig(
        level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(ns.run(ns))
    except (ValueError, FileNotFoundError) as exc:
        print(f"gaslocd: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gaslocd: interrupted", file=sys.stderr)
        return 130
