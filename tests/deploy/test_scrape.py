"""A real Prometheus scrapes three real daemons, and the dashboard's queries return data.

The Prometheus config is the shipped deploy/prometheus.yml with its alert rules; only the
targets (127.0.0.1 instead of compose DNS names) and the intervals (1 s) are replaced.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.daemon.procs import FAST_FLAGS, Daemon, start_first
from tests.deploy.promql import (
    ALERTS,
    DEPLOY,
    alert_rules,
    as_query,
    dashboard_queries,
    names_in,
    panel,
)

pytestmark = [pytest.mark.net, pytest.mark.slow]

T = TypeVar("T")


def _prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is missing in CI: .ci/run installs the Debian package")
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PromAPI:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:  # 503 until ready, 400 for a bad query
            with exc:  # closes its socket (an unclosed one is a ResourceWarning, an error here)
                raise AssertionError(f"{exc.code} from {url}: {exc.read()[:500]!r}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[str, float]:
        """instance (or the label set) -> value of an instant query."""
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return {
            r["metric"].get("instance") or json.dumps(r["metric"], sort_keys=True): float(
                r["value"][1]
            )
            for r in data["result"]
        }


def _poll(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float,
    proc: Any = None,
    context: Callable[[], str] = str,
) -> T:
    """``check()``'s first non-None value, polled until ``timeout_s`` (then fail with ``what``)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"prometheus exited ({proc.returncode}) while waiting for {what}")
        try:
            value = check()
        except (urllib.error.URLError, ConnectionError, AssertionError) as exc:
            value, last = None, exc
        if value is not None:
            return value
        time.sleep(0.2)  # polling interval, bounded by the deadline
    pytest.fail(f"no {what} within {timeout_s} s (last: {last})\n{context()}")


def _config(tmp: Path, targets: list[str]) -> Path:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gaslocd"]
    del job["dns_sd_configs"]
    job["static_configs"] = [{"targets": targets}]
    config["scrape_configs"] = [job]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_prometheus_scrapes_daemons_and_every_dashboard_query_has_data(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    binary = _prometheus_binary()
    began = time.monotonic()
    extra = ["--metrics-port", "0", "--min-peers", "2", "--eval-every", "2"]
    summaries = [tmp_path / f"w{i}.json" for i in range(3)]  # written at exit
    first, address = start_first(tmp_path, reaper, *extra, "--json", str(summaries[0]))
    daemons = [first] + [
        Daemon(
            ["join", *FAST_FLAGS, "--bootstrap", address, *extra, "--json", str(summaries[i])],
            reaper,
            f"w{i}",
        )
        for i in (1, 2)
    ]
    for d in daemons[1:]:
        d.wait_for(r"bootstrap address:", 120)
    ports = [int(d.find(r" metrics :(\d+)").group(1)) for d in daemons]
    targets = [f"127.0.0.1:{p}" for p in ports]

    web_port = _free_port()
    with (tmp_path / "prometheus.log").open("wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={_config(tmp_path, targets)}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    reaper.append(proc)
    api = PromAPI(web_port)

    def context() -> str:
        parts = []
        for d in daemons:
            try:  # reads the lines that came so far, then fails with them
                d.wait_for("(?!)", 0.5)
            except AssertionError as exc:
                parts.append(str(exc)[-2500:])
        log = (tmp_path / "prometheus.log").read_text(errors="replace")[-2000:]
        return "\n".join([*parts, "prometheus:", log])

    def poll(what: str, check: Callable[[], T | None], timeout_s: float) -> T:
        return _poll(what, check, timeout_s, proc, context)

    poll("ready Prometheus", lambda: api.get("/api/v1/status/buildinfo") or None, 60)
    up = poll(
        "scrape of all three daemons",
        lambda: (lambda v: v if len(v) == 3 and all(x == 1 for x in v.values()) else None)(
            api.query('up{job="gaslocd"}')
        ),
        60,
    )
    assert set(up) == set(targets), context()

    def all_three(expr: str, ok: Callable[[float], bool]) -> dict[str, float] | None:
        values = api.query(expr)
        return values if len(values) == 3 and all(ok(v) for v in values.values()) else None

    # Consensus is finite once each daemon has exchanged; rounds and bytes have started.
    poll(
        "finite consensus distance on every daemon",
        lambda: all_three("gasloc_consensus_distance", math.isfinite),
        120,
    )
    rounds = poll("rounds", lambda: all_three("gasloc_round", lambda v: v >= 1), 60)
    sent = api.query("gasloc_bytes_sent_total")
    received = api.query("gasloc_bytes_received_total")

    # ... and they move: every daemon's round and byte counters grow while we watch.
    def grew(expr: str, before: dict[str, float]) -> bool | None:
        now = api.query(expr)
        return (set(now) == set(before) and all(now[k] > before[k] for k in now)) or None

    poll("rounds growing", lambda: grew("gasloc_round", rounds), 90)
    poll("bytes sent growing", lambda: grew("gasloc_bytes_sent_total", sent), 60)
    poll("bytes received growing", lambda: grew("gasloc_bytes_received_total", received), 60)
    losses = api.query("gasloc_train_loss")
    assert len(losses) == 3 and all(0 < v < 20 for v in losses.values()), losses
    build = api.get("/api/v1/query", query="gasloc_build_info")["result"]
    assert {r["metric"]["run_id"] for r in build} == {"gaslocd"} and len(build) == 3

    # Every query on the dashboard returns data from this real scrape (rate() windows of
    # 10 s hold ~10 samples at a 1 s scrape).
    for title, expr in dashboard_queries():
        query = as_query(expr, "10s")
        result = poll(
            f"data for panel {title!r} ({query})",
            lambda q=query: api.get("/api/v1/query", query=q)["result"] or None,
            30,
        )
        assert result, title
    # Every alert rule is loaded and evaluates without error; the names it reads exist.
    names = set(api.get("/api/v1/label/__name__/values"))
    for rule in alert_rules():
        assert names_in(str(rule["expr"])) <= names, rule["alert"]

    def rules_evaluated() -> list[dict[str, Any]] | None:
        groups = api.get("/api/v1/rules")["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        done = all(not r["lastEvaluation"].startswith("0001") for r in loaded)  # Go's zero time
        return loaded if loaded and done and all(r["health"] == "ok" for r in loaded) else None

    loaded = poll("alert rules evaluated with health ok", rules_evaluated, 30)
    assert {r["name"] for r in loaded} == {str(r["alert"]) for r in alert_rules()}
    firing = [r["name"] for r in loaded if r["state"] == "firing"]
    rejected = api.query("sum by (reason) (gasloc_rejected_messages_total) > 0")
    assert firing == [], (firing, rejected)  # a healthy run pages nobody

    # The time account: the dashboard's training share (per daemon and run-wide) is a
    # share, and each daemon's activities add up to its wall-clock since its first round.
    for target in panel("Training share")["targets"]:
        query = as_query(target["expr"], "30s")  # a window that holds several rounds
        expect = 3 if "by (instance)" in query else 1
        shares = poll(
            f"a finite training share ({query})",
            lambda q=query, n=expect: (lambda v: v if len(v) == n else None)(
                {k: x for k, x in api.query(q).items() if math.isfinite(x)}
            ),
            30,
        )
        assert all(0 < x <= 1 for x in shares.values()), (query, shares)
    accounted = api.query('sum by (instance) (gasloc_time_seconds_total{job="gaslocd"})')
    queried_at = time.time()

    for d in daemons:
        d.signal(15)
    for d in daemons:
        assert d.finish(60) == 0
    for target, path in zip(targets, summaries, strict=True):
        first_round = json.loads(path.read_text())["rounds"][0]
        since_first = queried_at - (first_round["unix_time"] - first_round["wall_clock_s"])
        assert 0.5 * since_first <= accounted[target] <= 1.05 * since_first, (
            target,
            accounted[target],
            since_first,
        )
    assert time.monotonic() - began < 240
