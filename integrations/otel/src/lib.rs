//! OpenTelemetry metrics for a quotalease [`Limiter`], opt-in (the core never
//! depends on OpenTelemetry).
//!
//! [`register`] creates one observable instrument per metric of the limiter,
//! named after its own Prometheus exposition ([`Limiter::metrics_prometheus`]):
//! `quotalease_admitted` and the other counters (the exposition's names without
//! `_total`, which OpenTelemetry's Prometheus exporters add back) as `u64`
//! observable counters, `quotalease_fallback_active`, `quotalease_keys_tracked`
//! and `quotalease_overshoot_bound` as `u64` observable gauges, with the
//! exposition's help as description and no unit (an exporter would append it
//! to the names). The names, kinds and descriptions are parsed from the
//! exposition, as Python's `quotalease.otel`, Go's `otelrl` and Node's
//! `quotalease/otel` do, so every language reports the same series. The values
//! are read when the SDK collects ([`Limiter::metrics`] in each instrument's
//! callback), never on the request path.
//!
//! ```no_run
//! use std::sync::Arc;
//! use opentelemetry::KeyValue;
//!
//! let limiter = Arc::new(quotalease::Limiter::builder().rate("100/min").build().unwrap());
//! let meter = opentelemetry::global::meter("my-service");
//! let registration = quotalease_otel::register(limiter, &meter, vec![KeyValue::new("limiter", "api")]);
//! // ...
//! registration.unregister();
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use quotalease::{Limiter, Metrics};

/// One metric as the exposition names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metric {
    /// The instrument's name: the exposition's, without a counter's `_total`
    /// (`quotalease_admitted`).
    pub name: String,
    /// The exposition's name (`quotalease_admitted_total`).
    pub prometheus: String,
    /// The name in [`Metrics::fields`], e.g. `admitted`.
    pub field: String,
    /// The exposition's HELP text.
    pub description: String,
    /// A counter (else a gauge).
    pub counter: bool,
}

/// The metrics of an exposition, in its order (`# HELP` and `# TYPE` lines).
pub fn metrics(exposition: &str) -> Vec<Metric> {
    let mut help = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = rest.split_once(' ') {
                help.insert(name.to_owned(), text.to_owned());
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let Some((name, kind)) = rest.split_once(' ') else {
                continue;
            };
            let counter = kind == "counter";
            let short = name.strip_prefix("quotalease_").unwrap_or(name);
            let field = if counter {
                short.strip_suffix("_total").unwrap_or(short)
            } else {
                short
            };
            out.push(Metric {
                name: format!("quotalease_{field}"),
                prometheus: name.to_owned(),
                field: field.to_owned(),
                description: help.get(name).cloned().unwrap_or_default(),
                counter,
            });
        }
    }
    out
}

struct Shared {
    limiter: Arc<Limiter>,
    stopped: AtomicBool,
}

impl Shared {
    /// The metric's value now, or None once unregistered.
    fn value(&self, field: &str) -> Option<u64> {
        if self.stopped.load(Ordering::Acquire) {
            return None;
        }
        let m: Metrics = self.limiter.metrics();
        m.fields().iter().find(|f| f.0 == field).map(|f| f.3)
    }
}

/// What [`register`] returns: keeps the instruments; [`unregister`](Self::unregister)
/// stops observing (the SDK keeps instruments for the meter's lifetime).
pub struct Registration {
    shared: Arc<Shared>,
    _instruments: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl Registration {
    /// Stop observing the limiter (idempotent).
    pub fn unregister(&self) {
        self.shared.stopped.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

/// Observable instruments for every metric of `limiter` on `meter`, each
/// observation with `attributes` (e.g. `limiter=api`, to tell limiters apart).
pub fn register(limiter: Arc<Limiter>, meter: &Meter, attributes: Vec<KeyValue>) -> Registration {
    let specs = metrics(&limiter.metrics_prometheus());
    let shared = Arc::new(Shared {
        limiter,
        stopped: AtomicBool::new(false),
    });
    let attributes: Arc<[KeyValue]> = attributes.into();
    let mut instruments: Vec<Box<dyn std::any::Any + Send + Sync>> = Vec::new();
    for m in specs {
        let (s, a, field) = (shared.clone(), attributes.clone(), m.field.clone());
        if m.counter {
            instruments.push(Box::new(
                meter
                    .u64_observable_counter(m.name)
                    .with_description(m.description)
                    .with_callback(move |o| {
                        if let Some(v) = s.value(&field) {
                            o.observe(v, &a)
                        }
                    })
                    .build(),
            ));
        } else {
            instruments.push(Box::new(
                meter
                    .u64_observable_gauge(m.name)
                    .with_description(m.description)
                    .with_callback(move |o| {
                        if let Some(v) = s.value(&field) {
                            o.observe(v, &a)
                        }
                    })
                    .build(),
            ));
        }
    }
    Registration {
        shared,
        _instruments: instruments,
    }
}
