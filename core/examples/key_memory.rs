//! Memory per tracked key (issue 26): one limiter on `memory://` (the key
//! table and the in-process authority) takes one token for each of N
//! distinct keys, all tracked at once (`max_keys` above N); the growth of this
//! process' resident set over the keys, divided by N, is the cost of a key.
//!
//! With a `redis://` URL the authority's state lives in Redis, and the
//! growth is the client's alone (the key table).
//!
//! Usage: key_memory [N] [URL] (default 1 000 000 keys, `memory://`).
use quotalease::Limiter;

/// This process' resident set, in bytes (/proc/self/status VmRSS).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux only)");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(1_000_000, |a| a.replace('_', "").parse().expect("N is a number"));
    let url = std::env::args().nth(2).unwrap_or_else(|| "memory://".into());
    let l = Limiter::builder()
        .url(url.clone())
        .key_prefix(format!("km{}", std::process::id()))
        .limit(100)
        .window_ms(60_000)
        .max_keys((n + n / 8 + 16) as usize) // room: a full table evicts a sixteenth
        // none idle long enough to leave the table while the run inserts the
        // rest (an entry without tokens leaves after 30 lease TTLs, at least
        // a minute; a million keys take longer than that)
        .lease_ttl_ms(3_600_000)
        .build()
        .unwrap();
    // The first key starts the table, the authority and their allocations.
    l.acquire("warm-up", 1).unwrap();
    let before = rss();
    let keys: Vec<String> = (0..n).map(|i| format!("user:{i:010}")).collect();
    let with_keys = rss();
    for k in &keys {
        assert!(l.acquire(k, 1).unwrap().allowed);
    }
    let after = rss();
    let tracked = l.metrics().keys_tracked;
    assert!(tracked >= n, "every key tracked: {tracked} of {n}");
    let per_key = (after - with_keys) as f64 / n as f64;
    println!(
        "key_memory: {n} keys of 15 bytes on {}, adaptive leasing: {per_key:.0} B per tracked key \
         (RSS {} MiB before, {} MiB with the key strings, {} MiB with every key tracked)",
        quotalease::RedactedUrl(&url),
        before >> 20,
        with_keys >> 20,
        after >> 20
    );
}
