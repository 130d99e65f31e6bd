// Package otelrl reports a quotalease limiter's metrics through
// OpenTelemetry (go.opentelemetry.io/otel/metric), opt-in:
//
//	reg, err := otelrl.Register(lim, otelrl.WithAttributes(attribute.String("limiter", "api")))
//	...
//	defer reg.Unregister()
//
// Register creates one asynchronous instrument per metric of
// Limiter.Metrics, named so that OpenTelemetry's Prometheus translation gives
// the limiter's own exposition (Limiter.MetricsPrometheus): the counters as
// Int64ObservableCounters named without "_total" (quotalease_admitted, which
// the Prometheus exporter, or Prometheus' OTLP receiver, exposes as
// quotalease_admitted_total), quotalease_fallback_active,
// quotalease_keys_tracked and quotalease_overshoot_bound as
// Int64ObservableGauges, with no unit (the translation would append it to the
// name). So one dashboard reads either, and the names are those of the other
// languages' OpenTelemetry instruments. The names, kinds and descriptions are
// parsed from the engine's exposition, never kept twice. The values are read
// when the SDK collects, at no cost on the request path.
//
// This package is a module of its own
// (github.com/quotalease/quotalease/bindings/go/otelrl), so the core package
// never pulls in OpenTelemetry.
package otelrl

import (
	"context"
	"errors"
	"math"
	"strings"

	quotalease "github.com/quotalease/quotalease/bindings/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the meter Register uses.
const ScopeName = "github.com/quotalease/quotalease/bindings/go/otelrl"

// Metric is one metric of a limiter as its Prometheus exposition names it.
type Metric struct {
	Name       string // the Metrics.Map name, e.g. "admitted"
	Instrument string // the instrument's name, e.g. "quotalease_admitted"
	Prometheus string // the exposition's name, e.g. "quotalease_admitted_total"
	Counter    bool   // a counter (else a gauge)
	Help       string // the exposition's HELP text
}

// Metrics lists lim's metrics in the order of its Prometheus exposition.
func Metrics(lim *quotalease.Limiter) []Metric {
	helps := map[string]string{}
	var out []Metric
	for _, line := range strings.Split(lim.MetricsPrometheus(), "\n") {
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, text, _ := strings.Cut(rest, " ")
			helps[name] = text
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, kind, _ := strings.Cut(rest, " ")
			instrument := name
			if kind == "counter" {
				instrument = strings.TrimSuffix(name, "_total")
			}
			out = append(out, Metric{Name: strings.TrimPrefix(instrument, "quotalease_"), Instrument: instrument,
				Prometheus: name, Counter: kind == "counter", Help: helps[name]})
		}
	}
	return out
}

// Option configures Register.
type Option func(*config)

type config struct {
	provider metric.MeterProvider
	attrs    []attribute.KeyValue
}

// WithMeterProvider sets the provider (default: otel.GetMeterProvider()).
func WithMeterProvider(p metric.MeterProvider) Option { return func(c *config) { c.provider = p } }

// WithAttributes sets the attributes of every observation, to tell several
// limiters apart.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// Register starts reporting lim's metrics (see the package documentation);
// Unregister on the result stops it. The only errors are a nil limiter or
// provider and the SDK's own (an instrument it refuses).
func Register(lim *quotalease.Limiter, opts ...Option) (metric.Registration, error) {
	if lim == nil {
		return nil, errors.New("otelrl: the limiter is nil")
	}
	c := config{provider: otel.GetMeterProvider()}
	for _, o := range opts {
		o(&c)
	}
	if c.provider == nil {
		return nil, errors.New("otelrl: the meter provider is nil")
	}
	meter := c.provider.Meter(ScopeName)
	metrics := Metrics(lim)
	observables := make([]metric.Observable, len(metrics))
	counters := map[metric.Observable]string{}
	for i, m := range metrics {
		var err error
		var obs metric.Observable
		if m.Counter {
			obs, err = meter.Int64ObservableCounter(m.Instrument, metric.WithDescription(m.Help))
		} else {
			obs, err = meter.Int64ObservableGauge(m.Instrument, metric.WithDescription(m.Help))
		}
		if err != nil {
			return nil, err
		}
		observables[i] = obs
		counters[obs] = m.Name
	}
	set := metric.WithAttributeSet(attribute.NewSet(c.attrs...))
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		values := lim.Metrics().Map()
		for _, obs := range observables {
			v := values[counters[obs]]
			if v > math.MaxInt64 {
				v = math.MaxInt64
			}
			switch inst := obs.(type) {
			case metric.Int64ObservableCounter:
				o.ObserveInt64(inst, int64(v), set)
			case metric.Int64ObservableGauge:
				o.ObserveInt64(inst, int64(v), set)
			}
		}
		return nil
	}, observables...)
}
