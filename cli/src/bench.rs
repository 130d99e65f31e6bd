//! `quotalease bench`: N threads deciding requests against one real Redis
//! with three strategies, one after the other in one run, on the same offered
//! load (the same key sequence on each thread):
//! - `lease`: quotalease in lease mode (one `Limiter` shared by the threads);
//! - `exact`: quotalease in exact mode (one script call per request);
//! - `gcra`: a per-request GCRA Lua script ([`crate::gcra`]), the common
//!   Redis design, each thread with its own synchronous connection.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use quotalease::{Builder, Limiter, Mode};

use crate::dist::{self, Dist, KeySeq};
use crate::gcra::Gcra;
use crate::histogram::Histogram;
use crate::redis_util;

/// What `bench` takes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Redis URL (one server).
    pub redis: String,
    /// Threads deciding requests.
    pub threads: usize,
    /// Run time per strategy and distribution (ms).
    pub duration_ms: u64,
    /// Distinct keys (`--dist hot` uses one).
    pub keys: u64,
    /// Tokens per window.
    pub limit: u64,
    /// Window (ms).
    pub window_ms: u64,
    /// Tokens per lease (`None`: the library default).
    pub lease_size: Option<u64>,
    /// Prefetch threshold (`None`: the library default).
    pub refill_threshold: Option<u64>,
    /// Key distributions, each run with every strategy.
    pub dists: Vec<Dist>,
    /// Seed of the Zipf key sequences.
    pub seed: u64,
}

/// How requests are decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// quotalease, lease mode.
    Lease,
    /// quotalease, exact mode.
    Exact,
    /// Per-request GCRA Lua script.
    Gcra,
}

impl Strategy {
    /// In the order they run.
    pub const ALL: [Strategy; 3] = [Strategy::Lease, Strategy::Exact, Strategy::Gcra];

    /// Short name (the table's first column).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Lease => "lease",
            Strategy::Exact => "exact",
            Strategy::Gcra => "gcra",
        }
    }

    /// What it is, in a few words.
    pub fn about(self) -> &'static str {
        match self {
            Strategy::Lease => "quotalease, lease mode",
            Strategy::Exact => "quotalease, exact mode",
            Strategy::Gcra => "per-request GCRA Lua script",
        }
    }
}

/// One strategy's figures on one distribution.
#[derive(Clone, Debug)]
pub struct StrategyResult {
    /// Which.
    pub strategy: Strategy,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Decision latency (ns).
    pub latency: Histogram,
    /// Redis command calls during the run, by command (connection set-up and INFO excluded).
    pub commands: BTreeMap<String, u64>,
    /// Most tokens admitted above the authoritative allowance (instances x lease_size; 0 if exact).
    pub bound: u64,
}

impl StrategyResult {
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

/// Every strategy on one distribution.
#[derive(Clone, Debug)]
pub struct DistResult {
    /// The distribution.
    pub dist: Dist,
    /// Keys it touched.
    pub keys: u64,
    /// In [`Strategy::ALL`] order.
    pub results: Vec<StrategyResult>,
}

impl DistResult {
    /// The result of `s`.
    pub fn get(&self, s: Strategy) -> &StrategyResult {
        self.results
            .iter()
            .find(|r| r.strategy == s)
            .expect("every strategy runs")
    }

    /// `lease` against the better of the per-request designs (exact, gcra):
    /// (fewer script calls, fewer commands, throughput) factors.
    pub fn lease_vs_per_request(&self) -> (f64, f64, f64) {
        let l = self.get(Strategy::Lease);
        let others = [self.get(Strategy::Exact), self.get(Strategy::Gcra)];
        let calls = others
            .iter()
            .map(|o| o.calls_per_admitted() / l.calls_per_admitted().max(1e-12))
            .fold(f64::INFINITY, f64::min);
        let cmds = others
            .iter()
            .map(|o| o.commands_per_admitted() / l.commands_per_admitted().max(1e-12))
            .fold(f64::INFINITY, f64::min);
        let thr = others
            .iter()
            .map(|o| l.admitted_per_s() / o.admitted_per_s().max(1e-9))
            .fold(f64::INFINITY, f64::min);
        (calls, cmds, thr)
    }
}

/// A whole run.
#[derive(Clone, Debug)]
pub struct Bench {
    /// What was asked.
    pub options: Options,
    /// The lease size lease mode used.
    pub lease_size: u64,
    /// The refill threshold lease mode used.
    pub refill_threshold: u64,
    /// One per distribution, in the order asked.
    pub dists: Vec<DistResult>,
}

/// The goals for lease mode against every per-request design.
pub const GOAL_FEWER_COMMANDS: f64 = 20.0;
/// See [`GOAL_FEWER_COMMANDS`].
pub const GOAL_THROUGHPUT: f64 = 10.0;

/// Commands a client sends (the limiters' scripts); the others in
/// commandstats ran inside those scripts.
fn is_client_call(cmd: &str) -> bool {
    cmd.starts_with("eval") || cmd.starts_with("fcall") || cmd.starts_with("script")
}

/// Commands that are not the limiters' work.
fn ignored(cmd: &str) -> bool {
    cmd == "info" || cmd == "ping" || cmd == "hello" || cmd == "select" || cmd == "auth" || cmd.starts_with("client")
}

fn prefix(dist: Dist, s: Strategy) -> String {
    format!("qlbench{}x{}x{}", std::process::id(), dist.as_str(), s.as_str())
}

fn config(o: &Options, mode: Mode, key_prefix: String) -> Builder {
    let mut b = Limiter::builder()
        .url(o.redis.clone())
        .limit(o.limit)
        .window_ms(o.window_ms)
        .mode(mode)
        .key_prefix(key_prefix)
        // The bench counts Redis commands per admitted request of the lease
        // protocol alone: no policy store polls (one script call a second).
        .policy_refresh_ms(0);
    if let Some(n) = o.lease_size {
        b = b.lease_size(n);
    }
    if let Some(n) = o.refill_threshold {
        b = b.refill_threshold(n);
    }
    b
}

type Tally = (u64, u64, Histogram);

/// A thread that decides request after request until the deadline.
fn worker<F>(
    seq: Arc<KeySeq>,
    deadline: Instant,
    stop: Arc<AtomicBool>,
    mut decide: F,
) -> JoinHandle<Result<Tally, String>>
where
    F: FnMut(usize) -> Result<bool, String> + Send + 'static,
{
    std::thread::spawn(move || {
        let mut h = Histogram::default();
        let (mut admitted, mut denied) = (0u64, 0u64);
        let mut i = 0u64;
        loop {
            let key = seq.at(i);
            let t0 = Instant::now();
            let allowed = decide(key)?;
            let t1 = Instant::now();
            h.record((t1 - t0).as_nanos() as u64);
            if allowed {
                admitted += 1;
            } else {
                denied += 1;
            }
            i += 1;
            if t1 >= deadline || stop.load(Ordering::Relaxed) {
                return Ok((admitted, denied, h));
            }
        }
    })
}

fn run_strategy(
    o: &Options,
    dist: Dist,
    seqs: &[Arc<KeySeq>],
    s: Strategy,
    lease_size: u64,
) -> Result<StrategyResult, String> {
    let mut conn = redis_util::connect(&o.redis)?;
    let n = dist.keys(o.keys);
    let pre = prefix(dist, s);
    let mut limiter = None;
    let mut gcra_conns = Vec::new();
    let gcra = Gcra::new(o.limit, o.window_ms)?;
    let keys: Arc<Vec<String>> = Arc::new(match s {
        Strategy::Lease | Strategy::Exact => {
            let mode = if s == Strategy::Lease { Mode::Lease } else { Mode::Exact };
            limiter = Some(Arc::new(config(o, mode, pre).build().map_err(crate::explain)?));
            (0..n).map(|i| format!("bench:{i}")).collect()
        }
        Strategy::Gcra => {
            gcra.load(&mut conn)?;
            for _ in 0..o.threads {
                gcra_conns.push(redis_util::connect(&o.redis)?);
            }
            (0..n).map(|i| format!("{pre}:{{bench:{i}}}")).collect()
        }
    });
    let before = redis_util::commandstats(&mut conn)?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(o.duration_ms);
    let handles: Vec<_> = (0..o.threads)
        .map(|t| {
            let (seq, stop, keys) = (seqs[t].clone(), stop.clone(), keys.clone());
            match &limiter {
                Some(l) => {
                    let l = l.clone();
                    worker(seq, deadline, stop, move |k| {
                        l.acquire(&keys[k], 1).map(|d| d.allowed).map_err(crate::explain)
                    })
                }
                None => {
                    let (g, mut c) = (gcra.clone(), gcra_conns.pop().expect("one connection per thread"));
                    worker(seq, deadline, stop, move |k| {
                        g.acquire(&mut c, &keys[k], 1).map(|d| d.allowed)
                    })
                }
            }
        })
        .collect();
    let mut res = StrategyResult {
        strategy: s,
        admitted: 0,
        denied: 0,
        elapsed: Duration::ZERO,
        latency: Histogram::default(),
        commands: BTreeMap::new(),
        bound: if s == Strategy::Lease { lease_size } else { 0 },
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
    if let Some(l) = limiter {
        let _ = l.close();
    }
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

/// Check the options, then run every distribution with every strategy.
pub fn measure(o: &Options) -> Result<Bench, String> {
    if o.dists.is_empty() {
        return Err("--dist needs at least one of round-robin, hot, zipf".into());
    }
    for (i, d) in o.dists.iter().enumerate() {
        if o.dists[..i].contains(d) {
            return Err(format!("--dist lists {} twice", d.as_str()));
        }
    }
    if o.dists.contains(&Dist::Zipf) && o.keys < 2 {
        return Err("--dist zipf needs --keys of at least 2 (one key is --dist hot)".into());
    }
    // Every configuration error before the first connection.
    config(o, Mode::Lease, prefix(Dist::Hot, Strategy::Lease))
        .build()
        .map_err(crate::explain)?;
    Gcra::new(o.limit, o.window_ms)?;
    redis_util::connect(&o.redis)?;
    let lease_size = o.lease_size.unwrap_or_else(|| quotalease::default_lease_size(o.limit));
    let refill_threshold = o.refill_threshold.unwrap_or((lease_size / 4).max(1));
    let mut dists = Vec::new();
    for &d in &o.dists {
        let seqs: Vec<Arc<KeySeq>> = dist::sequences(d, o.keys, o.threads, o.seed)
            .into_iter()
            .map(Arc::new)
            .collect();
        let mut results = Vec::new();
        for s in Strategy::ALL {
            results.push(run_strategy(o, d, &seqs, s, lease_size)?);
        }
        dists.push(DistResult {
            dist: d,
            keys: d.keys(o.keys),
            results,
        });
    }
    Ok(Bench {
        options: o.clone(),
        lease_size,
        refill_threshold,
        dists,
    })
}

/// A duration in ns, µs or ms.
pub fn dur(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else {
        format!("{:.2} ms", ns as f64 / 1e6)
    }
}

/// A factor: one decimal from 1 up, two significant digits below 1.
fn ratio(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}x")
    } else if x >= 1.0 || x <= 0.0 {
        format!("{x:.1}x")
    } else {
        let digits = (1 - x.log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}x")
    }
}

/// A factor with two decimals, rounded down, so that a factor just under a
/// goal never reads as the goal.
fn exact_ratio(x: f64) -> String {
    format!("{:.2}x", (x * 100.0 + 1e-9).floor() / 100.0)
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

impl Bench {
    /// The run's parameters in one line.
    pub fn headline(&self) -> String {
        let o = &self.options;
        format!(
            "{} threads x {:.1} s per strategy and distribution, limit {} per {} ms, lease_size {} (refill_threshold {}), against {}",
            o.threads,
            o.duration_ms as f64 / 1000.0,
            o.limit,
            o.window_ms,
            self.lease_size,
            self.refill_threshold,
            quotalease::RedactedUrl(&o.redis)
        )
    }

    fn rows(&self, d: &DistResult) -> Vec<Vec<String>> {
        let g = d.get(Strategy::Gcra);
        d.results
            .iter()
            .map(|r| {
                vec![
                    r.strategy.as_str().to_string(),
                    r.admitted.to_string(),
                    format!("{:.0}", r.admitted_per_s()),
                    r.denied.to_string(),
                    dur(r.latency.quantile(0.5)),
                    dur(r.latency.quantile(0.99)),
                    r.bound.to_string(),
                    format!("{:.4}", r.calls_per_admitted()),
                    format!("{:.4}", r.commands_per_admitted()),
                    ratio(r.admitted_per_s() / g.admitted_per_s().max(1e-9)),
                    ratio(g.commands_per_admitted() / r.commands_per_admitted().max(1e-12)),
                ]
            })
            .collect()
    }

    fn goals(&self, d: &DistResult) -> String {
        let (calls, cmds, thr) = d.lease_vs_per_request();
        format!(
            "goals for lease (lease_size {}) against every per-request design (exact, gcra): \
             >= {GOAL_FEWER_COMMANDS:.0}x fewer Redis commands per admitted request: {} for round trips ({}), {} for all commands ({}); \
             >= {GOAL_THROUGHPUT:.0}x the admitted/s: {} ({})",
            self.lease_size,
            met(calls >= GOAL_FEWER_COMMANDS),
            exact_ratio(calls),
            met(cmds >= GOAL_FEWER_COMMANDS),
            exact_ratio(cmds),
            met(thr >= GOAL_THROUGHPUT),
            exact_ratio(thr),
        )
    }

    fn pair(a: &StrategyResult, b: &StrategyResult) -> String {
        format!(
            "{} vs {}: {} the admitted/s, p50 {}, p99 {}, {} fewer script calls and {} fewer commands per admitted request",
            a.strategy.as_str(),
            b.strategy.as_str(),
            ratio(a.admitted_per_s() / b.admitted_per_s().max(1e-9)),
            ratio(a.latency.quantile(0.5) as f64 / b.latency.quantile(0.5).max(1) as f64),
            ratio(a.latency.quantile(0.99) as f64 / b.latency.quantile(0.99).max(1) as f64),
            ratio(b.calls_per_admitted() / a.calls_per_admitted().max(1e-12)),
            ratio(b.commands_per_admitted() / a.commands_per_admitted().max(1e-12)),
        )
    }

    /// The report as aligned text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "quotalease bench: {}", self.headline());
        for s in Strategy::ALL {
            let _ = writeln!(out, "  {:<5} = {}", s.as_str(), s.about());
        }
        for d in &self.dists {
            let _ = writeln!(out, "\n{}: {}", d.dist.as_str(), d.dist.describe(d.keys));
            let mut rows = vec![
                [
                    "strategy",
                    "admitted",
                    "admitted/s",
                    "denied",
                    "p50",
                    "p99",
                    "overshoot",
                    "script calls",
                    "all commands",
                    "admitted/s",
                    "fewer commands",
                ]
                .map(String::from)
                .to_vec(),
                [
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "bound",
                    "per admitted",
                    "per admitted",
                    "vs gcra",
                    "than gcra",
                ]
                .map(String::from)
                .to_vec(),
            ];
            rows.extend(self.rows(d));
            out.push_str(&crate::report::table(&rows));
            for r in &d.results {
                let by: Vec<String> = r.commands.iter().map(|(c, n)| format!("{c} {n}")).collect();
                let _ = writeln!(out, "  {} commands: {}", r.strategy.as_str(), by.join(", "));
            }
            let (l, e, g) = (d.get(Strategy::Lease), d.get(Strategy::Exact), d.get(Strategy::Gcra));
            let _ = writeln!(out, "{}", Self::pair(l, g));
            let _ = writeln!(out, "{}", Self::pair(e, g));
            let _ = writeln!(out, "{}", Self::pair(l, e));
            let _ = writeln!(out, "{}", self.goals(d));
        }
        let _ = writeln!(
            out,
            "\n(INFO commandstats before/after each run: script calls are EVALSHA/EVAL/SCRIPT round trips; all commands\n \
             also counts those the scripts ran; other clients of this Redis would add to both. Overshoot bound:\n \
             tokens admitted above the allowance at most, instances (1 here) x lease_size for lease, 0 for exact and gcra)"
        );
        out
    }

    /// The report as Markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Run: {}.\n", self.headline());
        for d in &self.dists {
            let _ = writeln!(out, "**{}**: {}\n", d.dist.as_str(), d.dist.describe(d.keys));
            let _ = writeln!(
                out,
                "| strategy | admitted | admitted/s | denied | p50 | p99 | overshoot bound | script calls / admitted | all commands / admitted | admitted/s vs gcra | fewer commands than gcra |"
            );
            let _ = writeln!(
                out,
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            );
            for (r, mut row) in d.results.iter().zip(self.rows(d)) {
                row[0] = format!("{} ({})", r.strategy.as_str(), r.strategy.about());
                let _ = writeln!(out, "| {} |", row.join(" | "));
            }
            let _ = writeln!(out);
            let by: Vec<String> = d
                .results
                .iter()
                .map(|r| {
                    let c: Vec<String> = r.commands.iter().map(|(c, n)| format!("{c} {n}")).collect();
                    format!("{}: {}", r.strategy.as_str(), c.join(", "))
                })
                .collect();
            let _ = writeln!(out, "Commands (INFO commandstats): {}.\n", by.join("; "));
            let _ = writeln!(out, "{}.\n", capitalise(&self.goals(d)));
        }
        out
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Run and describe.
pub fn run(o: &Options, markdown: bool) -> Result<(Bench, String), String> {
    let b = measure(o)?;
    let out = if markdown { b.markdown() } else { b.text() };
    Ok((b, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors() {
        assert_eq!(ratio(150.2), "150x");
        assert_eq!(ratio(12.84), "12.8x");
        assert_eq!(ratio(0.8), "0.80x");
        assert_eq!(ratio(0.053), "0.053x");
        assert_eq!(ratio(0.00071), "0.00071x");
        assert_eq!(exact_ratio(19.996), "19.99x");
        assert_eq!(exact_ratio(20.0), "20.00x");
        assert_eq!(exact_ratio(19.99), "19.99x");
        assert_eq!(capitalise("goals"), "Goals");
        assert!(is_client_call("evalsha") && is_client_call("script|load") && !is_client_call("get"));
    }
}
