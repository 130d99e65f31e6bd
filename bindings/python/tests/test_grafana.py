"""docs/grafana/quotalease.json loads: valid JSON shaped as a Grafana dashboard,
and every metric name its PromQL queries use exists in the Prometheus
exposition a real limiter produces (metrics_prometheus()), so a renamed or
misspelt metric fails here instead of leaving an empty panel."""

from __future__ import annotations

import json
import re
from typing import Any

from conftest import ROOT
from quotalease import Limiter

DASHBOARD = ROOT / "docs" / "grafana" / "quotalease.json"

#: PromQL functions, aggregations and keywords the dashboard may use.
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "clamp_min", "clamp_max",
    "label_values", "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "topk", "bottomk", "abs", "delta", "deriv", "histogram_quantile", "vector", "scalar",
}  # fmt: skip

#: What the dashboard must show (issue 16): admitted/denied, Redis calls per
#: admitted, overshoot bound, fallback state and transitions, keys tracked.
REQUIRED = {
    "quotalease_admitted_total",
    "quotalease_denied_total",
    "quotalease_backend_calls_total",
    "quotalease_overshoot_bound",
    "quotalease_fallback_active",
    "quotalease_fallback_transitions_total",
    "quotalease_keys_tracked",
}


def exposition_names() -> set[str]:
    """Metric names from a real limiter's exposition, after some traffic."""
    limiter = Limiter(rate="5/min")
    for _ in range(7):
        limiter.acquire("k")
    text = limiter.metrics_prometheus()
    limiter.close()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def queries(dashboard: dict[str, Any]) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append(target["expr"])
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            out.append(q["query"] if isinstance(q, dict) else q)
    return out


def identifiers(expr: str) -> set[str]:
    """The bare words of a PromQL expression: metric names, functions, keywords
    (label matchers, strings, ranges and by/without label lists removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", r"\1", expr)  # label lists
    expr = re.sub(r"label_values\(([^,()]*),[^)]*\)", r"label_values(\1)", expr)  # its label argument
    expr = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "", expr)  # numbers
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))


def test_dashboard_is_valid_json_and_every_metric_exists() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    assert dashboard["panels"], "no panels"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["type"] and set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["targets"], f"panel {panel['title']!r} has no query"

    known = exposition_names()
    assert REQUIRED <= known, "the exposition lost a metric the dashboard needs"
    used: set[str] = set()
    for expr in queries(dashboard):
        words = identifiers(expr)
        metrics = {w for w in words if w not in PROMQL_WORDS}
        assert metrics, f"no metric in {expr!r}"
        unknown = metrics - known
        assert not unknown, f"{sorted(unknown)} in {expr!r} are not in the limiter's exposition {sorted(known)}"
        used |= metrics
    assert REQUIRED <= used, f"the dashboard does not show {sorted(REQUIRED - used)}"


def test_the_check_catches_a_misspelt_metric() -> None:
    known = exposition_names()
    words = identifiers('sum by (instance) (rate(quotalease_admited_total{job=~"$job"}[5m]))')
    assert words - PROMQL_WORDS == {"quotalease_admited_total"}
    assert not (words - PROMQL_WORDS) <= known
