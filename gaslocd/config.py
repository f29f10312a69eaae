"""Frozen, validated configuration shared by every layer.

Each dataclass checks itself on construction and raises ``ValueError`` with a message a
user can act on, so a wrong value is refused before anything starts or is trained.
Nothing here reads the environment or files: the CLI resolves flag > ``GASLOCD_*``
environment > default and builds these objects once.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

ALGOS = ("gasloc", "diloco", "dadam", "local-dadam")
TOPOLOGIES = ("1peer", "2peer", "ring", "exp", "complete")
GOSSIP_MODES = ("momentum", "direct")
CODECS = ("fp32", "fp16", "bf16", "int8", "q4")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _at_least(name: str, value: int, low: int, note: str = "") -> None:
    _check(value >= low, f"{name} must be >= {low}{note}, got {value}")


def _positive(name: str, value: float) -> None:
    _check(math.isfinite(value) and value > 0, f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class OuterConfig:
    """The outer optimizer: Nesterov momentum in ``torch.optim.SGD(nesterov=True)`` form.

    DiLoCo's published settings (η=0.7, μ=0.9) are the default for GASLoC too: the paper
    reports GASLoC stable over a broad range around them.
    """

    lr: float = 0.7
    momentum: float = 0.9
    gossip: str = "momentum"  # the mix enters m (version G), or "direct": θ, beside the step

    def __post_init__(self) -> None:
        _positive("outer learning rate", self.lr)
        _check(
            math.isfinite(self.momentum) and 0.0 <= self.momentum < 1.0,
            f"outer momentum must be in [0, 1), got {self.momentum!r}",
        )
        _one_of("gossip", self.gossip, GOSSIP_MODES)


@dataclass(frozen=True)
class AlgoConfig:
    """Which rule runs: an algorithm name, a topology and H (the local steps per round).

    ``diloco``, ``dadam`` and ``local-dadam`` are settings of the GASLoC rule, not other
    code: see :meth:`resolved`.
    """

    algo: str = "gasloc"
    topology: str = "1peer"
    inner_steps: int = 30
    outer: OuterConfig = field(default_factory=OuterConfig)
    adapt_h: bool = False
    h_min: int = 1
    h_max: int | None = None
    # Train the next round while this round's θ̃ is on the wire; the outer step lands
    # one round late (docs/design.md §1 "Overlap").
    overlap: bool = False
    adapt_codec: bool = False  # step a slow link's codec down (gaslocd.protocol.linkcodec)

    def __post_init__(self) -> None:
        _check(self.algo in ALGOS, f"algo must be one of {', '.join(ALGOS)}; got {self.algo!r}")
        _check(
            self.topology in TOPOLOGIES,
            f"topology must be one of {', '.join(TOPOLOGIES)}; got {self.topology!r}",
        )
        _check(self.inner_steps >= 1, f"inner steps (H) must be >= 1, got {self.inner_steps}")
        _check(self.h_min >= 1, f"h_min must be >= 1, got {self.h_min}")
        _check(
            self.h_max is None or self.h_max >= self.h_min,
            f"h_max ({self.h_max}) must be >= h_min ({self.h_min})",
        )
        _check(
            not (self.overlap and self.topology == "complete"),
            "--overlap overlaps gossip exchanges; a complete topology is DiLoCo's all-reduce "
            "barrier, which it does not change",
        )
        if self.algo == "diloco":
            _check(
                self.topology == "complete",
                f"diloco all-reduces over every worker: its topology is 'complete', "
                f"not {self.topology!r}",
            )

    @property
    def h_upper(self) -> int:
        """Largest H the policy may pick: ``h_max`` or 4 × H_base."""
        return self.h_max if self.h_max is not None else 4 * self.inner_steps

    def resolved(self) -> AlgoConfig:
        """The same run expressed as GASLoC settings.

        DAdam and Local-DAdam are plain gossip of θ̃: η=1, μ=0 (property P5).
        DiLoCo is the complete graph with the given outer settings (property P1).
        """
        if self.algo in ("dadam", "local-dadam"):
            return replace(self, outer=OuterConfig(lr=1.0, momentum=0.0))
        return self


LR_SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class TrainConfig:
    """The local (inner) training: model, data and AdamW settings."""

    model: str = "tiny"
    data: str | None = None  # None: the built-in corpus (Python's standard library sources)
    seq_len: int = 128
    batch_size: int = 16
    inner_lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 50
    grad_clip: float = 1.0
    eval_batches: int = 8
    seed: int = 0
    # After the warm-up: constant, or a cosine/linear decay to lr_floor·inner_lr at
    # total_steps (inner steps of this worker, resumed with its checkpoint).
    lr_schedule: str = "constant"
    total_steps: int | None = None
    lr_floor: float = 0.1
    # Where and how the inner steps run (gaslocd.train.device): auto picks CUDA when
    # there is one; bf16/fp16 autocast over float32 master weights.
    device: str = "cpu"
    precision: str = "fp32"
    micro_batch: int = 0  # sequences per forward/backward (gradient accumulation); 0: all
    compile: bool = False  # torch.compile the model

    def __post_init__(self) -> None:
        _check(bool(self.model), "model must name a config (tiny, small, 134m, 551m) or pkg.mod:fn")
        _one_of("lr schedule", self.lr_schedule, LR_SCHEDULES)
        _check(
            self.lr_schedule == "constant" or (self.total_steps or 0) > self.warmup_steps,
            f"a {self.lr_schedule} schedule needs --total-steps above the warm-up "
            f"({self.warmup_steps}), got {self.total_steps}: set it, or bound the run "
            "(--max-rounds / --rounds) so it can be derived",
        )
        _one_of("precision", self.precision, ("auto", "fp32", "bf16", "fp16"))
        _check(
            self.micro_batch >= 0
            and (self.micro_batch == 0 or self.batch_size % self.micro_batch == 0),
            f"micro batch ({self.micro_batch}) must divide the batch size ({self.batch_size})",
        )
        _check(
            math.isfinite(self.lr_floor) and 0 <= self.lr_floor <= 1,
            f"lr floor must be in [0, 1] (a fraction of --inner-lr), got {self.lr_floor!r}",
        )
        _check(self.data is None or bool(self.data), "data path must not be empty")
        _at_least("seq_len", self.seq_len, 2)
        _at_least("batch_size", self.batch_size, 1)
        _positive("inner learning rate", self.inner_lr)
        _check(
            math.isfinite(self.weight_decay) and self.weight_decay >= 0,
            f"weight decay must be >= 0, got {self.weight_decay!r}",
        )
        _at_least("warmup steps", self.warmup_steps, 0)
        _check(
            math.isfinite(self.grad_clip) and self.grad_clip >= 0,
            f"grad clip must be >= 0 (0 disables it), got {self.grad_clip!r}",
        )
        _at_least("eval batches", self.eval_batches, 1)


@dataclass(frozen=True)
class Straggler:
    """Worker ``worker`` runs at ``fraction`` of the nominal link bandwidth."""

    worker: int
    fraction: float

    def __post_init__(self) -> None:
        _check(self.worker >= 0, f"straggler worker index must be >= 0, got {self.worker}")
        _check(
            math.isfinite(self.fraction) and 0 < self.fraction <= 1,
            f"straggler bandwidth fraction must be in (0, 1], got {self.fraction!r}",
        )

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """Parse ``I:FRACTION`` as given on the command line (``0:0.1``)."""
        worker, sep, fraction = text.partition(":")
        try:
            if not sep:
                raise ValueError
            return cls(int(worker), float(fraction))
        except ValueError as exc:
            if "straggler" in str(exc):
                raise
            raise ValueError(
                f"straggler must look like WORKER:FRACTION (e.g. 0:0.1), got {text!r}"
            ) from None


@dataclass(frozen=True)
class SimConfig:
    """An in-process simulation: N workers, a simulated network, a simulated clock."""

    workers: int = 8
    rounds: int = 20
    codec: str = "fp32"
    bandwidth_mbps: float = 1000.0  # megabits per second, each worker's access link
    latency_ms: float = 10.0
    step_time_s: float | None = None  # None: measured from the real inner steps
    stragglers: tuple[Straggler, ...] = ()
    unreachable: int = 0  # workers 0..K-1 are behind NAT (as a daemon's --reachable no)
    eval_every: int = 1
    message_bytes: int | None = None  # None: the encoded size of the real model
    # Pairings are drawn from (run id, round), as in the daemon; None: "sim-<seed>", so
    # that seeds draw different pairings as separate runs would.
    run_id: str | None = None

    def __post_init__(self) -> None:
        _check(self.workers >= 1, f"workers must be >= 1, got {self.workers}")
        _check(self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}")
        _one_of("codec", self.codec, CODECS)
        _positive("bandwidth (Mbit/s)", self.bandwidth_mbps)
        _check(
            math.isfinite(self.latency_ms) and self.latency_ms >= 0,
            f"latency must be >= 0 ms, got {self.latency_ms!r}",
        )
        if self.step_time_s is not None:
            _positive("step time (s)", self.step_time_s)
        _check(self.eval_every >= 1, f"eval_every must be >= 1, got {self.eval_every}")
        mb, k = self.message_bytes, self.unreachable
        _check(mb is None or mb > 0, f"message bytes must be > 0, got {mb}")
        _check(0 <= k <= self.workers, f"unreachable must be in 0..workers, got {k}")
        seen: set[int] = set()
        for s in self.stragglers:
            _check(
                s.worker < self.workers,
                f"straggler worker {s.worker} does not exist with {self.workers} workers",
            )
            _check(s.worker not in seen, f"straggler worker {s.worker} is given twice")
            seen.add(s.worker)

    def bandwidth_bytes_per_s(self, worker: int) -> float:
        """Access-link bandwidth of ``worker`` in bytes per second."""
        fraction = next((s.fraction for s in self.stragglers if s.worker == worker), 1.0)
        return self.bandwidth_mbps * 1e6 / 8 * fraction


_MiB = 1 << 20


@dataclass(frozen=True)
class WireConfig:
    """The gRPC wire (``gaslocd.net``): limits, chunking, deadlines, auth and TLS.

    ``token`` is the run's shared join secret: it keys the calls' HMACs and never goes
    on the wire (gaslocd.net.auth); empty disables the check, only sensible on loopback.
    ``tls_cert``/``tls_key``: this peer's identity (server and client); ``tls_ca``: what
    it trusts (set, the server requires client certificates). Read in ``start()``.
    """

    token: str = ""
    chunk_bytes: int = 2 * _MiB  # what we send per message (1–4 MiB measured best)
    max_chunk_bytes: int = 4 * _MiB  # the largest data message we accept from a peer
    codecs: tuple[str, ...] = CODECS  # codecs we accept from peers
    norm_bound: float = 1.0  # refuse θ̃_j with ‖θ̃_j − θ̃_i‖ > norm_bound · ‖θ̃_i‖
    accept_wait_s: float = 60.0  # how long an incoming call may wait for our round to open
    # A caller sends its header as soon as the call starts; one that sends nothing would
    # otherwise hold one of the server's concurrent-call slots for accept_wait_s.
    header_wait_s: float = 10.0
    round_lead: int = 2  # a caller this many rounds ahead still waits (overlap skews a round)
    pipeline_chunks: int = 3  # chunks encoded / decoded ahead of the socket, per stream
    keepalive_time_s: float = 20.0
    keepalive_timeout_s: float = 60.0  # a slow uplink's queue delays a ping's reply by seconds
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_server_name: str | None = None  # name to verify in peers' certificates, if not the host

    def __post_init__(self) -> None:
        _check(
            64 * 1024 <= self.chunk_bytes <= self.max_chunk_bytes <= 64 * _MiB,
            f"need 64 KiB <= chunk_bytes ({self.chunk_bytes}) <= max_chunk_bytes "
            f"({self.max_chunk_bytes}) <= 64 MiB",
        )
        _check(bool(self.codecs), "at least one codec must be accepted")
        for name in self.codecs:
            _check(name in CODECS, f"codec must be one of {', '.join(CODECS)}; got {name!r}")
        _positive("norm bound", self.norm_bound)
        _positive("accept wait (s)", self.accept_wait_s)
        _positive("header wait (s)", self.header_wait_s)
        _check(self.round_lead >= 0, f"round lead must be >= 0, got {self.round_lead}")
        _at_least("pipeline chunks", self.pipeline_chunks, 1)
        _positive("keepalive time (s)", self.keepalive_time_s)
        _positive("keepalive timeout (s)", self.keepalive_timeout_s)
        _check(
            (self.tls_cert is None) == (self.tls_key is None),
            "TLS needs both --tls-cert and --tls-key (or neither)",
        )
        _check(
            self.tls_ca is None or self.tls_cert is not None,
            "--tls-ca needs --tls-cert and --tls-key too (peers verify each other)",
        )

    @property
    def tls(self) -> bool:
        """Whether this peer serves and dials over TLS."""
        return self.tls_cert is not None

    @property
    def max_message_bytes(self) -> int:
        """gRPC message limit: the largest chunk plus room for framing, never more."""
        return self.max_chunk_bytes + 64 * 1024


@dataclass(frozen=True)
class DaemonConfig:
    """One daemon's life in a run: identity, addresses, pacing, persistence.

    ``host``: where gRPC and the DHT listen; ``announce``: the host others dial when that
    differs (a port mapping). Rounds run until stopped, or ``max_rounds``.
    """

    run_id: str = "gaslocd"
    host: str = "127.0.0.1"
    port: int = 7070  # gRPC; 0 picks a free port
    dht_port: int = 0
    announce: str | None = None  # HOST or HOST:PORT (a port mapping changes the port too)
    bootstrap: tuple[str, ...] = ()
    reachable: str = "auto"  # "no": behind NAT, dials out only; auto: probed (daemon/reach.py)
    codec: str = "fp16"
    checkpoint_dir: str | None = None
    # This peer's RSA key file (peer id, roster subkey); None: <checkpoint_dir>/identity.key
    # if there is a checkpoint dir, else a fresh key per start (see identity_file).
    identity: str | None = None
    checkpoint_every: int = 10
    resume: bool = False  # True: insist; a checkpoint in checkpoint_dir is resumed anyway
    fresh: bool = False  # start over: an existing checkpoint is moved aside, not resumed
    keep_checkpoints: int = 2  # the newest and the one before (checkpoint.pt.1)
    metrics_port: int | None = None
    # /metrics tells anyone who can read it the run id, peer id and traffic: loopback
    # unless the operator says otherwise (a Prometheus in another container needs 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    address_file: str | None = None
    max_rounds: int = 0
    min_peers: int = 1
    min_peers_timeout_s: float = 300.0
    eval_every: int = 10
    exchange_deadline_s: float | None = None  # None: derived from the expected round time
    heartbeat_s: float = 3.0
    record_ttl_s: float = 15.0
    join_lead_rounds: int = 2
    summary_json: str | None = None
    stop_timeout_s: float = 60.0  # SIGTERM to exit: the supervisor's grace (signals.py)

    @property
    def announce_host(self) -> str | None:
        """The host part of ``announce`` (what the DHT advertises)."""
        return None if self.announce is None else self.announce.rpartition(":")[0] or self.announce

    @property
    def identity_file(self) -> str | None:
        """Where this peer's key lives, so its peer id survives restarts (None: fresh key)."""
        if self.identity is not None:
            return self.identity
        if self.checkpoint_dir is not None:
            return os.path.join(self.checkpoint_dir, "identity.key")
        return None

    def grpc_address(self, bound_port: int) -> str:
        """The gRPC "host:port" other peers dial: the announced one if given."""
        if self.announce is None:
            return f"{self.host}:{bound_port}"
        _host, sep, port = self.announce.rpartition(":")
        return self.announce if sep and port.isdigit() else f"{self.announce}:{bound_port}"

    def __post_init__(self) -> None:
        rid = self.run_id
        _check(
            0 < len(rid) <= 64 and rid.isprintable() and " " not in rid,
            f"run id must be 1..64 printable characters without spaces, got {rid!r}",
        )
        ports = {"port": self.port, "DHT port": self.dht_port, "metrics port": self.metrics_port}
        for name, port in ports.items():
            _check(port is None or 0 <= port < 65536, f"{name} must be in 0..65535, got {port}")
        _one_of("codec", self.codec, CODECS)
        _one_of("reachable", self.reachable, ("yes", "no", "auto"))
        _at_least("checkpoint every", self.checkpoint_every, 1)
        _check(
            not self.resume or self.checkpoint_dir is not None,
            "--resume needs --checkpoint-dir (where the checkpoint is)",
        )
        _check(not (self.resume and self.fresh), "--resume and --fresh contradict each other")
        _at_least("keep checkpoints", self.keep_checkpoints, 1)
        _at_least("max rounds", self.max_rounds, 0, " (0: no limit)")
        _at_least("min peers", self.min_peers, 1)
        _at_least("eval every", self.eval_every, 0, " (0: never)")
        _positive("min peers timeout (s)", self.min_peers_timeout_s)
        if self.exchange_deadline_s is not None:
            _positive("exchange deadline (s)", self.exchange_deadline_s)
        _positive("heartbeat (s)", self.heartbeat_s)
        _check(
            self.record_ttl_s >= 2 * self.heartbeat_s,
            f"record ttl ({self.record_ttl_s} s) must be at least two heartbeats "
            f"({self.heartbeat_s} s) or records expire between refreshes",
        )
        _check(self.join_lead_rounds >= 1, "join lead must be >= 1 round")
        _positive("stop timeout (s)", self.stop_timeout_s)
