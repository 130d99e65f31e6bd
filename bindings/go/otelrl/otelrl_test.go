package otelrl_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	quotalease "github.com/quotalease/quotalease/bindings/go"
	"github.com/quotalease/quotalease/bindings/go/otelrl"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func limiter(t *testing.T, limit uint64) *quotalease.Limiter {
	t.Helper()
	cfg := quotalease.DefaultConfig()
	cfg.Limit = limit
	cfg.WindowMs = 60000
	cfg.ManualClock = true
	lim, err := quotalease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelrl.ScopeName {
			t.Fatalf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// points returns the data points of a metric by the value of its "limiter" attribute.
func points(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	add := func(attrs attribute.Set, v int64) {
		name, _ := attrs.Value("limiter")
		out[name.AsString()] = v
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	default:
		t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
	}
	return out
}

func TestInstrumentsMirrorThePrometheusExposition(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())
	lim := limiter(t, 3)
	reg, err := otelrl.Register(lim, otelrl.WithMeterProvider(provider), otelrl.WithAttributes(attribute.String("limiter", "api")))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		lim.Acquire("k")
	}
	lim.Acquire("other")

	got := collect(t, reader)
	want := map[string]string{} // exposition name -> type, from the limiter's own text
	for _, line := range strings.Split(lim.MetricsPrometheus(), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[1] == "TYPE" {
			want[f[2]] = f[3]
		}
	}
	if len(want) != 13 || len(got) != len(want) {
		t.Fatalf("got %d instruments, the exposition has %d", len(got), len(want))
	}
	values := lim.Metrics().Map()
	for _, m := range otelrl.Metrics(lim) {
		g, ok := got[m.Instrument]
		if !ok {
			t.Fatalf("no instrument %s", m.Instrument)
		}
		if m.Counter && m.Instrument+"_total" != m.Prometheus || !m.Counter && m.Instrument != m.Prometheus {
			t.Fatalf("instrument %s for %s", m.Instrument, m.Prometheus)
		}
		if g.Description != m.Help || g.Unit != "" {
			t.Fatalf("%s: description %q unit %q", m.Prometheus, g.Description, g.Unit)
		}
		sum, isSum := g.Data.(metricdata.Sum[int64])
		if m.Counter != (isSum && sum.IsMonotonic) || (want[m.Prometheus] == "counter") != m.Counter {
			t.Fatalf("%s: kind %T, exposition %s", m.Prometheus, g.Data, want[m.Prometheus])
		}
		if p := points(t, g); len(p) != 1 || p["api"] != int64(values[m.Name]) {
			t.Fatalf("%s: points %v, metrics %d", m.Prometheus, p, values[m.Name])
		}
	}
	if p := points(t, got["quotalease_admitted"]); p["api"] != 4 {
		t.Fatalf("admitted %v", p)
	}
	if p := points(t, got["quotalease_denied"]); p["api"] != 2 {
		t.Fatalf("denied %v", p)
	}

	// A second limiter on the same provider, told apart by its attributes.
	second := limiter(t, 10)
	if _, err := otelrl.Register(second, otelrl.WithMeterProvider(provider), otelrl.WithAttributes(attribute.String("limiter", "search"))); err != nil {
		t.Fatal(err)
	}
	second.Acquire("x")
	if p := points(t, collect(t, reader)["quotalease_admitted"]); p["api"] != 4 || p["search"] != 1 || len(p) != 2 {
		t.Fatalf("two limiters: %v", p)
	}
	// Unregister: the first limiter is observed no more.
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if p := points(t, collect(t, reader)["quotalease_admitted"]); len(p) != 1 || p["search"] != 1 {
		t.Fatalf("after Unregister: %v", p)
	}
}

// The SDK's Prometheus exporter (what a service would scrape) shows exactly
// the samples of the limiter's own exposition, names and values.
func TestThePrometheusExporterShowsTheExpositionsSeries(t *testing.T) {
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(context.Background())
	lim := limiter(t, 2)
	if _, err := otelrl.Register(lim, otelrl.WithMeterProvider(provider)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		lim.Acquire("k")
	}
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var scraped strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&scraped, f); err != nil {
			t.Fatal(err)
		}
	}
	got, want := samples(scraped.String()), samples(lim.MetricsPrometheus())
	if len(want) != 13 || want["quotalease_admitted_total"] != "2" || want["quotalease_denied_total"] != "1" {
		t.Fatalf("exposition %v", want)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the exporter shows\n%v\nthe exposition\n%v", got, want)
	}
}

// samples maps each quotalease_ sample of a Prometheus text to its value
// (labels dropped).
func samples(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "quotalease_") {
			continue
		}
		name := strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })[0]
		out[name] = line[strings.LastIndex(line, " ")+1:]
	}
	return out
}

func TestBadInput(t *testing.T) {
	if _, err := otelrl.Register(nil); err == nil || !strings.Contains(err.Error(), "limiter is nil") {
		t.Fatalf("nil limiter: %v", err)
	}
	if _, err := otelrl.Register(limiter(t, 1), otelrl.WithMeterProvider(nil)); err == nil || !strings.Contains(err.Error(), "provider is nil") {
		t.Fatalf("nil provider: %v", err)
	}
}
