//! One process of the cross-language system test (tests/system/README.md):
//! reads a JSON job as its only argument, limits keys through a shared Redis
//! with deliberately uneven load until the deadline, closes, and prints one
//! JSON line with what it admitted and its metrics.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quotalease::Limiter;
use serde_json::{json, Value};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let job: Value = serde_json::from_str(&std::env::args().nth(1).expect("job JSON")).expect("valid JSON");
    let n = |k: &str| job[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    let mut b = Limiter::builder()
        .url(job["url"].as_str().unwrap())
        .key_prefix(job["key_prefix"].as_str().unwrap())
        .limit(n("limit"))
        .window_ms(n("window_ms"))
        .on_backend_failure(job["on_backend_failure"].as_str().unwrap().parse().unwrap())
        .expected_replicas(n("expected_replicas"))
        .backend_timeout_ms(n("backend_timeout_ms"));
    // absent: adaptive leasing (the default)
    if let Some(n) = job["lease_size"].as_u64() {
        b = b.lease_size(n);
    }
    let limiter = b.build().unwrap();
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let ev = events.clone();
    limiter.on_event(move |e| {
        eprintln!("event: {e}");
        ev.lock().unwrap().push(e.kind.as_str().to_string())
    });
    let keys: Vec<String> = job["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().into())
        .collect();
    let weights: Vec<u64> = job["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .collect();
    let schedule: Vec<&String> = keys
        .iter()
        .zip(&weights)
        .flat_map(|(k, w)| std::iter::repeat_n(k, *w as usize))
        .collect();
    let pause = Duration::from_micros(n("pause_us"));
    let (start, end) = (n("start_at_ms"), n("start_at_ms") + n("duration_ms"));
    let (slot_ms, settle_end) = (n("slot_ms"), end + n("settle_ms"));
    // Optional: a progress line every progress_ms (for the soak's driver).
    let progress_ms = job["progress_ms"].as_u64().unwrap_or(0);
    let mut next_progress = start;
    while now_ms() < start {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut admitted: BTreeMap<&str, u64> = BTreeMap::new();
    let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
    // (slot, key, reason) -> [admitted, denied]
    let mut timeline: BTreeMap<(u64, &str, &'static str), [u64; 2]> = BTreeMap::new();
    let mut i = 0usize;
    let mut max_ms = 0u64;
    loop {
        let t = now_ms();
        // Past the deadline, go on while degraded: recovery is awaited, not timed.
        if t >= settle_end || (t >= end && limiter.metrics().fallback_active == 0) {
            break;
        }
        if progress_ms > 0 && t >= next_progress {
            let m = limiter.metrics();
            println!(
                "{}",
                json!({"progress_at_ms": t, "fallback_active": m.fallback_active,
                       "fallback_transitions": m.fallback_transitions, "reasons": reasons})
            );
            next_progress = t + progress_ms;
        }
        let key = schedule[i % schedule.len()];
        i += 1;
        let d = limiter.acquire(key, 1).unwrap();
        max_ms = max_ms.max(now_ms() - t);
        *reasons.entry(d.reason.as_str()).or_default() += 1;
        timeline
            .entry(((t - start) / slot_ms, key.as_str(), d.reason.as_str()))
            .or_default()[usize::from(!d.allowed)] += 1;
        if d.allowed {
            *admitted.entry(key.as_str()).or_default() += 1;
        }
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    for k in &keys {
        if let Ok(i) = limiter.inspect(k) {
            eprintln!("inspect {k}: {i:?}");
        }
    }
    let ended_at_ms = now_ms();
    let closed = limiter.close().is_ok();
    let m = limiter.metrics();
    let metrics: BTreeMap<_, _> = m.fields().iter().map(|f| (f.0, f.3)).collect();
    let events = events.lock().unwrap().clone();
    let timeline: Vec<Value> = timeline
        .iter()
        .map(|((slot, key, reason), [a, d])| json!([slot, key, reason, a, d]))
        .collect();
    println!(
        "{}",
        json!({"lang": "rust", "admitted": admitted, "reasons": reasons, "metrics": metrics,
               "events": events, "closed": closed, "max_acquire_ms": max_ms,
               "ended_at_ms": ended_at_ms, "timeline": timeline})
    );
}
