"""The PromQL the shipped deployment uses: every dashboard query and alert expression."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gaslocd.json"
ALERTS = DEPLOY / "alerts.yml"

# Metric names are the only identifiers with these prefixes (functions and labels are not).
_METRIC = re.compile(
    r"\b(gasloc_[a-z0-9_]+|process_[a-z0-9_]+|python_[a-z0-9_]+|up)\b(?=\s*[{\[)])"
)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def panel(title: str) -> dict[str, Any]:
    """The dashboard panel called ``title`` (exactly one)."""
    (found,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == title]
    return dict(found)


def alert_rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def names_in(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def as_query(expr: str, rate_interval: str = "1m") -> str:
    """A dashboard expr with Grafana's variables replaced, ready for /api/v1/query."""
    return expr.replace("$__rate_interval", rate_interval).replace("$instance", ".*")
