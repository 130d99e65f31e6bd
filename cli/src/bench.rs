//! `quotalease bench`: N threads calling `acquire` against a real Redis, in
//! lease mode and in exact mode, one after the other in one run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quotalease::{Config, Limiter, Mode};

use crate::histogram::Histogram;
use crate::redis_util;

/// What `bench` takes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Redis URL (one server).
    pub redis: String,
    /// Threads calling `acquire`.
    pub threads: usize,
    /// Run time per mode (ms).
    pub duration_ms: u64,
    /// Distinct keys, spread over the threads.
    pub keys: u64,
    /// Tokens per window.
    pub limit: u64,
    /// Window (ms).
    pub window_ms: u64,
    /// Tokens per lease (`None`: the library default).
    pub lease_size: Option<u64>,
}

/// One mode's figures.
#[derive(Clone, Debug)]
pub struct ModeResult {
    /// `lease` or `exact`.
    pub mode: Mode,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// `acquire` latency (ns).
    pub latency: Histogram,
    /// Redis command calls during the run, by command (connection set-up and INFO excluded).
    pub commands: BTreeMap<String, u64>,
}

impl ModeResult {
    /// Admitted per second.
    pub fn admitted_per_s(&self) -> f64 {
        self.admitted as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Round trips' worth of client commands (scripts: EVALSHA, EVAL, ...)
    /// per admitted request.
    pub fn calls_per_admitted(&self) -> f64 {
        self.commands
            .iter()
            .filter(|(c, _)| is_client_call(c))
            .map(|(_, n)| n)
            .sum::<u64>() as f64
            / self.admitted.max(1) as f64
    }
    /// Every command Redis ran (scripts and the commands inside them) per admitted request.
    pub fn commands_per_admitted(&self) -> f64 {
        self.commands.values().sum::<u64>() as f64 / self.admitted.max(1) as f64
    }
}

/// Commands a client sends (the limiter's scripts); the others in
/// commandstats ran inside those scripts.
fn is_client_call(cmd: &str) -> bool {
    cmd.starts_with("eval") || cmd.starts_with("fcall") || cmd.starts_with("script")
}

/// Commands that are not the limiter's work.
fn ignored(cmd: &str) -> bool {
    cmd == "info" || cmd == "ping" || cmd == "hello" || cmd == "select" || cmd == "auth" || cmd.starts_with("client")
}

fn config(o: &Options, mode: Mode) -> Config {
    Config {
        url: o.redis.clone(),
        limit: o.limit,
        window_ms: o.window_ms,
        lease_size: o.lease_size,
        mode,
        key_prefix: format!("qlbench{}x{}", std::process::id(), mode.as_str()),
        ..Config::default()
    }
}

fn run_mode(o: &Options, mode: Mode) -> Result<ModeResult, String> {
    let mut conn = redis_util::connect(&o.redis)?;
    let limiter = Arc::new(Limiter::new(config(o, mode)).map_err(crate::explain)?);
    let keys: Arc<Vec<String>> = Arc::new((0..o.keys).map(|i| format!("bench:{i}")).collect());
    let before = redis_util::commandstats(&mut conn)?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(o.duration_ms);
    let handles: Vec<_> = (0..o.threads)
        .map(|t| {
            let (limiter, keys, stop) = (limiter.clone(), keys.clone(), stop.clone());
            std::thread::spawn(move || -> Result<(u64, u64, Histogram), String> {
                let mut h = Histogram::default();
                let (mut admitted, mut denied) = (0u64, 0u64);
                let n = keys.len();
                let mut i = t % n;
                loop {
                    let t0 = Instant::now();
                    let d = limiter.acquire(&keys[i], 1).map_err(crate::explain)?;
                    let t1 = Instant::now();
                    h.record((t1 - t0).as_nanos() as u64);
                    if d.allowed {
                        admitted += 1;
                    } else {
                        denied += 1;
                    }
                    i = (i + 1) % n;
                    if t1 >= deadline || stop.load(Ordering::Relaxed) {
                        return Ok((admitted, denied, h));
                    }
                }
            })
        })
        .collect();
    let mut res = ModeResult {
        mode,
        admitted: 0,
        denied: 0,
        elapsed: Duration::ZERO,
        latency: Histogram::default(),
        commands: BTreeMap::new(),
    };
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok((a, d, hist))) => {
                res.admitted += a;
                res.denied += d;
                res.latency.merge(&hist);
            }
            Ok(Err(e)) => {
                stop.store(true, Ordering::Relaxed);
                failure = Some(e);
            }
            Err(_) => failure = Some("a benchmark thread panicked".into()),
        }
    }
    res.elapsed = start.elapsed();
    let after = redis_util::commandstats(&mut conn)?;
    let _ = limiter.close();
    if let Some(e) = failure {
        return Err(e);
    }
    for (cmd, calls) in after {
        let d = calls.saturating_sub(before.get(&cmd).copied().unwrap_or(0));
        if d > 0 && !ignored(&cmd) {
            res.commands.insert(cmd, d);
        }
    }
    Ok(res)
}

fn dur(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else {
        format!("{:.2} ms", ns as f64 / 1e6)
    }
}

/// Run both modes; the results, lease first.
pub fn measure(o: &Options) -> Result<Vec<ModeResult>, String> {
    Limiter::new(config(o, Mode::Lease)).map_err(crate::explain)?;
    redis_util::connect(&o.redis)?;
    Ok(vec![run_mode(o, Mode::Lease)?, run_mode(o, Mode::Exact)?])
}

/// Run both modes and describe them.
pub fn run(o: &Options) -> Result<String, String> {
    let results = measure(o)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "quotalease bench: {} threads x {:.1} s per mode, {} keys, limit {} per {} ms, against {}",
        o.threads,
        o.duration_ms as f64 / 1000.0,
        o.keys,
        o.limit,
        o.window_ms,
        o.redis
    );
    let mut rows = vec![
        vec![
            "mode".to_string(),
            "admitted/s".into(),
            "denied".into(),
            "p50".into(),
            "p99".into(),
            "script calls".into(),
            "all commands".into(),
        ],
        vec![
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            "per admitted".into(),
            "per admitted".into(),
        ],
    ];
    for r in &results {
        rows.push(vec![
            r.mode.as_str().to_string(),
            format!("{:.0}", r.admitted_per_s()),
            r.denied.to_string(),
            dur(r.latency.quantile(0.5)),
            dur(r.latency.quantile(0.99)),
            format!("{:.4}", r.calls_per_admitted()),
            format!("{:.4}", r.commands_per_admitted()),
        ]);
    }
    out.push_str(&crate::report::table(&rows));
    for r in &results {
        let by: Vec<String> = r.commands.iter().map(|(c, n)| format!("{c} {n}")).collect();
        let _ = writeln!(out, "  {} commands: {}", r.mode.as_str(), by.join(", "));
    }
    let (l, e) = (&results[0], &results[1]);
    let _ = writeln!(
        out,
        "lease vs exact: {:.1}x the admitted/s, p50 {:.4}x, p99 {:.4}x, {:.1}x fewer script calls per admitted request",
        l.admitted_per_s() / e.admitted_per_s().max(1e-9),
        l.latency.quantile(0.5) as f64 / e.latency.quantile(0.5).max(1) as f64,
        l.latency.quantile(0.99) as f64 / e.latency.quantile(0.99).max(1) as f64,
        e.calls_per_admitted() / l.calls_per_admitted().max(1e-9)
    );
    let _ = writeln!(
        out,
        "(INFO commandstats before/after each run: script calls are EVALSHA/EVAL round trips; all commands\n \
         also counts those the scripts ran; other clients of this Redis would add to both)"
    );
    Ok(out)
}
