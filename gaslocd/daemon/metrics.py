"""Prometheus metrics of one daemon (docs/design.md §4): names, units, no per-peer labels.

Counters that the wire already keeps (bytes, refusals, failures by reason) are read from
:class:`~gaslocd.net.validation.WireStats` at scrape time by a collector, rather than
mirrored into prometheus counters, so the two can never disagree. Each daemon has its
own registry, so several can live in one test process.

Conventions (https://prometheus.io/docs/practices/naming/): base units in the name
(``_seconds``, ``_bytes``), ``_total`` on counters, ``_ratio`` on 0..1 gauges. A gauge
whose value is not known yet (a loss before the first round) reads NaN, not 0: a 0 loss
or 0 consensus distance would be a plausible and wrong number on a dashboard.

Label values are bounded: ``reason`` comes from a fixed vocabulary in the wire code, but
a peer's refusal carries its own reason string, so anything unexpected is folded into
``other`` and the number of distinct reasons is capped (a hostile peer must not be able
to blow up the scrape). The reasons an operator alerts on are exported from the start
at 0, so ``rate()`` and ``increase()`` have a series to work on before the first failure.
"""

from __future__ import annotations

import math
import platform
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from gaslocd import __version__
from gaslocd.daemon.prefetch import ROSTER_SOURCES
from gaslocd.net.auth import REFUSAL_REASONS
from gaslocd.net.dht_traffic import RPCS, SIDES
from gaslocd.net.discovery import DiscoveryStats
from gaslocd.net.validation import WireStats
from gaslocd.protocol.account import ACTIVITIES

# Exchanges take from milliseconds (a tiny model on loopback) to minutes (a big model
# over a thin link): buckets span that range on a roughly x2.5 scale.
EXCHANGE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 300, 600)

# Reasons present from the first scrape (value 0): the common ones, so that dashboards and
# alert rules have a series before anything went wrong. Others appear when they happen.
KNOWN_FAILURES = ("deadline", "unavailable", "peer-gone", "stream-broken", "allreduce")
KNOWN_REJECTS = ("wrong-sender", "wrong-run", "fingerprint", "non-finite", "state-range")
KNOWN_ROLLBACKS = ("non-finite-loss", "non-finite-outer")
MAX_REASONS = 64  # distinct label values per counter; the rest are counted as "other"
_REASON_RE = re.compile(r"[a-z0-9][a-z0-9_:-]{0,47}")


def _bounded(counts: Iterable[tuple[str, int]], known: Iterable[str] = ()) -> dict[str, int]:
    """Reason -> count with unexpected or excess reasons folded into ``other``."""
    out = dict.fromkeys(known, 0)
    for reason, n in sorted(counts):
        label = reason if _REASON_RE.fullmatch(reason) else "other"
        if label not in out and len(out) >= MAX_REASONS:
            label = "other"
        out[label] = out.get(label, 0) + n
    return out


def _refused_family(s: WireStats) -> Metric:
    """Calls the gRPC server's gate ended before reading them: bad or missing credentials
    (no token, wrong target, clock skew, unknown peer, bad signature, replay) or a caller
    over its limits; every label exists from the first scrape and the set is fixed."""
    refused = CounterMetricFamily(
        "gasloc_calls_refused",
        "Incoming calls refused before any message was read, by reason",
        labels=["reason"],
    )
    for reason, n in _bounded(s.refused.items(), REFUSAL_REASONS).items():
        refused.add_metric([reason], n)
    return refused


class _WireCollector(Collector):
    def __init__(self, stats: WireStats, totals: DaemonMetrics) -> None:
        self.stats = stats
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        s, t = self.stats, self.totals
        sent = CounterMetricFamily("gasloc_bytes_sent", "Encoded bytes sent to peers")
        sent.add_metric([], s.bytes_sent)
        received = CounterMetricFamily("gasloc_bytes_received", "Encoded bytes received from peers")
        received.add_metric([], s.bytes_received)
        ok = CounterMetricFamily(
            "gasloc_exchanges_succeeded",
            "Partner exchanges of a round that delivered the partner's parameters",
        )
        ok.add_metric([], s.exchanges_ok)
        failures = CounterMetricFamily(
            "gasloc_exchange_failures",
            "Partner exchanges of a round that gave no usable parameters, by reason",
            labels=["reason"],
        )
        counts = [*s.failures.items(), *t.extra_failures.items()]
        for reason, n in _bounded(counts, KNOWN_FAILURES).items():
            failures.add_metric([reason], n)
        rejected = CounterMetricFamily(
            "gasloc_rejected_messages",
            "Incoming messages refused by a check, by reason",
            labels=["reason"],
        )
        for reason, n in _bounded(s.rejected.items(), KNOWN_REJECTS).items():
            rejected.add_metric([reason], n)
        idle = CounterMetricFamily(
            "gasloc_idle_seconds",
            "Wall-clock seconds not spent training (rate() of it is the idle fraction)",
        )
        idle.add_metric([], t.idle_total())
        time_spent = CounterMetricFamily(
            "gasloc_time_seconds",
            "Wall-clock seconds by activity since the first round; they add up to the "
            "elapsed time (train and fill are training)",
            labels=["activity"],
        )
        account = t.time_account()
        for activity in ACTIVITIES:
            time_spent.add_metric([activity], account.get(activity, 0.0))
        tokens = CounterMetricFamily("gasloc_tokens", "Tokens trained on by this daemon")
        tokens.add_metric([], t.tokens)
        rounds = CounterMetricFamily(
            "gasloc_rounds", "Outer rounds this process completed (not reset by catch-up jumps)"
        )
        rounds.add_metric([], t.rounds)
        yield _refused_family(s)
        yield from (sent, received, ok, failures, rejected, idle, time_spent, tokens, rounds)
        yield _roster_family(t)
        yield _dht_read_family(t)
        yield from _dht_rpc_families(t)
        yield from _robust_families(t)


def _roster_family(t: DaemonMetrics) -> Metric:
    """Where each round's roster came from (gaslocd.daemon.prefetch): read during the
    last round's steps, a quick read of our own node's copy, or a full read the round
    waited for; and the prefetches thrown away, too old by then or failed."""
    reads = CounterMetricFamily(
        "gasloc_roster_reads",
        "DHT roster reads by source: prefetched (a round took it without waiting), quick "
        "(our node's copy merged with the last full read), at_round_start (the round "
        "waited for a full read), stale or failed (prefetches dropped)",
        labels=["source"],
    )
    for source, n in _bounded(t.roster_reads().items(), ROSTER_SOURCES).items():
        reads.add_metric([source], n)
    return reads


def _dht_read_family(t: DaemonMetrics) -> Metric:
    """Every roster read our DHT node made, by kind: a full one asks every replica (and
    each answers with the whole roster, a slow peer's link too), a quick one our node."""
    reads = CounterMetricFamily(
        "gasloc_dht_reads",
        "DHT roster reads by kind: full (asked every replica of the key) or quick (our "
        "node's copy, while the last full read vouched for it)",
        labels=["kind"],
    )
    stats = t.dht_stats()
    for kind, n in {"full": stats.full_reads, "quick": stats.quick_reads}.items():
        reads.add_metric([kind], n)
    return reads


def _dht_rpc_families(t: DaemonMetrics) -> Iterator[Metric]:
    """What our DHT node's RPCs carried (gaslocd.net.dht_traffic), as of the last
    heartbeat: on a slow link, how much of it the DHT takes, and for what."""
    calls = CounterMetricFamily(
        "gasloc_dht_rpcs",
        "RPCs of our DHT node by kind (ping, store, find) and side: served (another node "
        "asked us) or called (we asked another node); read at each heartbeat",
        labels=["rpc", "side"],
    )
    sizes = CounterMetricFamily(
        "gasloc_dht_rpc_bytes",
        "Bytes of those RPCs' messages (protobuf, without libp2p framing and encryption) "
        "by kind, side and direction (sent or received by our node)",
        labels=["rpc", "side", "direction"],
    )
    tally = t.dht_stats().rpc_traffic
    for rpc in RPCS:
        for side in SIDES:
            n, sent, received = [*tally.get(f"{rpc}/{side}", ()), 0, 0, 0][:3]
            calls.add_metric([rpc, side], n)
            sizes.add_metric([rpc, side, "sent"], sent)
            sizes.add_metric([rpc, side, "received"], received)
    yield from (calls, sizes)


def _robust_families(t: DaemonMetrics) -> Iterator[Metric]:
    """What robust mixing and the non-finite guard did (docs/design.md §1)."""
    clipped = CounterMetricFamily(
        "gasloc_clipped_exchanges",
        "Partner θ̃ that robust mixing pulled in to the trust radius before mixing",
    )
    clipped.add_metric([], t.clipped)
    rescaled = CounterMetricFamily(
        "gasloc_rescaled_exchanges",
        "Partner θ̃ within the trust radius whose norm gap alone robust mixing cut "
        "(common between honest peers)",
    )
    rescaled.add_metric([], t.rescaled)
    rollbacks = CounterMetricFamily(
        "gasloc_rollbacks",
        "Rounds whose local result was thrown away (θ back to the round's start), by reason",
        labels=["reason"],
    )
    for reason, n in _bounded(t.rollbacks.items(), KNOWN_ROLLBACKS).items():
        rollbacks.add_metric([reason], n)
    codecs = CounterMetricFamily(
        "gasloc_exchanges_by_codec",
        "Exchanges of our θ̃ by the codec chosen for that link (a slow link steps down)",
        labels=["codec"],
    )
    for codec, n in _bounded(t.codecs.items(), ("fp16", "int8", "q4")).items():
        codecs.add_metric([codec], n)
    long = CounterMetricFamily(
        "gasloc_long_exchanges",
        "Exchanges too slow for a round, mixed when they landed (or failed), by outcome",
        labels=["outcome"],
    )
    for outcome, n in _bounded(t.long.items(), ("landed", "failed")).items():
        long.add_metric([outcome], n)
    yield from (clipped, rescaled, rollbacks, codecs, long)


class DaemonMetrics:
    """The daemon's gauges and histogram, plus totals read by the scrape-time collector."""

    def __init__(
        self,
        stats: WireStats,
        *,
        peer_id: str = "",
        run_id: str = "",
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self._httpd: WSGIServer | None = None
        r = self.registry
        # What an operator asks next: CPU, memory, open files, GC pauses, Python version.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        # Idle time is counted once, in the run log; the scrape reads it from there.
        self.idle_total: Callable[[], float] = lambda: 0.0
        self.time_account: Callable[[], Mapping[str, float]] = dict
        self.roster_reads: Callable[[], Mapping[str, int]] = dict  # RosterPrefetch.counts
        self.dht_stats: Callable[[], DiscoveryStats] = DiscoveryStats  # Discovery.stats
        self.tokens = 0
        self.rounds = 0
        self.extra_failures: dict[str, int] = {}
        self.clipped = 0
        self.rescaled = 0
        self.rollbacks: dict[str, int] = {}
        self.codecs: dict[str, int] = {}  # our exchanges by the codec we sent
        self.long: dict[str, int] = {}  # long exchanges by outcome
        r.register(_WireCollector(stats, self))
        Info("gasloc_build", "gaslocd build and run identity", registry=r).info(
            {
                "version": __version__,
                "python": platform.python_version(),
                "torch": _torch_version(),
                "run_id": run_id,
                "peer_id": peer_id,  # one series per daemon, like `instance`; not per partner
                **dict(settings or {}),
            }
        )
        self._add_round_metrics(r)

    def _add_round_metrics(self, r: CollectorRegistry) -> None:
        """The per-round gauges; those unknown until measured start at NaN, not a fake 0."""
        self.round = Gauge("gasloc_round", "Current outer round number", registry=r)
        self.inner_steps = Gauge(
            "gasloc_inner_steps", "Local steps H of the last round", registry=r
        )
        self.train_loss = Gauge(
            "gasloc_train_loss", "Mean training loss of the last round", registry=r
        )
        self.val_loss = Gauge(
            "gasloc_val_loss", "Validation loss on the held-out split (last evaluation)", registry=r
        )
        self.consensus = Gauge(
            "gasloc_consensus_distance",
            "RMS of own minus partners' post-local parameters, relative to own norm "
            "(last round that exchanged)",
            registry=r,
        )
        self.peers = Gauge(
            "gasloc_peers", "Peers in this round's roster (self included)", registry=r
        )
        self.partners = Gauge(
            "gasloc_partners", "Partners this round (0: sat out this round)", registry=r
        )
        self.step_seconds = Gauge(
            "gasloc_inner_step_seconds", "Measured seconds per inner step", registry=r
        )
        self.bandwidth = Gauge(
            "gasloc_link_bandwidth_bytes_per_second",
            "Measured bandwidth of this peer's links (median over partners)",
            registry=r,
        )
        self.idle_ratio = Gauge(
            "gasloc_idle_ratio",
            "Share of elapsed time not spent training, since the first round",
            registry=r,
        )
        self.sitting_out = Gauge(
            "gasloc_sitting_out",
            "1 while this peer's link is too slow for a round and it sits out of pairings",
            registry=r,
        )
        self.exchange_seconds = Histogram(
            "gasloc_exchange_seconds",
            "Duration of a round's exchange phase",
            buckets=EXCHANGE_BUCKETS_S,
            registry=r,
        )
        for unknown in (
            self.train_loss,
            self.val_loss,
            self.consensus,
            self.step_seconds,
            self.bandwidth,
            self.idle_ratio,
        ):
            unknown.set(math.nan)

    def count_failure(self, reason: str) -> None:
        """Failures outside the gRPC wire (the DiLoCo all-reduce)."""
        self.extra_failures[reason] = self.extra_failures.get(reason, 0) + 1

    def count(self, counts: dict[str, int], key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve /metrics on ``port`` (0: a free one); returns the bound port."""
        self._httpd, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._httpd.server_port)

    def stop(self) -> None:
        """Stop serving /metrics (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()


def _torch_version() -> str:
    import torch  # already imported by the daemon; kept local so this module stays light

    return str(torch.__version__)


def metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name ``registry`` exposes (``x_total``, ``x_bucket``, ... included)."""
    return {s.name for family in registry.collect() for s in family.samples}
