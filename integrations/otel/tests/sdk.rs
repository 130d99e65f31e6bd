//! quotalease-otel with the OpenTelemetry SDK: a meter provider whose reader
//! exports into memory, flushed on demand, compared with the limiter's own
//! Prometheus exposition.

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use quotalease::Limiter;

struct Seen {
    kind: &'static str,
    description: String,
    points: Vec<(u64, Vec<KeyValue>)>,
}

fn setup() -> (InMemoryMetricExporter, SdkMeterProvider) {
    let exporter = InMemoryMetricExporter::default();
    let reader = PeriodicReader::builder(exporter.clone()).build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    (exporter, provider)
}

/// The last export: name -> what it carried.
fn collect(exporter: &InMemoryMetricExporter, provider: &SdkMeterProvider) -> HashMap<String, Seen> {
    exporter.reset();
    provider.force_flush().unwrap();
    let mut out = HashMap::new();
    for rm in exporter.get_finished_metrics().unwrap() {
        for sm in rm.scope_metrics() {
            for m in sm.metrics() {
                let (kind, points): (&str, Vec<(u64, Vec<KeyValue>)>) = match m.data() {
                    AggregatedMetrics::U64(MetricData::Sum(s)) => {
                        assert!(s.is_monotonic(), "{}", m.name());
                        (
                            "counter",
                            s.data_points()
                                .map(|p| (p.value(), p.attributes().cloned().collect()))
                                .collect(),
                        )
                    }
                    AggregatedMetrics::U64(MetricData::Gauge(g)) => (
                        "gauge",
                        g.data_points()
                            .map(|p| (p.value(), p.attributes().cloned().collect()))
                            .collect(),
                    ),
                    _ => ("other", Vec::new()),
                };
                out.insert(
                    m.name().to_owned(),
                    Seen {
                        kind,
                        description: m.description().to_owned(),
                        points,
                    },
                );
            }
        }
    }
    out
}

/// The exposition as name -> (type, help, value).
fn prometheus(text: &str) -> HashMap<String, (String, String, u64)> {
    let mut out: HashMap<String, (String, String, u64)> = HashMap::new();
    for line in text.lines() {
        if let Some(r) = line.strip_prefix("# HELP ") {
            let (n, h) = r.split_once(' ').unwrap();
            out.entry(n.into()).or_default().1 = h.into();
        } else if let Some(r) = line.strip_prefix("# TYPE ") {
            let (n, t) = r.split_once(' ').unwrap();
            out.entry(n.into()).or_default().0 = t.into();
        } else if let Some((n, v)) = line.split_once(' ') {
            out.entry(n.into()).or_default().2 = v.parse().unwrap();
        }
    }
    out
}

#[test]
fn every_prometheus_metric_with_the_same_name_kind_help_and_value() {
    let (exporter, provider) = setup();
    let limiter = Arc::new(
        Limiter::builder()
            .limit(3)
            .window_ms(60_000)
            .lease_size(1)
            .build()
            .unwrap(),
    );
    let meter = provider.meter("my-service");
    let reg = quotalease_otel::register(limiter.clone(), &meter, vec![KeyValue::new("limiter", "api")]);

    for _ in 0..5 {
        limiter.acquire("user:1", 1).unwrap();
    }
    limiter.acquire("user:2", 1).unwrap();
    let seen = collect(&exporter, &provider);
    let prom = prometheus(&limiter.metrics_prometheus());
    assert_eq!(prom.len(), 13);
    assert_eq!(seen.len(), prom.len());
    for (prom_name, (kind, help, value)) in &prom {
        // Counters are named without the `_total` a Prometheus exporter adds.
        let name = if kind == "counter" {
            prom_name.strip_suffix("_total").unwrap()
        } else {
            prom_name
        };
        let s = seen.get(name).unwrap_or_else(|| panic!("no instrument {name}"));
        assert_eq!(s.kind, kind, "{name}");
        assert_eq!(&s.description, help, "{name}");
        assert_eq!(
            s.points,
            vec![(*value, vec![KeyValue::new("limiter", "api")])],
            "{name}"
        );
    }
    // The limiter's values, not zeros: 4 admitted (3 + 1), 2 denied, 2 keys.
    assert_eq!(seen["quotalease_admitted"].points[0].0, 4);
    assert_eq!(seen["quotalease_denied"].points[0].0, 2);
    assert_eq!(seen["quotalease_keys_tracked"].points[0].0, 2);

    // Later collections see later values; after unregister() none changes.
    limiter.acquire("user:3", 1).unwrap();
    assert_eq!(collect(&exporter, &provider)["quotalease_admitted"].points[0].0, 5);
    reg.unregister();
    reg.unregister();
    limiter.acquire("user:4", 1).unwrap();
    assert_eq!(limiter.metrics().admitted, 6);
    // The SDK may go on exporting a cumulative stream's last value; it must
    // not see the 6th admission.
    let after = collect(&exporter, &provider);
    let admitted = after.get("quotalease_admitted");
    assert!(
        admitted.is_none_or(|s| s.points.iter().all(|p| p.0 != 6)),
        "still observed after unregister()"
    );
    provider.shutdown().unwrap();
}

#[test]
fn two_limiters_told_apart_by_attributes_and_names_from_the_exposition() {
    let (exporter, provider) = setup();
    let meter = provider.meter("svc");
    let a = Arc::new(Limiter::builder().limit(5).lease_size(1).build().unwrap());
    let b = Arc::new(Limiter::builder().limit(5).lease_size(1).build().unwrap());
    let _ra = quotalease_otel::register(a.clone(), &meter, vec![KeyValue::new("limiter", "a")]);
    let _rb = quotalease_otel::register(b.clone(), &meter, vec![KeyValue::new("limiter", "b")]);
    a.acquire("k", 1).unwrap();
    b.acquire("k", 1).unwrap();
    b.acquire("k", 1).unwrap();
    let seen = collect(&exporter, &provider);
    let mut by: Vec<(String, u64)> = seen["quotalease_admitted"]
        .points
        .iter()
        .map(|(v, attrs)| (attrs[0].value.to_string(), *v))
        .collect();
    by.sort();
    assert_eq!(by, [("a".to_string(), 1), ("b".to_string(), 2)]);

    let names: Vec<String> = quotalease_otel::metrics(&a.metrics_prometheus())
        .into_iter()
        .map(|m| {
            format!(
                "{}:{}:{}:{}",
                m.name,
                m.prometheus,
                m.field,
                if m.counter { "counter" } else { "gauge" }
            )
        })
        .collect();
    assert_eq!(
        names[0],
        "quotalease_admitted:quotalease_admitted_total:admitted:counter"
    );
    assert_eq!(
        names[9],
        "quotalease_keys_tracked:quotalease_keys_tracked:keys_tracked:gauge"
    );
    assert_eq!(names.len(), 13);
    provider.shutdown().unwrap();
}

#[test]
fn scraped_through_the_prometheus_exporter_exactly_the_expositions_samples() {
    let registry = prometheus::Registry::new();
    let exporter = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()
        .unwrap();
    let provider = SdkMeterProvider::builder().with_reader(exporter).build();
    let limiter = Arc::new(
        Limiter::builder()
            .limit(3)
            .window_ms(60_000)
            .lease_size(1)
            .build()
            .unwrap(),
    );
    let _reg = quotalease_otel::register(
        limiter.clone(),
        &provider.meter("svc"),
        vec![KeyValue::new("limiter", "api")],
    );
    for _ in 0..5 {
        limiter.acquire("user:1", 1).unwrap();
    }
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    let mut scraped: Vec<(String, u64)> = text
        .lines()
        .filter(|l| l.starts_with("quotalease_"))
        .map(|l| {
            let (name, rest) = l.split_once('{').unwrap();
            assert!(rest.contains("limiter=\"api\""), "{l}");
            (name.to_owned(), rest.rsplit(' ').next().unwrap().parse().unwrap())
        })
        .collect();
    scraped.sort();
    let mut expected: Vec<(String, u64)> = prometheus(&limiter.metrics_prometheus())
        .into_iter()
        .map(|(n, (_, _, v))| (n, v))
        .collect();
    expected.sort();
    assert_eq!(scraped, expected, "{text}");
    assert!(scraped.contains(&("quotalease_admitted_total".to_owned(), 3)));
    provider.shutdown().unwrap();
}
