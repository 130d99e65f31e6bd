//! Adaptive leasing against fixed leases, side by side in one run, on a real
//! Redis (issue 12's benchmark targets). `make bench-adaptive` starts a
//! redis-server and runs this; by hand:
//!
//! ```text
//! cargo run --release -p quotalease --example adaptive_bench -- redis://127.0.0.1:6379 [seconds]
//! ```
//!
//! 1. Hot key: one limiter, 4 threads, one key, a limit that never binds:
//!    admitted/s on Redis against the same on `memory://`, and Redis calls per
//!    admitted request.
//! 2. Fleet: 100 limiters (one thread each, the fleet's instances) on one key
//!    limited to 1000/s, offered 0.8x and 1.5x the limit in Poisson arrivals:
//!    denied share, admitted against the allowance (+ budget), calls per admitted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use quotalease::{Limiter, Metrics};

fn limiter(url: &str, prefix: &str, limit: u64, window_ms: u64, fixed: bool) -> Limiter {
    let b = Limiter::builder()
        .url(url)
        .key_prefix(prefix)
        .limit(limit)
        .window_ms(window_ms);
    let b = if fixed {
        b.lease_size(quotalease::default_lease_size(limit))
    } else {
        b
    };
    b.build().expect("limiter")
}

fn sum(ms: impl Iterator<Item = Metrics>) -> Metrics {
    ms.fold(Metrics::default(), |mut a, m| {
        a.admitted += m.admitted;
        a.denied += m.denied;
        a.backend_calls += m.backend_calls;
        a
    })
}

/// One limiter, `threads` threads hammering one key for `secs`.
fn hot(url: &str, prefix: &str, fixed: bool, threads: usize, secs: f64) -> (f64, f64) {
    let l = Arc::new(limiter(url, prefix, 1 << 32, 1_000, fixed));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let (l, stop, start) = (l.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                while !stop.load(Relaxed) {
                    for _ in 0..256 {
                        std::hint::black_box(l.acquire("hot", 1).unwrap());
                    }
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let m = l.metrics();
    (
        m.admitted as f64 / elapsed,
        m.backend_calls as f64 / m.admitted.max(1) as f64,
    )
}

struct FleetRun {
    offered: u64,
    admitted: u64,
    denied: u64,
    calls: u64,
    allowance: u64,
    /// Calls and admitted in the first 3 s (the full bucket handed out).
    early: (u64, u64),
    /// Denials by reason: exhausted (decided locally), pending (a lease
    /// still in flight when the wait ended).
    denied_by: (u64, u64),
}

/// `n` limiters, one thread each, Poisson arrivals at `load` x the limit in
/// total (uneven: every fourth instance gets 4x), for `secs`.
fn fleet(url: &str, prefix: &str, fixed: bool, n: usize, load: f64, secs: f64) -> FleetRun {
    const LIMIT: u64 = 1_000;
    let ls: Vec<Arc<Limiter>> = (0..n)
        .map(|_| Arc::new(limiter(url, prefix, LIMIT, 1_000, fixed)))
        .collect();
    let weights: Vec<f64> = (0..n).map(|i| if i % 4 == 0 { 4.0 } else { 1.0 }).collect();
    let total_w: f64 = weights.iter().sum();
    let offered = Arc::new(AtomicU64::new(0));
    // denials: [exhausted (local), pending (a lease in flight past the wait)]
    let denied_by = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let start = Arc::new(Barrier::new(n + 1));
    let t0 = Instant::now() + Duration::from_millis(200);
    let hs: Vec<_> = ls
        .iter()
        .zip(&weights)
        .enumerate()
        .map(|(i, (l, w))| {
            let (l, offered, start) = (l.clone(), offered.clone(), start.clone());
            let denied_by = denied_by.clone();
            let rate = LIMIT as f64 * load * w / total_w; // per second
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
                let mut next = t0;
                start.wait();
                let end = t0 + Duration::from_secs_f64(secs);
                loop {
                    // exponential gaps
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let u = ((x >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                    next += Duration::from_secs_f64(-u.ln() / rate);
                    if next >= end {
                        break;
                    }
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    offered.fetch_add(1, Relaxed);
                    let d = l.acquire("k", 1).unwrap();
                    if !d.allowed {
                        let slot = if d.reason == quotalease::Reason::Pending { 1 } else { 0 };
                        denied_by[slot].fetch_add(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    start.wait();
    if std::env::var("ADAPTIVE_TRACE").is_ok() {
        // the key as instance 0 and the authority see it, every 500 ms
        for k in 1..(secs * 2.0) as u64 {
            std::thread::sleep((t0 + Duration::from_millis(500 * k)).saturating_duration_since(Instant::now()));
            let i = ls[0].inspect("k").unwrap();
            let rates = ls
                .iter()
                .filter(|l| l.inspect("k").is_ok_and(|i| i.rate_per_window > 0))
                .count();
            let m = sum(ls.iter().map(|l| l.metrics()));
            eprintln!(
                "t={}ms bucket {:?} holders {} on rates {rates} admitted {} denied {} calls {}",
                500 * k,
                i.authority_tokens,
                i.holders,
                m.admitted,
                m.denied,
                m.backend_calls
            );
        }
    }
    let early_at = t0 + Duration::from_secs_f64(3.0_f64.min(secs));
    std::thread::sleep(early_at.saturating_duration_since(Instant::now()));
    let e = sum(ls.iter().map(|l| l.metrics()));
    for h in hs {
        h.join().unwrap();
    }
    let m = sum(ls.iter().map(|l| l.metrics()));
    FleetRun {
        early: (e.backend_calls, e.admitted),
        denied_by: (denied_by[0].load(Relaxed), denied_by[1].load(Relaxed)),
        offered: offered.load(Relaxed),
        admitted: m.admitted,
        denied: m.denied,
        calls: m.backend_calls,
        allowance: LIMIT + (LIMIT as f64 * secs) as u64,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: adaptive_bench REDIS_URL [seconds]");
    let secs: f64 = args.next().map_or(5.0, |s| s.parse().expect("seconds"));
    // Optional: which cases ("hot", "fleet"), which loads, which leases.
    let only: Vec<String> = args.collect();
    let wants = |case: &str| only.is_empty() || only.iter().any(|o| o == case);
    let run = std::process::id();
    if wants("hot") {
        println!("## hot key: 1 limiter, 4 threads, one key, a limit that never binds ({secs} s each)");
        println!(
            "{:<10} {:>16} {:>16} {:>8} {:>18}",
            "leases", "memory adm/s", "redis adm/s", "ratio", "redis calls/adm"
        );
        for (name, fixed) in [("fixed", true), ("adaptive", false)] {
            let (mem, _) = hot("memory://", "m", fixed, 4, secs);
            let (red, calls) = hot(&url, &format!("hot{run}{name}"), fixed, 4, secs);
            println!(
                "{name:<10} {mem:>16.0} {red:>16.0} {:>7.1}% {calls:>18.5}",
                100.0 * red / mem
            );
        }
        println!();
    }
    if !wants("fleet") {
        return;
    }
    println!("## fleet: 100 limiters (a thread each) on one key, limit 1000/s, Poisson arrivals, every 4th instance 4x ({secs} s each)");
    println!(
        "{:<10} {:>5} {:>9} {:>9} {:>9} {:>10} {:>12} {:>10} {:>14} {:>16}",
        "leases",
        "load",
        "offered",
        "admitted",
        "denied %",
        "allowance",
        "adm/allow",
        "calls/adm",
        "first 3 s",
        "exhausted/pending"
    );
    for load in [0.8, 1.5] {
        if !(wants("fleet") && (only.len() <= 1 || wants(&format!("{load}")))) {
            continue;
        }
        for (name, fixed) in [("fixed", true), ("adaptive", false)] {
            if only.iter().any(|o| o == "adaptive") && fixed {
                continue;
            }
            let r = fleet(&url, &format!("fleet{run}{name}{load}"), fixed, 100, load, secs);
            println!(
                "{name:<10} {load:>5.1} {:>9} {:>9} {:>8.2}% {:>10} {:>12.3} {:>10.4} {:>14} {:>16}",
                r.offered,
                r.admitted,
                100.0 * r.denied as f64 / r.offered.max(1) as f64,
                r.allowance,
                r.admitted as f64 / r.allowance as f64,
                r.calls as f64 / r.admitted.max(1) as f64,
                format!("{}/{}", r.early.0, r.early.1),
                format!("{}/{}", r.denied_by.0, r.denied_by.1)
            );
        }
    }
}
