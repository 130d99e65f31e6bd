//! Key flood (issue 13, item 5): distinct keys at full speed against a
//! limiter's `max_keys`, sampling this process' RSS and `keys_tracked`, with
//! one warm key's hot path timed before, during and after the flood in the
//! same run. Run by `make flood` (docs/reliability.md has the record).
//!
//! Usage: key_flood [--keys N] [--max-keys N] [--threads N] [--url URL] [--seconds S]
//!   --keys      distinct keys to drive (default 10 000 000)
//!   --max-keys  the limiter's max_keys (default 100 000)
//!   --threads   flood threads (default: cores - 1, at least 1; one more
//!               thread times the warm key during the flood)
//!   --url       memory:// (default) or a redis:// URL
//!   --seconds   stop the flood after this long even if keys remain (default 600)
//!   --lease-size  fixed leases of this size (default: adaptive leasing)
//!   --window-ms   the flood keys' window: 100 tokens per this many ms (default 1000)
//!
//! Flood keys have a policy of 100 per `--window-ms`; the warm key has a
//! limit high enough never to run dry, so its timing is the hot path alone.
//! Exits 1 (after printing everything) when the table ever held more than
//! `max_keys`, when RSS kept growing over the second half of the flood (more
//! than 5 % above its level at the half-way point), or when the books do not
//! balance.
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quotalease::Limiter;

const WARM: &str = "warm-key";
/// Acquires per timed batch of the warm key.
const BATCH: u64 = 20_000;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(name: &str, default: u64) -> u64 {
    arg(name).map_or(default, |v| {
        v.replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
    })
}

/// This process' resident set, in KiB (/proc/self/status VmRSS).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux only)");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Warm-key acquires that were not admitted (on Redis, a refill of its
/// lease that took longer than the backend timeout is denied `pending`).
static WARM_DENIED: AtomicU64 = AtomicU64::new(0);

/// ns per acquire of the warm key in one batch.
fn warm_batch(l: &Limiter) -> f64 {
    let t = Instant::now();
    for _ in 0..BATCH {
        if !l.acquire(black_box(WARM), 1).unwrap().allowed {
            WARM_DENIED.fetch_add(1, Relaxed);
        }
    }
    t.elapsed().as_nanos() as f64 / BATCH as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty());
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The warm key timed on an otherwise quiet limiter: median of `n` batches.
fn warm_quiet(l: &Limiter, n: usize) -> f64 {
    for _ in 0..5 {
        warm_batch(l); // caches and branch predictors
    }
    median((0..n).map(|_| warm_batch(l)).collect())
}

struct Sample {
    secs: f64,
    keys_done: u64,
    rss_kib: u64,
    keys_tracked: u64,
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let keys = num("--keys", 10_000_000);
    let max_keys = num("--max-keys", 100_000);
    let threads = num("--threads", cores.saturating_sub(1).max(1));
    let seconds = num("--seconds", 600);
    let url = arg("--url").unwrap_or_else(|| "memory://".into());
    let window_ms = num("--window-ms", 1_000);
    let lease_size = arg("--lease-size").map(|_| num("--lease-size", 0));
    let mut b = Limiter::builder()
        .url(url.clone())
        .key_prefix(format!("flood{}", std::process::id()))
        .limit(100)
        .window_ms(window_ms)
        .max_keys(max_keys as usize);
    if let Some(n) = lease_size {
        b = b.lease_size(n);
    }
    let l = Arc::new(b.build().unwrap());
    // 2^40 tokens per second: never dry, so the warm key's timing is the
    // hot path (local tokens, no authority call in the batch).
    l.set_limit(WARM, 1 << 40, 1_000).unwrap();
    l.acquire(WARM, 1).unwrap();
    println!(
        "key flood: {keys} distinct keys, max_keys {max_keys}, {threads} flood thread(s) + 1 timing the warm key, \
         {cores} cores, url {}, {}, flood keys 100 per {window_ms} ms",
        quotalease::RedactedUrl(&url),
        lease_size.map_or("adaptive leasing".into(), |n| format!("fixed leases of {n}"))
    );
    let rss_start = rss_kib();
    let before = warm_quiet(&l, 50);
    println!(
        "warm key before the flood: {before:.1} ns/acquire (median of 50 batches of {BATCH}); RSS {rss_start} KiB"
    );

    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let flooders: Vec<_> = (0..threads)
        .map(|_| {
            let (l, next, done, stop, errors) = (l.clone(), next.clone(), done.clone(), stop.clone(), errors.clone());
            std::thread::spawn(move || {
                let mut key = String::with_capacity(32);
                'outer: while !stop.load(Relaxed) {
                    // Take key numbers in runs of 1024: little contention.
                    let from = next.fetch_add(1024, Relaxed);
                    if from >= keys {
                        break;
                    }
                    for i in from..(from + 1024).min(keys) {
                        key.clear();
                        write!(key, "flood:{i}").unwrap();
                        if l.acquire(&key, 1).is_err() {
                            errors.fetch_add(1, Relaxed);
                        }
                        if i % 4096 == 0 && stop.load(Relaxed) {
                            break 'outer;
                        }
                    }
                    done.fetch_add((from + 1024).min(keys) - from, Relaxed);
                }
            })
        })
        .collect();
    // The sampler: RSS and the table's size every 100 ms.
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let (l, done, stop, samples) = (l.clone(), done.clone(), stop.clone(), samples.clone());
        std::thread::spawn(move || {
            let mut max_tracked = 0;
            // A row every tenth of the keys, or every 30 s.
            let (mut next_keys, mut next_secs) = (0, 0.0);
            println!("\n  seconds  keys driven  keys_tracked  RSS KiB");
            while !stop.load(Relaxed) {
                let keys_tracked = l.metrics().keys_tracked;
                max_tracked = keys_tracked.max(max_tracked);
                let s = Sample {
                    secs: started.elapsed().as_secs_f64(),
                    keys_done: done.load(Relaxed),
                    rss_kib: rss_kib(),
                    keys_tracked,
                };
                if s.keys_done >= next_keys || s.secs >= next_secs {
                    println!(
                        "  {:>7.1}  {:>11}  {:>12}  {:>7}",
                        s.secs, s.keys_done, s.keys_tracked, s.rss_kib
                    );
                    next_keys = s.keys_done + keys / 10;
                    next_secs = s.secs + 30.0;
                }
                samples.lock().unwrap().push(s);
                std::thread::sleep(Duration::from_millis(100));
            }
            max_tracked
        })
    };
    // The warm key during the flood, on this thread.
    let mut during = Vec::new();
    let deadline = started + Duration::from_secs(seconds);
    while done.load(Relaxed) < keys && Instant::now() < deadline {
        during.push(warm_batch(&l));
    }
    let flood_secs = started.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    let max_tracked = sampler.join().unwrap();
    let flooded = done.load(Relaxed);
    let m = l.metrics();
    let after = warm_quiet(&l, 50);
    let rss_end = rss_kib();
    let during_batches = during.len();
    let during = median(during);

    let samples = samples.lock().unwrap();
    let rss_max = samples.iter().map(|s| s.rss_kib).max().unwrap_or(rss_end);
    // RSS once the flood is half done, against the most it reached after.
    let half = samples
        .iter()
        .find(|s| s.keys_done >= flooded / 2)
        .map_or(rss_end, |s| s.rss_kib);
    let late_max = samples
        .iter()
        .filter(|s| s.keys_done >= flooded / 2)
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(rss_end);
    let growth = late_max as f64 / half as f64 - 1.0;
    println!(
        "\nflooded {flooded} keys in {flood_secs:.1} s ({:.0} keys/s), {} errors",
        flooded as f64 / flood_secs,
        errors.load(Relaxed)
    );
    println!(
        "keys_tracked: at most {max_tracked} (max_keys {max_keys}), {} at the end",
        m.keys_tracked
    );
    println!(
        "RSS: {rss_start} KiB before, at most {rss_max} KiB during, {rss_end} KiB after; \
         {half} KiB at half the flood, at most {late_max} KiB after that ({:+.1} %)",
        growth * 100.0
    );
    println!(
        "warm key: {before:.1} ns/acquire before, {during:.1} during (median of {} batches, sharing the \
         machine with the flood), {after:.1} after with a full table; after/before {:.2}, during/before {:.2}",
        during_batches,
        after / before,
        during / before
    );
    println!("warm key acquires not admitted: {}", WARM_DENIED.load(Relaxed));
    println!("metrics after the flood: {m:?}");

    let mut failed = Vec::new();
    if max_tracked > max_keys || m.keys_tracked > max_keys {
        failed.push(format!("the table held {max_tracked} keys > max_keys {max_keys}"));
    }
    if growth > 0.05 {
        failed.push(format!(
            "RSS grew {:.1} % over the second half of the flood",
            growth * 100.0
        ));
    }
    if errors.load(Relaxed) > 0 {
        failed.push(format!("{} acquire errors", errors.load(Relaxed)));
    }
    l.close().unwrap();
    let m = l.metrics();
    // Every token leased was admitted or given back: when its key was
    // evicted (counted in tokens_expired too) or at close.
    if m.tokens_leased != m.admitted + m.tokens_returned
        || m.tokens_returned < m.tokens_expired
        || m.overshoot_bound != 0
    {
        failed.push(format!("the books do not balance after close: {m:?}"));
    }
    if failed.is_empty() {
        println!("ok: table bounded by max_keys, RSS flat over the second half, books balanced");
    } else {
        for f in &failed {
            println!("FAIL: {f}");
        }
        std::process::exit(1);
    }
}
