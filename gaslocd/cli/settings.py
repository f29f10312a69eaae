"""The one table of the command's settings.

Each :class:`Setting` is declared once, and everything else is derived from it: the flag
(``seq_len`` → ``--seq-len``), the environment variable (``GASLOCD_SEQ_LEN``), the key
of a ``--config`` TOML file (``seq_len`` or ``seq-len``), the ``--help`` line with its
default and variable, the fields it fills in the frozen objects of :mod:`gaslocd.config`,
and the arguments ``gaslocd demo`` hands its daemons. A new setting therefore needs one
entry here and, if it is a new kind of thing, one use in a command.

A name means one thing for every command that has it; where two commands need different
meanings under the same flag (``status --json`` prints JSON, a daemon's ``--json FILE``
writes a summary) they are two settings with different names and a ``flag`` override,
so a config file shared by ``start``, ``join`` and ``status`` stays unambiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gaslocd.cli import values as v
from gaslocd.config import ALGOS, CODECS, GOSSIP_MODES, TOPOLOGIES

START, JOIN, STATUS, DEMO, SIMULATE = "start", "join", "status", "demo", "simulate"
EXPORT, TOKENIZE = "export", "tokenize"
COMMANDS = (START, JOIN, STATUS, DEMO, SIMULATE, EXPORT, TOKENIZE)
ALL = frozenset(COMMANDS)
DAEMONS = frozenset({START, JOIN})
TRAINERS = DAEMONS | {DEMO, SIMULATE}

Kind = Literal["value", "switch", "list"]


@dataclass(frozen=True, eq=False)
class Setting:
    """One setting: how it is parsed, its default, its help, and who has it.

    ``kind`` is ``switch`` for a ``store_true`` flag (read as a boolean from the
    environment and files), ``list`` for a repeatable flag (a TOML array, or one string
    of items separated by commas or spaces). ``fields`` are ``"target.field"`` names of
    the config objects this value fills (see :mod:`gaslocd.cli.configs`).
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    commands: frozenset[str]
    group: str
    kind: Kind = "value"
    choices: tuple[str, ...] | None = None
    fields: tuple[str, ...] = ()
    metavar: str | None = None
    # Shown in --help instead of the default when the default depends on other settings.
    shown_default: str | None = None
    per_command: Mapping[str, Any] = field(default_factory=dict)
    flag: str | None = None  # when it differs from --<name with dashes>
    positional: bool = False
    in_file: bool = True  # False: not a TOML key (the config file cannot name itself)

    @property
    def env(self) -> str:
        """The environment variable that sets it."""
        return f"GASLOCD_{self.name.upper()}"

    @property
    def option(self) -> str:
        """The command-line flag (or, for a positional, its displayed name)."""
        if self.positional:
            return self.metavar or self.name.upper()
        return self.flag or "--" + self.name.replace("_", "-")

    def default_for(self, command: str) -> Any:
        """The built-in default, which a few settings choose per command."""
        return self.per_command.get(command, self.default)


_GENERAL = "general"
_ALGO = "algorithm (the outer loop)"
_TRAIN = "training (the inner loop)"
_RUN = "run"
_NET = "network"
_STATE = "state and output"
_SIM = "simulated network"
_DEMO = "demo"
_STATUS = "status"
_EXPORT = "export"
_TOKENIZE = "tokenize"

_S = Setting
SETTINGS: tuple[Setting, ...] = (
    # -- everyone ------------------------------------------------------------------
    _S("config", v.path, None, "read settings from this TOML file (keys: setting names, "
       "seq_len or seq-len)", ALL, _GENERAL, metavar="FILE.toml", in_file=False),
    _S("log_level", v.log_level, "INFO", "logging level (DEBUG, INFO, WARNING, ERROR)",
       ALL, _GENERAL, metavar="LEVEL"),
    # -- algorithm -------------------------------------------------------------------
    _S("algo", v.text_value, "gasloc", "gasloc; diloco (= complete graph); dadam / "
       "local-dadam (η=1, μ=0 gossip)", TRAINERS, _ALGO, choices=ALGOS, fields=("algo.algo",)),
    _S("topology", v.text_value, None, "1peer: random pairs; 2peer: random ring; "
       "ring/exp/complete: baselines", TRAINERS, _ALGO, choices=TOPOLOGIES,
       fields=("algo.topology",), shown_default="1peer, complete for diloco"),
    _S("inner_steps", v.positive_int, None, "H, local steps per round (H_base when adapting)",
       TRAINERS, _ALGO, fields=("algo.inner_steps",), shown_default="30, 1 for dadam"),
    _S("outer_lr", v.number, None, "outer learning rate η", TRAINERS, _ALGO,
       fields=("outer.lr",), shown_default="0.7, 1 for dadam"),
    _S("outer_momentum", v.number, None, "outer Nesterov momentum μ", TRAINERS, _ALGO,
       fields=("outer.momentum",), shown_default="0.9, 0 for dadam"),
    _S("gossip", v.text_value, "momentum", "momentum: the mix of θ̃ enters the outer step "
       "(the paper's rule); direct: the outer step takes our own pseudo-gradient and the "
       "mix moves θ beside it", TRAINERS, _ALGO, choices=GOSSIP_MODES,
       fields=("outer.gossip",)),
    _S("no_adapt_h", v.parse_bool, False, "always take --inner-steps local steps (otherwise "
       "H adapts to speed and links)", DAEMONS | {DEMO}, _ALGO, kind="switch"),
    _S("adapt_h", v.parse_bool, False, "choose H per worker and round from step time and "
       "this round's links", frozenset({SIMULATE}), _ALGO, kind="switch"),
    _S("no_adapt_codec", v.parse_bool, False, "always send the --codec encoding (otherwise a "
       "slow link steps down to int8 or q4)", DAEMONS | {DEMO}, _ALGO, kind="switch"),
    _S("adapt_codec", v.parse_bool, False, "step a slow link's codec down (int8, q4) so the "
       "exchange fits a round", frozenset({SIMULATE}), _ALGO, kind="switch"),
    _S("overlap", v.parse_bool, False, "train the next round while this round's parameters "
       "are on the wire (the outer step lands a round late)", TRAINERS, _ALGO, kind="switch",
       fields=("algo.overlap",)),
    # -- training --------------------------------------------------------------------
    _S("model", v.text_value, "tiny", "model config (tiny, small, 134m, 551m) or a factory "
       "'pkg.module:function' returning an nn.Module whose forward(tokens, targets) gives "
       "(logits, loss)", TRAINERS, _TRAIN, fields=("train.model",)),
    _S("data", v.text_value, None, "text file, folder of text files, or uint16 .bin shards",
       TRAINERS, _TRAIN, fields=("train.data",),
       shown_default="the Python standard library's own sources, no download"),
    _S("seq_len", v.positive_int, 128, "tokens per sequence", TRAINERS, _TRAIN,
       fields=("train.seq_len",)),
    _S("batch_size", v.positive_int, 16, "sequences per inner step", TRAINERS, _TRAIN,
       fields=("train.batch_size",)),
    _S("inner_lr", v.number, 1e-3, "AdamW learning rate (β)", TRAINERS, _TRAIN,
       fields=("train.inner_lr",)),
    _S("weight_decay", v.number, 0.1, "AdamW weight decay", TRAINERS, _TRAIN,
       fields=("train.weight_decay",)),
    _S("warmup_steps", v.integer, 50, "linear LR warm-up, in inner steps", TRAINERS, _TRAIN,
       fields=("train.warmup_steps",)),
    _S("lr_schedule", v.text_value, "auto", "inner LR after the warm-up: constant, or a "
       "cosine/linear decay to --lr-floor at --total-steps (auto: cosine when the run is "
       "bounded or --total-steps is set, else constant)", TRAINERS, _TRAIN,
       choices=("auto", "constant", "cosine", "linear")),
    _S("total_steps", v.positive_int, None, "inner steps the LR decays over", TRAINERS,
       _TRAIN, shown_default="rounds × --inner-steps of a bounded run"),
    _S("lr_floor", v.number, 0.1, "the decayed LR, as a fraction of --inner-lr", TRAINERS,
       _TRAIN, fields=("train.lr_floor",)),
    _S("eval_batches", v.positive_int, 8, "held-out batches per validation loss", TRAINERS,
       _TRAIN, fields=("train.eval_batches",)),
    _S("seed", v.integer, 0, "seed of init, data streams and pairings", TRAINERS, _TRAIN,
       fields=("train.seed",)),
    _S("device", v.text_value, "auto", "where the inner steps run: auto (the first visible "
       "CUDA device, else the CPU), cpu, cuda or cuda:N", TRAINERS, _TRAIN,
       fields=("train.device",)),
    _S("precision", v.text_value, "auto", "autocast of the inner steps over float32 master "
       "weights (auto: bf16 on a GPU that has it, else fp32; fp16 adds loss scaling)",
       TRAINERS, _TRAIN, choices=("auto", "fp32", "bf16", "fp16"), fields=("train.precision",)),
    _S("micro_batch", v.integer, 0, "sequences per forward/backward, accumulated into "
       "--batch-size (0: all at once); fits a large model on a small card", TRAINERS,
       _TRAIN, fields=("train.micro_batch",)),
    _S("compile", v.parse_bool, False, "torch.compile the model (slower start, faster "
       "steps on a GPU)", TRAINERS, _TRAIN, kind="switch", fields=("train.compile",)),
    _S("threads", v.positive_int, 1, "torch intra-op threads (tiny models step fastest on "
       "one; raise for big ones)", TRAINERS, _TRAIN),
    # -- the size of a demo or a simulation --------------------------------------------
    _S("workers", v.positive_int, 8, "number of workers (demo: daemons)",
       frozenset({DEMO, SIMULATE}), _RUN, fields=("sim.workers",), per_command={DEMO: 3}),
    _S("rounds", v.positive_int, 20, "outer rounds (demo: each daemon runs)",
       frozenset({DEMO, SIMULATE}), _RUN, fields=("sim.rounds",), per_command={DEMO: 10}),
    # -- network ---------------------------------------------------------------------
    _S("run_id", v.text_value, "gaslocd", "name of the run: peers of other runs are ignored, "
       "and pairings are drawn from (run id, round); simulate: sim-<seed> when unset",
       DAEMONS | {STATUS, SIMULATE}, _NET, fields=("daemon.run_id", "sim.run_id"),
       per_command={SIMULATE: None}),
    _S("host", v.text_value, "127.0.0.1", "address to listen on (gRPC and DHT); 0.0.0.0 for "
       "all interfaces", DAEMONS, _NET, fields=("daemon.host",)),
    _S("port", v.integer, 7070, "gRPC port for exchanges (0: a free one)", DAEMONS, _NET,
       fields=("daemon.port",)),
    _S("dht_port", v.integer, 0, "DHT port (0: a free one; fix it on a bootstrap peer behind "
       "a firewall)", DAEMONS, _NET, fields=("daemon.dht_port",)),
    _S("announce", v.text_value, None, "address other peers should dial when it differs from "
       "--host:--port (NAT, a port mapping); the DHT is announced on HOST at --dht-port, "
       "which must then be fixed", DAEMONS, _NET, fields=("daemon.announce",),
       metavar="HOST[:PORT]"),
    _S("reachable", v.text_value, "auto", "whether other peers can dial this one; no: behind "
       "a NAT or firewall that takes no inbound calls (it dials out to its partners, is "
       "never paired with another such peer, and its DHT node is a client); auto: a "
       "joining peer asks live peers to dial it back", DAEMONS, _NET,
       choices=("yes", "no", "auto"), fields=("daemon.reachable",)),
    _S("bootstrap", v.text_value, (), "bootstrap address printed by 'gaslocd start' (any "
       "live peer's; repeatable)", frozenset({JOIN}), _NET, kind="list",
       fields=("daemon.bootstrap",), metavar="ADDR"),
    _S("token", v.text_value, "", "the run's shared join secret; every peer must use the same "
       "one (prefer the variable: flags show in ps)", DAEMONS | {STATUS}, _NET,
       fields=("wire.token",)),
    _S("tls_cert", v.text_value, None, "PEM certificate of this peer (enables TLS)",
       DAEMONS | {STATUS}, _NET, fields=("wire.tls_cert",)),
    _S("tls_key", v.text_value, None, "PEM private key of --tls-cert", DAEMONS | {STATUS},
       _NET, fields=("wire.tls_key",)),
    _S("tls_ca", v.text_value, None, "PEM CA bundle that peers' certificates must chain to",
       DAEMONS | {STATUS}, _NET, fields=("wire.tls_ca",)),
    _S("codec", v.text_value, "fp16", "wire encoding of θ̃ sent to partners",
       TRAINERS, _NET, choices=CODECS, fields=("daemon.codec", "sim.codec"),
       per_command={SIMULATE: "fp32"}),
    _S("min_peers", v.positive_int, 1, "wait until this many peers (self included) are "
       "present before the first round", DAEMONS, _NET, fields=("daemon.min_peers",)),
    _S("exchange_deadline", v.number, None, "give up on a partner after S seconds", DAEMONS,
       _NET, fields=("daemon.exchange_deadline_s",), metavar="S",
       shown_default="twice the expected round time"),
    _S("heartbeat", v.number, 3.0, "seconds between refreshes of this peer's DHT record",
       DAEMONS, _NET, fields=("daemon.heartbeat_s",), metavar="S"),
    _S("record_ttl", v.number, 15.0, "a peer that stops refreshing its record drops out of "
       "rosters after S seconds", DAEMONS, _NET, fields=("daemon.record_ttl_s",), metavar="S"),
    # -- state and output ------------------------------------------------------------
    _S("checkpoint_dir", v.text_value, None, "where checkpoints are written", DAEMONS,
       _STATE, fields=("daemon.checkpoint_dir",)),
    _S("identity", v.text_value, None, "this peer's key file (created 0600 if absent): the "
       "peer id survives restarts; default <checkpoint-dir>/identity.key, else a new key",
       DAEMONS, _STATE, fields=("daemon.identity",), metavar="FILE"),
    _S("checkpoint_every", v.positive_int, 10, "rounds between checkpoints (one is also "
       "written on exit)", DAEMONS, _STATE, fields=("daemon.checkpoint_every",)),
    _S("resume", v.parse_bool, False, "insist on continuing from the checkpoint in "
       "--checkpoint-dir (one found there is resumed anyway)", DAEMONS, _STATE,
       kind="switch", fields=("daemon.resume",)),
    _S("fresh", v.parse_bool, False, "start over although --checkpoint-dir holds a "
       "checkpoint (it is moved aside to previous-<time>/, never deleted)", DAEMONS, _STATE,
       kind="switch", fields=("daemon.fresh",)),
    _S("keep_checkpoints", v.positive_int, 2, "checkpoints kept (the older ones as "
       "checkpoint.pt.1, …); a damaged newest one falls back to the previous", DAEMONS,
       _STATE, fields=("daemon.keep_checkpoints",)),
    _S("metrics_port", v.integer, None, "serve Prometheus metrics on this port (0: a free "
       "one)", DAEMONS, _STATE, fields=("daemon.metrics_port",)),
    _S("metrics_host", v.text_value, "127.0.0.1", "address the metrics listen on (0.0.0.0: "
       "all interfaces, for a scraper elsewhere)", DAEMONS, _STATE,
       fields=("daemon.metrics_host",)),
    _S("stop_timeout", v.number, 60.0, "seconds from SIGTERM to exit that the supervisor "
       "allows (docker's stop_grace_period): the round's exchange is cut short to leave "
       "room for the final checkpoint", DAEMONS, _STATE, fields=("daemon.stop_timeout_s",),
       metavar="S"),
    _S("address_file", v.text_value, None, "write the bootstrap address(es) of this daemon to "
       "this file", DAEMONS, _STATE, fields=("daemon.address_file",)),
    _S("max_rounds", v.integer, 0, "stop after this round (0: run until stopped)", DAEMONS,
       _STATE, fields=("daemon.max_rounds",)),
    _S("eval_every", v.integer, 10, "rounds between validation losses on the held-out split "
       "(daemons: 0 for never)", DAEMONS | {SIMULATE}, _STATE,
       fields=("daemon.eval_every", "sim.eval_every"), per_command={SIMULATE: 1}),
    _S("json", v.text_value, None, "write a JSON summary of the run here (a daemon: its own, "
       "on exit)", TRAINERS, _STATE, fields=("daemon.summary_json",), metavar="FILE"),
    # -- simulated network -----------------------------------------------------------
    _S("bandwidth", v.number, 1000.0, "each worker's access link, megabits per second",
       frozenset({SIMULATE}), _SIM, fields=("sim.bandwidth_mbps",), metavar="MBPS"),
    _S("latency", v.number, 10.0, "one-way latency, ms", frozenset({SIMULATE}), _SIM,
       fields=("sim.latency_ms",), metavar="MS"),
    _S("step_time", v.number, None, "seconds per inner step on the simulated clock",
       frozenset({SIMULATE}), _SIM, fields=("sim.step_time_s",), metavar="S",
       shown_default="measured here"),
    _S("message_bytes", v.integer, None, "bytes per message on the simulated clock, to time "
       "a bigger model's exchange", frozenset({SIMULATE}), _SIM,
       fields=("sim.message_bytes",), shown_default="the encoded model"),
    _S("unreachable", v.integer, 0, "workers 0..K-1 are behind NAT: they dial out only and "
       "are never paired with each other (a daemon's --reachable no)", frozenset({SIMULATE}),
       _SIM, fields=("sim.unreachable",), metavar="K"),
    _S("straggler", v.straggler, (), "worker I gets FRACTION of the bandwidth (repeatable), "
       "e.g. 0:0.1", frozenset({SIMULATE}), _SIM, kind="list", fields=("sim.stragglers",),
       metavar="I:FRACTION"),
    # -- demo ------------------------------------------------------------------------
    _S("workdir", v.path, None, "keep the daemons' logs, checkpoints and summaries here",
       frozenset({DEMO}), _DEMO, shown_default="a temporary directory"),
    _S("metrics", v.parse_bool, False, "serve each daemon's metrics on a free port",
       frozenset({DEMO}), _DEMO, kind="switch"),
    _S("daemon_log_level", v.log_level, "WARNING", "logging level of the daemons (their "
       "progress lines are always shown)", frozenset({DEMO}), _DEMO, metavar="LEVEL"),
    # -- status ----------------------------------------------------------------------
    _S("status_address", v.text_value, "127.0.0.1:7070", "the daemon's gRPC host:port",
       frozenset({STATUS}), _STATUS, positional=True, metavar="ADDRESS"),
    _S("status_timeout", v.number, 5.0, "seconds to wait for an answer", frozenset({STATUS}),
       _STATUS, flag="--timeout", metavar="S"),
    _S("status_json", v.parse_bool, False, "print JSON instead of text", frozenset({STATUS}),
       _STATUS, kind="switch", flag="--json"),
    # -- export ----------------------------------------------------------------------
    _S("export_checkpoint", v.path, None, "a checkpoint file, or the --checkpoint-dir "
       "holding checkpoint.pt", frozenset({EXPORT}), _EXPORT, positional=True,
       metavar="CHECKPOINT"),
    _S("export_out", v.path, None, "folder to write the model into", frozenset({EXPORT}),
       _EXPORT, flag="--out", metavar="DIR", shown_default="required"),
    _S("export_format", v.text_value, "safetensors", "safetensors (any model, our names) "
       "or hf (a built-in model as a transformers Llama)", frozenset({EXPORT}), _EXPORT,
       flag="--format", choices=("safetensors", "hf")),
    # -- tokenize --------------------------------------------------------------------
    _S("tokenize_source", v.path, None, "a .txt/.md/.jsonl/.parquet/.arrow file, a folder "
       "of them, or hf:NAME, a Hugging Face dataset (a hub name, or a dataset folder), "
       "streamed", frozenset({TOKENIZE}), _TOKENIZE, positional=True, metavar="DOCUMENTS"),
    _S("split", v.text_value, "train", "the split of an hf: dataset", frozenset({TOKENIZE}),
       _TOKENIZE),
    _S("subset", v.text_value, None, "the configuration of an hf: dataset (e.g. "
       "wikitext-103-raw-v1)", frozenset({TOKENIZE}), _TOKENIZE),
    _S("tokenizer", v.path, None, "a Hugging Face tokenizers file (tokenizer.json)",
       frozenset({TOKENIZE}), _TOKENIZE, metavar="FILE", shown_default="required"),
    _S("tokenize_out", v.path, None, "folder for train.bin, val.bin and meta.json (then "
       "pass it as --data)", frozenset({TOKENIZE}), _TOKENIZE, flag="--out", metavar="DIR",
       shown_default="required"),
    _S("text_field", v.text_value, "text", "the field holding a document's text in .jsonl, "
       ".parquet and .arrow rows", frozenset({TOKENIZE}), _TOKENIZE),
)  # fmt: skip

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def settings_of(command: str) -> tuple[Setting, ...]:
    """The settings ``command`` has, in table order (which is also the --help order)."""
    return tuple(s for s in SETTINGS if command in s.commands)
