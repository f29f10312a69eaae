"""Prometheus metrics of one daemon (DESIGN §4): names, units, no per-peer labels.

Counters that the wire already keeps (bytes, refusals, failures by reason) are read from
:class:`~gaslocd.net.validation.WireStats` at scrape time by a collector, rather than
mirrored into prometheus counters, so the two can never disagree. Each daemon has its
own registry, so several can live in one test process.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
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
from gaslocd.net.validation import WireStats

# Exchanges take from milliseconds (a tiny model on loopback) to minutes (a big model
# over a thin link): buckets span that range on a roughly x2.5 scale.
EXCHANGE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 300, 600)


class _WireCollector(Collector):
    def __init__(self, stats: WireStats, totals: DaemonMetrics) -> None:
        self.stats = stats
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        sent = CounterMetricFamily("gasloc_bytes_sent", "Encoded bytes sent to peers", unit="")
        sent.add_metric([], s.bytes_sent)
        received = CounterMetricFamily("gasloc_bytes_received", "Encoded bytes received from peers")
        received.add_metric([], s.bytes_received)
        failures = CounterMetricFamily(
            "gasloc_exchange_failures",
            "Partner exchanges of a round that gave no usable parameters, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(s.failures.items()):
            failures.add_metric([reason], n)
        for reason, n in sorted(self.totals.extra_failures.items()):
            failures.add_metric([reason], n)
        rejected = CounterMetricFamily(
            "gasloc_rejected_messages",
            "Incoming messages refused by a check, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(s.rejected.items()):
            rejected.add_metric([reason], n)
        idle = CounterMetricFamily("gasloc_idle_seconds", "Seconds spent waiting for partners")
        idle.add_metric([], self.totals.idle_seconds)
        tokens = CounterMetricFamily("gasloc_tokens", "Tokens trained on by this daemon")
        tokens.add_metric([], self.totals.tokens)
        yield from (sent, received, failures, rejected, idle, tokens)


class DaemonMetrics:
    """The daemon's gauges and histogram, plus totals read by the scrape-time collector."""

    def __init__(self, stats: WireStats, *, peer_id: str = "", run_id: str = "") -> None:
        self.registry = CollectorRegistry()
        self._httpd: WSGIServer | None = None
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.idle_seconds = 0.0
        self.tokens = 0
        self.extra_failures: dict[str, int] = {}
        r.register(_WireCollector(stats, self))
        Info("gasloc_build", "gaslocd build and run identity", registry=r).info(
            {
                "version": __version__,
                "python": platform.python_version(),
                "run_id": run_id,
                "peer_id": peer_id,
            }
        )
        self.round = Gauge("gasloc_round", "Outer rounds completed", registry=r)
        self.inner_steps = Gauge(
            "gasloc_inner_steps", "Local steps H of the last round", registry=r
        )
        self.train_loss = Gauge(
            "gasloc_train_loss", "Mean training loss of the last round", registry=r
        )
        self.val_loss = Gauge(
            "gasloc_val_loss", "Validation loss on the held-out split", registry=r
        )
        self.consensus = Gauge(
            "gasloc_consensus_distance",
            "RMS of own minus partners' post-local parameters, relative to own norm",
            registry=r,
        )
        self.peers = Gauge(
            "gasloc_peers", "Peers in this round's roster (self included)", registry=r
        )
        self.partners = Gauge("gasloc_partners", "Partners this round (0: sat out)", registry=r)
        self.step_seconds = Gauge(
            "gasloc_step_seconds", "Measured seconds per inner step", registry=r
        )
        self.bandwidth = Gauge(
            "gasloc_link_bandwidth_bytes_per_second",
            "Measured bandwidth of this peer's links (median)",
            registry=r,
        )
        self.idle_fraction = Gauge(
            "gasloc_idle_fraction", "Share of elapsed time spent waiting for partners", registry=r
        )
        self.exchange_seconds = Histogram(
            "gasloc_exchange_seconds",
            "Duration of a round's exchange phase",
            buckets=EXCHANGE_BUCKETS_S,
            registry=r,
        )

    def count_failure(self, reason: str) -> None:
        """Failures outside the gRPC wire (the DiLoCo all-reduce)."""
        self.extra_failures[reason] = self.extra_failures.get(reason, 0) + 1

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
