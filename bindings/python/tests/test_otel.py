"""quotalease.otel with the real OpenTelemetry SDK (InMemoryMetricReader): the
instruments carry the limiter's metrics() values under names that the SDK's
Prometheus exporter turns into exactly the limiter's own exposition; and
importing quotalease pulls in no optional framework."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum
from prometheus_client import REGISTRY, generate_latest

from quotalease import Limiter
from quotalease.otel import instrument, metric_kinds


def collect(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    out = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "quotalease"
            for m in sm.metrics:
                out[m.name] = m
    return out


def exposition_names(limiter: Limiter) -> dict[str, str]:
    """Prometheus name -> type, from the limiter's own text."""
    kinds = {}
    for line in limiter.metrics_prometheus().splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            kinds[name] = kind
    return kinds


def test_instruments_mirror_the_prometheus_exposition() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    limiter = Limiter(limit=3, window_ms=60_000)
    registration = instrument(limiter, meter_provider=provider, attributes={"limiter": "api"})
    for _ in range(5):
        limiter.acquire("k")
    limiter.acquire("other")

    got = collect(reader)
    kinds = exposition_names(limiter)
    assert len(kinds) == 13
    # Counters drop "_total" (OTel's Prometheus translation adds it back), gauges keep their name.
    assert {n + "_total" if n + "_total" in kinds else n for n in got} == set(kinds)
    values = limiter.metrics()
    for short, name, kind, help_text in metric_kinds(limiter):
        metric = got[name]
        assert metric.description == help_text and metric.unit == ""
        if kind == "counter":
            assert isinstance(metric.data, Sum) and metric.data.is_monotonic
        else:
            assert isinstance(metric.data, Gauge)
        [point] = metric.data.data_points
        assert dict(point.attributes) == {"limiter": "api"}
        assert point.value == values[short], name
    points = {name: got[name].data.data_points[0].value for name in got}
    assert points["quotalease_admitted"] == 4
    assert points["quotalease_denied"] == 2
    assert points["quotalease_keys_tracked"] == 2

    # A second limiter on the same provider, told apart by its attributes.
    second = Limiter(limit=10)
    instrument(second, meter_provider=provider, attributes={"limiter": "search"})
    second.acquire("x")
    admitted = {dict(p.attributes)["limiter"]: p.value for p in collect(reader)["quotalease_admitted"].data.data_points}
    assert admitted == {"api": 4, "search": 1}

    # unregister(): no more observations of that limiter.
    registration.unregister()
    admitted_points = collect(reader)["quotalease_admitted"].data.data_points
    assert [dict(p.attributes) for p in admitted_points] == [{"limiter": "search"}]
    provider.shutdown()


def test_the_prometheus_exporter_shows_the_exposition_s_series() -> None:
    # The SDK's Prometheus exporter (what a service would scrape); it registers on
    # prometheus_client's global registry until the provider shuts down.
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    limiter = Limiter(limit=2, window_ms=60_000)
    instrument(limiter, meter_provider=provider)
    for _ in range(3):
        limiter.acquire("k")
    try:
        scraped = generate_latest(REGISTRY).decode()
    finally:
        provider.shutdown()
    native = limiter.metrics_prometheus()
    assert samples(scraped) == samples(native) and len(samples(native)) == 13
    assert samples(native)["quotalease_admitted_total"] == 2 and samples(native)["quotalease_denied_total"] == 1


def samples(text: str) -> dict[str, float]:
    """Sample name -> value of every quotalease_ sample of a Prometheus text
    (labels dropped: the exporter adds its scope's)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("quotalease_"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def test_bad_input() -> None:
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    limiter = Limiter(limit=3)
    with pytest.raises(TypeError, match="limiter must be a quotalease.Limiter"):
        instrument(object(), meter_provider=provider)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attributes"):
        instrument(limiter, meter_provider=provider, attributes=[("a", "b")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attribute 'a'"):
        instrument(limiter, meter_provider=provider, attributes={"a": [1]})  # type: ignore[dict-item]
    instrument(limiter, meter_provider=provider)
    with pytest.raises(ValueError, match="already instrumented"):
        instrument(limiter, meter_provider=provider)
    provider.shutdown()


def test_import_quotalease_pulls_in_no_optional_dependency() -> None:
    code = "import sys, quotalease\nprint('\\n'.join(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    out = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True, check=True, env=env).stdout
    loaded = {m.split(".")[0] for m in out.split()}
    assert "quotalease" in loaded
    optional = {"django", "fastapi", "grpc", "opentelemetry", "starlette", "werkzeug", "flask", "uvicorn", "asgiref"}
    assert loaded & optional == set()
