//! `acquire` on a warm key N times, for `valgrind --tool=callgrind`: the
//! difference between two runs of different N gives instructions per request,
//! a figure that stays the same on a noisy shared machine.
//! Usage: hot_loop quotalease|quotalease-100k|quotalease-tier|quotalease-2rules|
//!                 quotalease-day|quotalease-calendar|governor|mutex N
//! (`quotalease-100k`: a working set of 100 000 warm keys, visited in turn;
//! `quotalease-tier`: the caller names the key's tier; `quotalease-2rules`:
//! the tier has two rules, so each request spends from two buckets;
//! `quotalease-day` and `quotalease-calendar`: adaptive leasing of
//! 50 000 000 a day, as a token bucket and as a calendar quota in UTC.)
use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Mutex;

use quotalease::{ClockKind, Limiter};

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "quotalease".into());
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let key = "user:42";
    let mut allowed = 0u64;
    match which.as_str() {
        "quotalease" => {
            let l = Limiter::builder()
                .limit(1 << 40)
                .window_ms(1000)
                .lease_size(1 << 30)
                .clock(ClockKind::Manual { start_ms: 0 })
                .build()
                .unwrap();
            for _ in 0..n {
                allowed += l.acquire(black_box(key), 1).unwrap().allowed as u64;
            }
        }
        "quotalease-tier" | "quotalease-2rules" => {
            let rules = if which == "quotalease-tier" {
                "1099511627776/s"
            } else {
                "1099511627776/s, 1099511627776/2s"
            };
            let l = Limiter::builder()
                .limit(1 << 40)
                .window_ms(1000)
                .lease_size(1 << 30)
                .tier("pro", rules)
                .clock(ClockKind::Manual { start_ms: 0 })
                .build()
                .unwrap();
            for _ in 0..n {
                allowed += l.acquire_with(black_box(key), 1, Some("pro")).unwrap().allowed as u64;
            }
        }
        "quotalease-day" | "quotalease-calendar" => {
            let rate = if which == "quotalease-day" {
                "50000000/day"
            } else {
                "50000000/day@UTC"
            };
            let l = Limiter::builder()
                .rate(rate)
                .clock(ClockKind::Manual {
                    start_ms: 1_796_000_000_000,
                })
                .build()
                .unwrap();
            for _ in 0..n {
                allowed += l.acquire(black_box(key), 1).unwrap().allowed as u64;
            }
        }
        "quotalease-100k" => {
            let keys: Vec<String> = (0..100_000).map(|i| format!("user:{i}")).collect();
            let l = Limiter::builder()
                .limit(1 << 40)
                .window_ms(1000)
                .lease_size(1 << 30)
                .max_keys(200_000)
                .clock(ClockKind::Manual { start_ms: 0 })
                .build()
                .unwrap();
            for k in &keys {
                l.acquire(k, 1).unwrap();
            }
            for i in 0..n {
                allowed += l.acquire(black_box(&keys[i as usize % keys.len()]), 1).unwrap().allowed as u64;
            }
        }
        "governor" => {
            let g = governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::new(u32::MAX).unwrap()));
            let k = key.to_string();
            for _ in 0..n {
                allowed += g.check_key(black_box(&k)).is_ok() as u64;
            }
        }
        "mutex" => {
            let m: Mutex<HashMap<String, u64>> = Mutex::new(HashMap::new());
            for _ in 0..n {
                let mut g = m.lock().unwrap();
                let e = g.entry(black_box(key).to_string()).or_insert(u64::MAX);
                *e -= 1;
                allowed += 1;
            }
        }
        other => panic!("unknown contender {other}"),
    }
    assert_eq!(allowed, n);
}
