"""The deployment files agree with each other and with what a daemon exports.

No Docker engine runs here, so compose.yaml and the Dockerfile are checked by reading them:
services, volumes, ports and paths must line up; the real scrape is tests/deploy/test_scrape.py.
promtool (Debian package `prometheus`) checks the Prometheus config and unit-tests the alerts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from gaslocd.daemon.metrics import MAX_REASONS, DaemonMetrics, metric_names
from gaslocd.net.validation import WireStats
from gaslocd.protocol.account import ACTIVITIES
from tests.deploy.promql import (
    DASHBOARD,
    DEPLOY,
    alert_rules,
    dashboard_queries,
    names_in,
    panel,
)

ROOT = DEPLOY.parent
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
PROMETHEUS = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()

# docs/design.md §4, with the sample names Prometheus stores (counters end in _total).
DESIGN_METRICS = {
    "gasloc_round": "gauge",
    "gasloc_inner_steps": "gauge",
    "gasloc_train_loss": "gauge",
    "gasloc_tokens": "counter",
    "gasloc_consensus_distance": "gauge",
    "gasloc_peers": "gauge",
    "gasloc_exchange_seconds": "histogram",
    "gasloc_idle_seconds": "counter",  # wall-clock not spent training
    "gasloc_time_seconds": "counter",  # the time account, label `activity`
    "gasloc_roster_reads": "counter",  # prefetched or waited for, label `source`
    "gasloc_dht_reads": "counter",  # full or quick, label `kind`
    "gasloc_dht_rpcs": "counter",  # our DHT node's RPCs, labels `rpc`, `side`
    "gasloc_dht_rpc_bytes": "counter",  # and their bytes, `direction` too
    "gasloc_bytes_sent": "counter",
    "gasloc_bytes_received": "counter",
    "gasloc_link_bandwidth_bytes_per_second": "gauge",
    "gasloc_exchange_failures": "counter",
    "gasloc_rejected_messages": "counter",
    "gasloc_calls_refused": "counter",  # the gRPC gate's refusals, label `reason`
}


def _exported() -> set[str]:
    metrics = DaemonMetrics(WireStats(), peer_id="p", run_id="r")
    return metric_names(metrics.registry) | {"up"}  # `up` is Prometheus's own per target


def _daemon_env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in COMPOSE["services"][service]["environment"].items()}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing in CI: .ci/run installs the Debian package prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


# -- metrics ----------------------------------------------------------------------------


def test_design_metrics_are_exported_with_their_types_and_no_peer_labels() -> None:
    metrics = DaemonMetrics(WireStats(), peer_id="p", run_id="r")
    families = {f.name: f for f in metrics.registry.collect()}
    for name, kind in DESIGN_METRICS.items():
        assert name in families, name
        assert families[name].type == kind, name
    for family in families.values():
        if family.name.startswith("gasloc_") and family.name != "gasloc_build":
            for sample in family.samples:
                # bounded vocabularies only: never a peer id
                assert set(sample.labels) <= {
                    *("reason", "le", "activity", "codec", "outcome", "source", "kind"),
                    *("rpc", "side", "direction"),
                }, (
                    family.name,
                    sample.labels,
                )
    build = families["gasloc_build"].samples[0].labels
    assert {"version", "python", "torch", "run_id", "peer_id"} <= set(build)
    assert {"process_resident_memory_bytes", "python_info"} <= _exported()


def test_unknown_gauges_read_nan_and_reason_labels_are_bounded() -> None:
    stats = WireStats()
    metrics = DaemonMetrics(stats)
    loss = metrics.registry.get_sample_value("gasloc_train_loss")
    assert loss is not None and loss != loss  # NaN, not a plausible 0
    for i in range(MAX_REASONS + 20):
        stats.failures[f"refused:r{i}"] += 1
    stats.failures["Refused: <script>"] += 1  # a peer's own reason string: not a label
    samples = [
        s
        for f in metrics.registry.collect()
        if f.name == "gasloc_exchange_failures"
        for s in f.samples
    ]
    reasons = {s.labels["reason"] for s in samples}
    assert len(reasons) <= MAX_REASONS + 1 and "other" in reasons
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9_:-]*", r) for r in reasons)
    assert sum(s.value for s in samples) == MAX_REASONS + 21  # nothing dropped, only folded
    deadline = {"reason": "deadline"}
    assert metrics.registry.get_sample_value("gasloc_exchange_failures_total", deadline) == 0


def test_the_time_account_exports_every_activity_from_the_start_and_only_those() -> None:
    metrics = DaemonMetrics(WireStats())
    (family,) = [f for f in metrics.registry.collect() if f.name == "gasloc_time_seconds"]
    assert family.type == "counter"
    assert [s.labels["activity"] for s in family.samples] == list(ACTIVITIES)
    assert all(s.value == 0 for s in family.samples)  # a series for rate() before round 1
    metrics.time_account = lambda: {"train": 7.0, "wait_ready": 2.0, "other": 1.0}
    got = {
        a: metrics.registry.get_sample_value("gasloc_time_seconds_total", {"activity": a})
        for a in ACTIVITIES
    }
    assert got == {**dict.fromkeys(ACTIVITIES, 0.0), "train": 7.0, "wait_ready": 2.0, "other": 1.0}


# -- dashboard and alerts -----------------------------------------------------------------


def test_dashboard_and_alerts_query_only_exported_metrics() -> None:
    exported = _exported()
    queries = dashboard_queries()
    assert len(queries) >= 15
    for title, expr in queries:
        used = names_in(expr)
        assert used, f"{title}: no metric found in {expr!r}"
        assert used <= exported, f"{title}: {used - exported} not exported"
    for rule in alert_rules():
        used = names_in(str(rule["expr"]))
        assert used and used <= exported, (rule["alert"], used - exported)


def test_dashboard_covers_what_the_issue_asks_for() -> None:
    text = " ".join(expr for _t, expr in dashboard_queries())
    for name in (
        "gasloc_train_loss",
        "gasloc_consensus_distance",
        "gasloc_inner_steps",  # H per worker
        "gasloc_time_seconds_total",  # training share and time by activity
        "gasloc_bytes_sent_total",
        "gasloc_link_bandwidth_bytes_per_second",
        "gasloc_exchange_failures_total",
        "gasloc_peers",
    ):
        assert name in text, name
    alerts = {str(r["alert"]) for r in alert_rules()}
    assert {
        "GaslocTrainingShareLow",
        "GaslocConsensusDistanceRising",
        "GaslocExchangeFailures",
        "GaslocPeersDropping",
        "GaslocNoRoundProgress",
    } <= alerts


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load((DEPLOY / "alerts_test.yml").read_text())["tests"]
    fired = {
        str(case["alertname"])
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == {str(r["alert"]) for r in alert_rules()}


def test_the_consensus_panel_is_logarithmic_names_peers_and_shows_the_run() -> None:
    consensus = panel("Consensus distance")
    assert consensus["fieldConfig"]["defaults"]["custom"]["scaleDistribution"]["type"] == "log"
    legends = [t["legendFormat"] for t in consensus["targets"]]
    assert legends == ["{{peer_id}}", "run-wide median", "run-wide max"]
    assert "group_left (peer_id) gasloc_build_info" in consensus["targets"][0]["expr"]


def test_training_share_is_read_alike_by_the_dashboard_and_the_alert() -> None:
    """Training share = rate of train and fill over the rate of all activities."""
    per_daemon, run_wide = (t["expr"] for t in panel("Training share")["targets"])
    (stat,) = (t["expr"] for t in panel("Training share (run-wide)")["targets"])
    (alert,) = [r for r in alert_rules() if r["alert"] == "GaslocTrainingShareLow"]
    assert "sum by (instance)" in per_daemon and "by (" not in run_wide and stat == run_wide
    assert "sum by (job, instance)" in str(alert["expr"]) and alert["for"] == "15m"
    for expr in (per_daemon, run_wide, str(alert["expr"])):
        numerator, denominator = expr.split(" / ")
        assert 'activity=~"train|fill"' in numerator and "activity" not in denominator, expr
        assert all("rate(gasloc_time_seconds_total{" in part for part in (numerator, denominator))
    stacked = panel("Time by activity")
    (by_activity,) = (t["expr"] for t in stacked["targets"])
    assert by_activity.startswith("sum by (activity) (rate(gasloc_time_seconds_total{")
    assert stacked["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    # Nothing on the dashboard still calls waiting for partners "idle".
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        assert "idle" not in p["title"].lower(), p["title"]
        assert "waited for partners" not in p["description"], p["title"]


def test_grafana_provisioning_matches_compose() -> None:
    dash = json.loads(DASHBOARD.read_text())
    provisioning = DEPLOY / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["url"] == "http://prometheus:9090"
    uids = {p["datasource"]["uid"] for p in dash["panels"]}
    uids |= {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]}
    assert uids == {source["uid"]}
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    providers = yaml.safe_load((provisioning / "dashboards" / "gaslocd.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in COMPOSE["services"]["grafana"]["volumes"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./grafana/dashboards"] == providers["providers"][0]["options"]["path"]


# -- compose, Prometheus config, Dockerfile --------------------------------------------------


def test_compose_services_volumes_and_ports_line_up() -> None:
    services = COMPOSE["services"]
    assert {"bootstrap", "worker", "prometheus", "grafana"} <= set(services)
    declared = set(COMPOSE["volumes"])
    used: set[str] = set()
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
            else:
                used.add(source)
    assert used == declared, f"declared but unused or used but undeclared: {used ^ declared}"
    assert (DEPLOY / services["bootstrap"]["build"]["context"] / "Dockerfile").exists()
    assert services["bootstrap"]["entrypoint"] == ["gaslocd-compose", "start"]
    assert services["worker"]["entrypoint"] == ["gaslocd-compose", "join"]
    assert services["worker"]["depends_on"] == ["bootstrap"]
    # The bootstrap address travels through one shared volume, read-only for workers.
    assert "bootstrap-address:/run/gaslocd" in services["bootstrap"]["volumes"]
    assert "bootstrap-address:/run/gaslocd:ro" in services["worker"]["volumes"]
    env = _daemon_env("bootstrap")
    assert env["GASLOCD_ANNOUNCE"].endswith("bootstrap}")  # the service name by default
    published = {p.split(":")[-1] for p in services["bootstrap"]["ports"]}
    assert published == {env["GASLOCD_PORT"], env["GASLOCD_DHT_PORT"]}
    # Prometheus scrapes each daemon service on the port the daemons serve metrics on.
    (job,) = [j for j in PROMETHEUS["scrape_configs"] if j["job_name"] == "gaslocd"]
    (dns,) = job["dns_sd_configs"]
    assert set(dns["names"]) == {"bootstrap", "worker"}
    assert (
        str(dns["port"])
        == env["GASLOCD_METRICS_PORT"]
        == _daemon_env("worker")["GASLOCD_METRICS_PORT"]
    )
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    for rule_file in PROMETHEUS["rule_files"]:
        assert mounts[f"./{rule_file}"] == f"/etc/prometheus/{rule_file}"


def test_dockerfile_matches_the_compose_ports_and_runs_unprivileged() -> None:
    env = _daemon_env("bootstrap")
    exposed = set(re.findall(r"(\d+)/tcp", re.search(r"^EXPOSE (.*)$", DOCKERFILE, re.M)[1]))
    assert exposed == {env["GASLOCD_PORT"], env["GASLOCD_DHT_PORT"], env["GASLOCD_METRICS_PORT"]}
    for key in ("GASLOCD_PORT", "GASLOCD_DHT_PORT", "GASLOCD_METRICS_PORT"):
        assert f"{key}={env[key]}" in DOCKERFILE
    user = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert re.search(r'^ENTRYPOINT \["gaslocd"\]', DOCKERFILE, re.M)
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD .*gaslocd status", DOCKERFILE, re.M)
    assert "ARG VARIANT=cuda" in DOCKERFILE and "nvidia/cuda:" in DOCKERFILE
    assert "ARG TORCH_SPEC=torch==" in DOCKERFILE
    assert re.search(r'^VOLUME \[.*"/var/lib/gaslocd/checkpoints".*"/data"', DOCKERFILE, re.M)
    # Everything the Dockerfile copies is let through by .dockerignore.
    allowed = (ROOT / ".dockerignore").read_text()
    for line in re.findall(r"^COPY (?:--\S+ )*(.*) \S+$", DOCKERFILE, re.M):
        for source in line.split():
            assert (ROOT / source).exists() or source == "README.md", source
            assert f"!{source}" in allowed or f"!{source}/" in allowed, source


def test_promtool_accepts_the_config_and_the_alert_unit_tests_pass() -> None:
    promtool = _promtool()
    for args in (
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        proc = subprocess.run(
            [promtool, *args], cwd=DEPLOY, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
