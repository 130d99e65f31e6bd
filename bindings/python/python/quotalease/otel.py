"""OpenTelemetry metrics for a limiter (opt-in; needs ``opentelemetry-api``).

    from quotalease import Limiter
    from quotalease.otel import instrument

    limiter = Limiter("redis://127.0.0.1:6379", rate="600/min")
    registration = instrument(limiter, attributes={"limiter": "api"})
    ...
    registration.unregister()

``instrument`` registers one observable instrument per counter of
``limiter.metrics()`` on the meter ``quotalease`` of ``meter_provider`` (the
global one by default), named so that OpenTelemetry's Prometheus translation
gives the series of the limiter's own exposition (``metrics_prometheus()``):
the counters as observable counters named without ``_total``
(``quotalease_admitted``, which a Prometheus exporter, or Prometheus' OTLP
receiver, exposes as ``quotalease_admitted_total``), ``quotalease_fallback_active``,
``quotalease_keys_tracked`` and ``quotalease_overshoot_bound`` as observable
gauges, with no unit (the translation would append it to the name). So one
dashboard reads either, and the names are those of the other languages'
OpenTelemetry instruments. The names, kinds and descriptions are read from
the engine's exposition, never kept twice. Several limiters can be
instrumented on one provider, told apart by ``attributes``. Values are read
when the SDK collects, with no cost on the request path.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from . import __version__
from ._middleware import check_limiter
from ._native import Limiter

__all__ = ["Registration", "instrument", "metric_kinds"]

Attributes = Mapping[str, str | bool | int | float]


def metric_kinds(limiter: Limiter) -> list[tuple[str, str, str, str]]:
    """``(metrics() name, instrument name, "counter" | "gauge", help)`` for every
    metric, in the exposition's order, parsed from ``metrics_prometheus()``; the
    instrument name is the exposition's without a counter's ``_total``."""
    helps: dict[str, str] = {}
    out = []
    for line in limiter.metrics_prometheus().splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[len("# HELP ") :].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            instrument = name.removesuffix("_total") if kind == "counter" else name
            short = instrument.removeprefix("quotalease_")
            out.append((short, instrument, kind, helps.get(name, "")))
    return out


class _Collector:
    """The instruments of one meter and the limiters they observe."""

    def __init__(self, meter: Meter, kinds: list[tuple[str, str, str, str]]) -> None:
        self.lock = threading.Lock()
        self.limiters: list[tuple[Limiter, dict[str, Any]]] = []
        for short, name, kind, help_text in kinds:
            callback = self._callback(short)
            if kind == "counter":
                meter.create_observable_counter(name, callbacks=[callback], unit="", description=help_text)
            else:
                meter.create_observable_gauge(name, callbacks=[callback], unit="", description=help_text)

    def _callback(self, short: str) -> Any:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self.lock:
                observed = list(self.limiters)
            return [Observation(limiter.metrics()[short], attrs) for limiter, attrs in observed]

        return observe


_collectors: dict[int, tuple[MeterProvider, _Collector]] = {}
_collectors_lock = threading.Lock()


class Registration:
    """What :func:`instrument` returns; ``unregister()`` stops observing the limiter."""

    __slots__ = ("_collector", "_entry")

    def __init__(self, collector: _Collector, entry: tuple[Limiter, dict[str, Any]]) -> None:
        self._collector = collector
        self._entry = entry

    def unregister(self) -> None:
        with self._collector.lock:
            if self._entry in self._collector.limiters:
                self._collector.limiters.remove(self._entry)


def instrument(
    limiter: Limiter,
    *,
    meter_provider: MeterProvider | None = None,
    attributes: Attributes | None = None,
) -> Registration:
    """Report ``limiter``'s metrics through OpenTelemetry (see the module's doc).

    Raises TypeError for something that is not a limiter or for attributes that
    are not a mapping of str to str/bool/int/float, and ValueError when this
    limiter is already instrumented with the same attributes on this provider."""
    check_limiter(limiter, "instrument()")
    attrs: dict[str, Any] = {}
    if attributes is not None:
        if not isinstance(attributes, Mapping):
            raise TypeError("instrument(): attributes must be a mapping of str to str, bool, int or float")
        for k, v in attributes.items():
            if not isinstance(k, str) or not isinstance(v, str | bool | int | float):
                raise TypeError(f"instrument(): attribute {k!r} must be a str mapped to a str, bool, int or float")
            attrs[k] = v
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _collectors_lock:
        found = _collectors.get(id(provider))
        if found is None or found[0] is not provider:
            meter = provider.get_meter("quotalease", __version__)
            found = _collectors[id(provider)] = (provider, _Collector(meter, metric_kinds(limiter)))
    collector = found[1]
    entry = (limiter, attrs)
    with collector.lock:
        if any(lim is limiter and a == attrs for lim, a in collector.limiters):
            raise ValueError("instrument(): this limiter is already instrumented with these attributes")
        collector.limiters.append(entry)
    return Registration(collector, entry)
