//! Adaptive leasing on the memory authority with manual clocks: fleets of
//! 50 to 200 instances on one key, in simulated time (deterministic).
//! Targets from issue 12, asserted as bounds:
//! - saturation (2x offered, uneven demand): authority calls per admitted
//!   <= 0.06, admitted within the bucket's allowance + the budget, and with
//!   equal demand every instance within 10 % of an equal share;
//! - 0.8x offered (Poisson, uneven): false denials (denied while one exact
//!   global bucket would admit) <= 0.5 % of requests, and the most admitted
//!   in any 1-second window <= what the exact bucket allows + the budget.

mod common;

use quotalease::{ClockKind, Limiter, Metrics};

const LIMIT: u64 = 1_000;
const WINDOW: u64 = 1_000;
const BUDGET: u64 = 20; // 2 % of the limit, the default

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Poisson-distributed count with mean `mean` (small means).
    fn poisson(&mut self, mean: f64) -> u64 {
        let l = (-mean).exp();
        let (mut k, mut p) = (0, 1.0);
        loop {
            p *= self.unit();
            if p <= l {
                return k;
            }
            k += 1;
        }
    }
}

fn fleet(name: &str, n: usize) -> Vec<Limiter> {
    fleet_with(name, n, LIMIT, WINDOW)
}

fn fleet_with(name: &str, n: usize, limit: u64, window: u64) -> Vec<Limiter> {
    fleet_at(&format!("memory://{name}"), name, n, limit, window)
}

fn fleet_at(url: &str, prefix: &str, n: usize, limit: u64, window: u64) -> Vec<Limiter> {
    (0..n)
        .map(|_| {
            Limiter::builder()
                .url(url)
                .key_prefix(prefix)
                .limit(limit)
                .window_ms(window)
                .clock(ClockKind::Manual { start_ms: 1_000_000 })
                .build()
                .unwrap()
        })
        .collect()
}

/// The exact global bucket the fleet is compared with.
struct Exact {
    tokens: f64,
    limit: u64,
    window: u64,
}
impl Exact {
    fn tick(&mut self, ms: u64) {
        self.tokens = (self.tokens + (self.limit * ms) as f64 / self.window as f64).min(self.limit as f64);
    }
    fn take(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct Run {
    admitted: Vec<u64>,
    offered: u64,
    false_denials: u64,
    metrics: Metrics,
    /// The most admitted in any 1 s window, and the exact bucket's most.
    max_window: u64,
    allowance: u64,
}

/// Drive `fleet` for `secs` simulated seconds: each ms, Poisson arrivals with
/// mean `rate_per_ms`, each sent to an instance drawn by `weights`.
fn run(fleet: &[Limiter], weights: &[f64], rate_per_ms: f64, secs: u64, seed: u64) -> Run {
    let (limit, window) = (fleet[0].config().limit, fleet[0].config().window_ms);
    let mut rng = Rng(seed);
    let total: f64 = weights.iter().sum();
    let mut exact = Exact {
        tokens: limit as f64,
        limit,
        window,
    };
    let mut admitted = vec![0u64; fleet.len()];
    let (mut offered, mut false_denials) = (0, 0);
    let mut per_ms = Vec::new();
    let mut exact_per_ms = Vec::new();
    // each limiter's maintenance runs this often, as its ticker would
    let sweep_every = quotalease::internals::longest_sweep_gap_ms(fleet[0].config());
    for _ in 0..secs * 1_000 {
        let mut admitted_now = 0;
        let mut exact_now = 0;
        for _ in 0..rng.poisson(rate_per_ms) {
            let mut x = rng.unit() * total;
            let mut i = 0;
            while i + 1 < weights.len() && x >= weights[i] {
                x -= weights[i];
                i += 1;
            }
            offered += 1;
            let d = fleet[i].acquire("k", 1).unwrap();
            let exact_ok = exact.take();
            exact_now += exact_ok as u64;
            if d.allowed {
                admitted[i] += 1;
                admitted_now += 1;
            } else if exact_ok {
                false_denials += 1;
            }
        }
        per_ms.push(admitted_now);
        exact_per_ms.push(exact_now);
        for l in fleet {
            l.advance_clock(1).unwrap();
        }
        exact.tick(1);
        if per_ms.len() as u64 % sweep_every == 0 {
            // each limiter's maintenance, as its ticker runs it
            for l in fleet {
                l.settle().unwrap();
            }
        }
    }
    let max_window = |v: &[u64]| {
        let mut best = 0;
        let mut sum: u64 = v.iter().take(1_000).sum();
        best = best.max(sum);
        for i in 1_000..v.len() {
            sum = sum + v[i] - v[i - 1_000];
            best = best.max(sum);
        }
        best
    };
    if std::env::var("ADAPTIVE_TRACE").is_ok() {
        let secs: Vec<u64> = per_ms.chunks(1_000).map(|c| c.iter().sum()).collect();
        eprintln!("admitted per second: {secs:?}");
    }
    let metrics = fleet.iter().map(Limiter::metrics).fold(Metrics::default(), |mut a, m| {
        a.admitted += m.admitted;
        a.denied += m.denied;
        a.backend_calls += m.backend_calls;
        a
    });
    Run {
        admitted,
        offered,
        false_denials,
        metrics,
        max_window: max_window(&per_ms),
        allowance: limit + limit * secs * 1_000 / window,
    }
}

#[test]
fn saturated_fleet_of_50_costs_few_calls_and_holds_the_bound() {
    let f = fleet("adaptive-sat", 50);
    let weights: Vec<f64> = (0..50).map(|i| 1.0 + (i % 5) as f64).collect();
    let r = run(&f, &weights, 2.0, 60, 7);
    let total: u64 = r.admitted.iter().sum();
    let calls = r.metrics.backend_calls as f64 / total as f64;
    eprintln!(
        "saturated 50: offered {} admitted {total} (allowance {}) calls/admitted {calls:.4} max 1s window {}",
        r.offered, r.allowance, r.max_window
    );
    assert!(total <= r.allowance + BUDGET, "{total} > {} + {BUDGET}", r.allowance);
    assert!(total as f64 >= 0.95 * r.allowance as f64, "the limit is used: {total}");
    assert!(calls <= 0.05, "calls per admitted {calls}");
    assert!(r.max_window <= 2 * LIMIT + BUDGET, "{}", r.max_window);
    // inspect tells what the authority said: 50 holders, and (but for one
    // between a grant's end and its renewal, or waiting for room) on rates
    let i = f[0].inspect("k").unwrap();
    assert_eq!(i.holders, 50, "{i:?}");
    assert!(i.demand_per_s > 0, "{i:?}");
    let on_rates = f.iter().filter(|l| l.inspect("k").unwrap().rate_per_window > 0).count();
    assert!(on_rates >= 45, "{on_rates} of 50 instances on a rate");
    let fallback: u64 = f.iter().map(|l| l.inspect("k").unwrap().fallback_per_window).sum();
    // Each instance's figure is from its own last answer (the answers are
    // milliseconds apart, and their round-trip estimate is measured in real
    // time, so a loaded machine shifts them): the sum is the key's rate to
    // within a percent.
    assert!(
        (LIMIT * 9 / 10..=LIMIT + LIMIT / 100).contains(&fallback),
        "fallback rates sum to the key's: {fallback}"
    );
    // every instance's books: what came from the authority (chunks and
    // accrued rate tokens) is admitted, still held, or went back
    for l in &f {
        let m = l.metrics();
        assert!(m.tokens_leased > m.admitted / 2, "rate tokens count as leased: {m:?}");
        assert_eq!(
            m.tokens_leased - m.tokens_returned - m.tokens_expired,
            m.admitted + m.overshoot_bound,
            "{m:?}"
        );
    }
}

#[test]
fn saturated_fleet_with_equal_demand_shares_equally() {
    let f = fleet("adaptive-equal", 50);
    // The first seconds are left out: the full bucket's burst goes to
    // whoever asks first, before rates share the key.
    run(&f, &[1.0; 50], 2.0, 3, 13);
    // Over a minute: each rate is split by a demand estimate of Poisson
    // arrivals (a second's half-life, about 16 % noise at 40/s), so over
    // 30 s the most favoured of 50 holders came within 10 % of the mean
    // only just (4.7-7.8 % over 60 s, seeds 1-5 and 11).
    let r = run(&f, &[1.0; 50], 2.0, 60, 11);
    let mean = r.admitted.iter().sum::<u64>() as f64 / 50.0;
    let (lo, hi) = (r.admitted.iter().min().unwrap(), r.admitted.iter().max().unwrap());
    eprintln!("equal 50: mean {mean:.1} min {lo} max {hi}");
    for a in &r.admitted {
        assert!((*a as f64 - mean).abs() <= 0.1 * mean, "{a} vs mean {mean}");
    }
}

fn under_limit(n: usize, seed: u64) {
    let f = fleet(&format!("adaptive-under-{n}"), n);
    // Uneven: a quarter of the instances get 4x the traffic of the rest.
    let weights: Vec<f64> = (0..n).map(|i| if i % 4 == 0 { 4.0 } else { 1.0 }).collect();
    let r = run(&f, &weights, 0.8, 30, seed);
    let share = r.false_denials as f64 / r.offered as f64;
    eprintln!(
        "0.8x {n}: offered {} false denials {} ({:.3} %) calls/admitted {:.3} max 1s window {}",
        r.offered,
        r.false_denials,
        share * 100.0,
        r.metrics.backend_calls as f64 / r.metrics.admitted as f64,
        r.max_window
    );
    assert!(share <= 0.005, "false denials {share}");
    assert!(r.max_window <= 2 * LIMIT + BUDGET, "{}", r.max_window);
}

#[test]
fn fleets_of_50_100_200_under_the_limit_deny_almost_nothing() {
    for (n, seed) in [(50, 3), (100, 5), (200, 9)] {
        under_limit(n, seed);
    }
}

#[test]
fn a_long_window_saturated_by_a_few_instances_is_used() {
    // 600 per minute, 6 instances with uneven traffic at 10x the limit.
    let f = fleet_with("adaptive-minute", 6, 600, 60_000);
    let r = run(&f, &[41.0, 20.0, 14.0, 10.0, 8.0, 7.0], 0.1, 120, 5);
    let total: u64 = r.admitted.iter().sum();
    // Low rates per holder (1.7 tokens/s) make longer grants (5 s at most):
    // calls per admitted stay near 1 / (rate x 5 s).
    eprintln!(
        "minute: admitted {total} of {} calls/admitted {:.3} per instance {:?}",
        r.allowance,
        r.metrics.backend_calls as f64 / total as f64,
        r.admitted
    );
    assert!(total <= r.allowance + 12);
    // (0.944 measured with the ledger: what the rates leave of the refill
    // waits in the bucket for renewals)
    assert!(total as f64 >= 0.94 * r.allowance as f64, "{total}");
    // (the ledger caps a saturated key's chunks at a share's refill over
    // the shortest period: 0.282 measured)
    assert!(
        r.metrics.backend_calls * 10 <= total * 3,
        "calls per admitted under 0.3"
    );
}

#[test]
fn an_outage_runs_at_the_fallback_rates_of_the_live_fleet() {
    // 20 instances, expected_replicas left wrong (10), one instance taking
    // 90 % of the traffic at 2x the limit; the authority unreachable for 120 s;
    // one instance joining 60 s into the outage.
    let name = "adaptive-outage";
    let make = || {
        Limiter::builder()
            .url(format!("memory://{name}"))
            .limit(LIMIT)
            .window_ms(WINDOW)
            .expected_replicas(10)
            .clock(ClockKind::Manual { start_ms: 1_000_000 })
            .build()
            .unwrap()
    };
    let mut f: Vec<Limiter> = (0..20).map(|_| make()).collect();
    let mut weights: Vec<f64> = vec![0.9];
    weights.extend(std::iter::repeat_n(0.1 / 19.0, 19));
    let mut rng = Rng(17);
    let (mut during, mut t) = (0u64, 0u64);
    let (outage_from, outage_to, join_at) = (30_000, 150_000, 90_000);
    while t < 180_000 {
        if t == outage_from {
            assert!(quotalease::testing::memory_outage(name, true));
        }
        if t == outage_to {
            assert!(quotalease::testing::memory_outage(name, false));
        }
        if t == join_at {
            let l = make();
            l.advance_clock(t).unwrap();
            f.push(l);
            // the load balancer gives the newcomer an equal part of the light traffic
            weights.push(0.1 / 19.0);
        }
        let total: f64 = weights.iter().sum();
        for _ in 0..rng.poisson(2.0) {
            let mut x = rng.unit() * total;
            let mut i = 0;
            while i + 1 < weights.len() && x >= weights[i] {
                x -= weights[i];
                i += 1;
            }
            let d = f[i].acquire("k", 1).unwrap();
            if d.allowed && (outage_from..outage_to).contains(&t) {
                during += 1;
            }
        }
        for l in &f {
            l.advance_clock(1).unwrap();
        }
        t += 1;
    }
    let limit_over_outage = LIMIT * (outage_to - outage_from) / WINDOW;
    let ratio = during as f64 / limit_over_outage as f64;
    eprintln!("outage: admitted {during} while the limit allowed {limit_over_outage}: {ratio:.3}x");
    assert!((0.9..=1.1).contains(&ratio), "{ratio}");
    assert!(f.iter().all(|l| l.metrics().fallback_transitions >= 1));
}

#[test]
fn a_long_outage_runs_on_the_shares_while_valid_then_on_the_static_share() {
    // 10 instances, one taking 90 % of the traffic at 2x a 100/s limit; the
    // authority answers for 20 s, then stays away for 30 minutes. The heavy
    // instance keeps its fallback share (about 90/s) while it is valid
    // (the ledger's fallback_ms), then every instance falls back to the
    // static share limit / expected_replicas (10/s); the fleet stays within
    // the limit throughout.
    const L: u64 = 100;
    let name = "adaptive-long-outage";
    let f: Vec<Limiter> = (0..10)
        .map(|_| {
            Limiter::builder()
                .url(format!("memory://{name}"))
                .limit(L)
                .window_ms(WINDOW)
                .expected_replicas(10)
                .clock(ClockKind::Manual { start_ms: 1_000_000 })
                .build()
                .unwrap()
        })
        .collect();
    let heavy_share = 0.9;
    let mut rng = Rng(29);
    let step = 10; // ms per step; 2 requests per step on average
    let (outage_from, outage_ms) = (20_000u64, 30 * 60_000u64);
    let end = outage_from + outage_ms;
    let minute = |t: u64| (t >= outage_from).then(|| ((t - outage_from) / 60_000) as usize);
    let mut heavy = vec![0u64; 30];
    let mut fleet = vec![0u64; 30];
    let mut t = 0;
    while t < end {
        if t == outage_from {
            assert!(quotalease::testing::memory_outage(name, true));
        }
        for _ in 0..rng.poisson(2.0 * L as f64 * step as f64 / 1000.0) {
            let i = if rng.unit() < heavy_share {
                0
            } else {
                1 + (rng.next() % 9) as usize
            };
            let d = f[i].acquire("k", 1).unwrap();
            if let (true, Some(m)) = (d.allowed, minute(t)) {
                fleet[m] += 1;
                if i == 0 {
                    heavy[m] += 1;
                }
            }
        }
        for l in &f {
            l.advance_clock(step).unwrap();
        }
        t += step;
    }
    assert!(quotalease::testing::memory_outage(name, false));
    let per_minute = L * 60;
    eprintln!("long outage: heavy per minute {heavy:?}");
    eprintln!("long outage: fleet per minute {fleet:?}");
    // held: the first minutes run at the last answer's rates (the heavy one
    // near its 90 %), and the fleet uses most of the limit
    assert!(heavy[1] as f64 > 0.8 * per_minute as f64, "{}", heavy[1]);
    // lapsed: the heavy one is held to the static share (10 %)
    let expect = L / 10 * 60;
    assert!(heavy[29] <= expect + 1, "{} vs {expect}", heavy[29]);
    // the fleet never admits more than the limit in any minute (+ a token
    // of rounding per instance and minute)
    for (m, &n) in fleet.iter().enumerate() {
        assert!(n <= per_minute + 10, "minute {m}: {n} admitted, limit {per_minute}");
    }
}

#[test]
fn the_redis_scripts_run_the_same_algorithm() {
    // 20 instances at 2x on a real redis-server, manual clocks (the scripts
    // take the callers' time): the same bounds as on the memory authority.
    let server = common::redis_or_skip!(common::RedisServer::start());
    let f = fleet_at(&server.url(), "adaptive", 20, LIMIT, WINDOW);
    let weights: Vec<f64> = (0..20).map(|i| 1.0 + (i % 4) as f64).collect();
    let r = run(&f, &weights, 2.0, 20, 23);
    for l in &f {
        l.settle().unwrap();
    }
    let total: u64 = r.admitted.iter().sum();
    let calls = r.metrics.backend_calls as f64 / total as f64;
    eprintln!(
        "redis 20: offered {} admitted {total} (allowance {}) calls/admitted {calls:.4}",
        r.offered, r.allowance
    );
    assert!(total <= r.allowance + BUDGET, "{total}");
    assert!(total as f64 >= 0.9 * r.allowance as f64, "{total}");
    assert!(calls <= 0.06, "calls per admitted {calls}");
    // The ledger counts the live holders in the key's state.
    let holders = server.cli(&["HGET", "adaptive:{k}", "n"]);
    assert_eq!(holders.trim(), "20", "{holders}");
}

/// A key whose budget (2 % of its limit) is under one token is decided one
/// request at a time (`Ask::single`): several instances admit exactly what
/// one exact bucket admits, whichever instance each request reaches, and a
/// denial names when the bucket has its next token. Before, an instance
/// leased a token ahead for its next request while the others were denied:
/// four instances at 3/min on Redis admitted the 1st, 2nd and 5th of eight
/// round-robin requests and told the 3rd to come back in 60 s.
#[test]
fn a_small_limit_on_several_instances_is_one_exact_bucket() {
    const LIMIT: u64 = 3;
    const WINDOW: u64 = 60_000;
    // Without Redis, the memory authority alone.
    let server = common::redis_or_none(common::RedisServer::start);
    let redis = server.as_ref().map(|s| s.url());
    for url in std::iter::once("memory://small-exact".to_string()).chain(redis) {
        let f = fleet_at(&url, "small", 4, LIMIT, WINDOW);
        // The exact bucket in credit units (tokens x window), as the scripts keep it.
        let mut credit = LIMIT * WINDOW;
        let mut rng = Rng(7);
        let (mut admitted, mut denied) = (0, 0);
        for step in 0..600 {
            // Every 500 simulated ms, 0 to 2 requests, each to any instance.
            for _ in 0..rng.next() % 3 {
                let i = (rng.next() % 4) as usize;
                let d = f[i].acquire("k", 1).unwrap();
                let exact = credit >= WINDOW;
                assert_eq!(d.allowed, exact, "{url}, step {step}, instance {i}: {d:?}");
                if exact {
                    credit -= WINDOW;
                    admitted += 1;
                } else {
                    let next = (WINDOW - credit).div_ceil(LIMIT);
                    assert!(
                        d.retry_after_ms.abs_diff(next) <= 1,
                        "{url}, step {step}: retry after {} ms, the next token in {next} ms",
                        d.retry_after_ms
                    );
                    denied += 1;
                }
            }
            for l in &f {
                l.advance_clock(500).unwrap();
            }
            credit = (credit + LIMIT * 500).min(LIMIT * WINDOW);
        }
        // 300 s at 3/min: the full bucket and its refills (the last may come
        // after the last request) went out.
        assert!(admitted >= LIMIT + 14, "{url}: {admitted} admitted");
        assert!(denied > 100, "{url}: the key was saturated ({denied} denied)");
        for l in &f {
            l.settle().unwrap();
            assert_eq!(l.metrics().overshoot_bound, 0, "{url}: nothing held ahead");
        }
    }
}

/// A cold key (a request now and then, further apart than `lease_ttl_ms`)
/// costs one lease call per request on Redis: no token is prefetched for a
/// next request the demand does not expect before an idle lease goes back
/// (the prefetch and its give-back made three calls of each request).
#[test]
fn a_cold_key_costs_one_call_per_request() {
    let server = common::redis_or_skip!(common::RedisServer::start());
    let l = Limiter::builder()
        .url(server.url())
        .key_prefix(common::unique("cold"))
        .limit(600)
        .window_ms(60_000)
        .clock(ClockKind::Manual { start_ms: 1_000_000 })
        .build()
        .unwrap();
    for i in 0..10 {
        assert!(l.acquire("k", 1).unwrap().allowed, "request {i}");
        l.settle().unwrap();
        l.advance_clock(3_000).unwrap();
        l.settle().unwrap();
    }
    let m = l.metrics();
    assert_eq!(m.admitted, 10);
    assert_eq!(m.backend_calls, 10, "{m:?}");
}

/// 100 instances at 1.5x, every fourth at 4x the others' demand (the
/// uneven fleet of `make bench-adaptive`): the fleet uses the allowance.
/// Two losses this found, deterministic here: a rate that ended between
/// requests was zeroed by the sweeper without taking what it had accrued
/// since the holder's last request (0.960 of the allowance); and a carry of
/// 250 ms of a small rate overflowed under Poisson arrivals (0.950; 500 ms:
/// 0.970, 750 ms: 0.974, 1000 ms: 0.950, the carries then fill the capacity).
/// Its calls (issue 22's target: 0.05 per admitted): the fleet took 6 s to
/// move onto rates, one holder at a time (0.079; `rate_start_pct`: 0.052),
/// and a longest rate ended as its holder's commitment did, its last
/// accrual dropped unspent (0.959 of the allowance; `commit_ms` 7000 with
/// 5000 ms rates: 0.972 at 0.048). Since a rate's lazy accrual is bounded
/// by the most tokens held since it was last taken (`Accrual::peak`, the
/// bound's fix of `a_carry_kept_through_a_lull_is_one_carry`), 0.968-0.971.
/// Refill the clamp cut while commitments counted tokens their holders had
/// spent (a saturated holder's carry is mostly spent as it accrues) comes
/// back at the holder's next call (`spent_credit`): 0.971 -> 0.978. A
/// saturated key's chunk of 750 ms of the holder's share (`chunk_ms`; the
/// shortest period, 1000 ms, before) leaves less of the capacity counted for
/// tokens already spent: 0.978 -> 0.981 at 0.0460 -> 0.0495 calls. Chunks
/// of an equal part of `fleet_ahead_pct` of the capacity, sized by the
/// holders the first answers counted (a few), cost the start 0.9813 ->
/// 0.9799 (the six-instance fleet at 0.8x: 0.050 -> 0.014 calls).
#[test]
fn a_saturated_uneven_fleet_of_100_uses_its_allowance() {
    let f = fleet("adaptive-uneven100", 100);
    let weights: Vec<f64> = (0..100).map(|i| if i % 4 == 0 { 4.0 } else { 1.0 }).collect();
    let r = run(&f, &weights, 1.5, 20, 7);
    let total: u64 = r.admitted.iter().sum();
    let calls = r.metrics.backend_calls as f64 / total as f64;
    let used = total as f64 / r.allowance as f64;
    eprintln!(
        "uneven 100 at 1.5x: offered {} admitted {total} of {} ({used:.4}), calls/admitted {calls:.4}",
        r.offered, r.allowance
    );
    assert!(total <= r.allowance + BUDGET, "{total} > {} + {BUDGET}", r.allowance);
    assert!(used >= 0.975, "the allowance is used: {used:.4}");
    assert!(calls <= 0.05, "calls per admitted: {calls:.4}");
}

/// A thousand holders of a 1000/s key at 3x, a token a second each: a carry
/// is at most the holder's demand's part of the capacity, so every holder's
/// carry fits beside the others'. With a carry of 2 tokens each, half the
/// holders found no room for one, got no rate, and the refill their rates
/// would have taken was cut at the capacity (0.784 of the allowance here at
/// 1.05 calls per admitted, 0.881 at 0.94 with the cap; `adaptive_bench …
/// holders` on Redis, each holder offered 1000/s: 0.53 -> 0.70 over 10 s).
/// 0.859 since a fraction of a token accrued beside a full commitment is
/// dropped (`ledger_bound`'s schedule Y; 0.879 before).
#[test]
fn a_thousand_holders_of_a_token_a_second_each_get_rates() {
    let f = fleet("adaptive-thousand", 1_000);
    let weights = vec![1.0; 1_000];
    let r = run(&f, &weights, 3.0, 10, 5);
    let total: u64 = r.admitted.iter().sum();
    let used = total as f64 / r.allowance as f64;
    let calls = r.metrics.backend_calls as f64 / total.max(1) as f64;
    eprintln!(
        "1000 holders at 3x: admitted {total} of {} ({used:.4}), calls/admitted {calls:.4}",
        r.allowance
    );
    assert!(total <= r.allowance + BUDGET, "{total} > {} + {BUDGET}", r.allowance);
    assert!(used >= 0.85, "the allowance is used: {used:.3}");
}

/// The fairness target of issue 22 (bench-fleet's case (c)): six processes
/// of equal demand at 2x a 600/min key drained by another limiter, starting
/// within a second of each other, each paced at one request per 300 ms for
/// 21 s. Each gets near an equal share (about 33 tokens, so one token is
/// 3 %). A holder's first rate, while holders are still joining, is the
/// shortest: split by a sum of demand that lacks the holders joining next,
/// 5 s first rates left a late joiner with nothing until they ended (34 %
/// from an equal share on seed 7, 6.6-34 % over seeds 1-8). So is any
/// rate, a renewal too, within a shortest period of a holder's first
/// demand estimate that brought `join_pct` (a tenth) of the sum of demand:
/// a renewal at 5 s on the sum of the first few holders' demand kept their
/// larger shares while a later one waited (14.1 % on seed 7, 8.0 % on
/// average; 11.2 % at most and 7.1 % on average with it).
/// Six holders of a 600/min key `k` that another limiter drained first.
fn six_holders_of_a_drained_minute_key(name: &str) -> Vec<Limiter> {
    let d = fleet_with(name, 1, 600, 60_000).pop().unwrap();
    while d.acquire("k", 1).unwrap().allowed {}
    d.close().unwrap();
    fleet_with(name, 6, 600, 60_000)
}

/// The largest distance of one holder's admitted from the mean, as a
/// fraction of the mean.
fn spread(admitted: &[u64]) -> f64 {
    let mean = admitted.iter().sum::<u64>() as f64 / admitted.len() as f64;
    admitted
        .iter()
        .map(|a| (*a as f64 - mean).abs() / mean)
        .fold(0.0, f64::max)
}

#[test]
fn six_equal_holders_of_a_drained_minute_key_share_it() {
    let mut worst_sum = 0.0;
    for seed in 1..=8u64 {
        let f = six_holders_of_a_drained_minute_key(&format!("adaptive-eq6-{seed}"));
        let mut rng = Rng(seed);
        let mut next: Vec<u64> = (0..6).map(|_| (rng.unit() * 1000.0) as u64).collect();
        let mut admitted = [0u64; 6];
        for ms in 0..21_000u64 {
            for i in 0..6 {
                while next[i] <= ms {
                    next[i] += 300;
                    admitted[i] += f[i].acquire("k", 1).unwrap().allowed as u64;
                }
            }
            for l in &f {
                l.advance_clock(1).unwrap();
            }
        }
        let worst = spread(&admitted);
        // what one bucket allows: the refill over the 21 s (drained first)
        let used = admitted.iter().sum::<u64>() as f64 / 210.0;
        eprintln!(
            "equal 6, seed {seed}: {admitted:?}, {:.1} % from the mean, {used:.3} of the allowance",
            worst * 100.0
        );
        assert!(worst <= 0.12, "seed {seed}: {admitted:?}");
        // (a one-token carry's fraction dropped as each token was spent:
        // 0.851 on Redis with six real processes; with a carry a token
        // over the share, room for the fraction, 0.976-0.986 here)
        assert!(used >= 0.97, "seed {seed}: {admitted:?}, {used:.3} of the allowance");
        worst_sum += worst;
    }
    assert!(
        worst_sum / 8.0 <= 0.075,
        "{:.3} from an equal share on average",
        worst_sum / 8.0
    );
}

/// Six holders of equal demand as in `six_equal_holders_of_a_drained_minute_key_share_it`,
/// but with Poisson arrivals (3.33/s each, 20 s, seeds 1-16): the split follows
/// each holder's demand estimate, which a few requests a second leave noisy,
/// so the shares spread far wider than paced requests' (docs/limits.md,
/// "Equal demand with random arrivals"). The bound is asserted; the spread
/// is printed, with a floor a little over what was measured (a regression
/// guard, not a target: issue 22's 10 % is met by paced requests only).
#[test]
fn six_equal_poisson_holders_keep_the_bound_and_print_their_spread() {
    let seeds = 16u64;
    let (mut worst_sum, mut used_sum) = (0.0, 0.0);
    for seed in 1..=seeds {
        let f = six_holders_of_a_drained_minute_key(&format!("adaptive-eqp6-{seed}"));
        let mut rng = Rng(seed * 7919);
        let mut admitted = [0u64; 6];
        let ms = 20_000u64;
        for _ in 0..ms {
            for (i, l) in f.iter().enumerate() {
                if rng.unit() < 3.333 / 1000.0 {
                    admitted[i] += l.acquire("k", 1).unwrap().allowed as u64;
                }
            }
            for l in &f {
                l.advance_clock(1).unwrap();
            }
        }
        // what one bucket allows after the drain: the refill over the run
        let allowance = 600 * ms / 60_000;
        let total: u64 = admitted.iter().sum();
        assert!(total <= allowance, "seed {seed}: {admitted:?} of {allowance}");
        let worst = spread(&admitted);
        eprintln!(
            "equal 6, Poisson, seed {seed}: {admitted:?}, {:.1} % from the mean, {:.3} of the allowance",
            worst * 100.0,
            total as f64 / allowance as f64
        );
        worst_sum += worst;
        used_sum += total as f64 / allowance as f64;
    }
    let (worst, used) = (worst_sum / seeds as f64, used_sum / seeds as f64);
    eprintln!(
        "equal 6, Poisson: {:.1} % from an equal share on average, {used:.3} of the allowance",
        worst * 100.0
    );
    assert!(worst <= 0.41, "{:.1} % from an equal share on average", worst * 100.0);
    assert!(used >= 0.90, "{used:.3} of the allowance");
}

/// Fleet shapes beside the targets' own, on the memory authority (manual
/// clocks, Poisson arrivals, 20 s): whatever the fleet, it admits at most
/// what one bucket allows. The share of the allowance each reaches is
/// printed and quoted in docs/limits.md ("Near the limit"); the floors are
/// a little under what was measured, so that a change that loses more
/// fails here (they are regression guards, not targets: 100 even
/// instances at 1.5x measured 0.946, under issue 22's 0.97).
#[test]
fn fleet_shapes_hold_the_bound() {
    // (limit, window, instances, load, weights: 0 even, 1 zipf, 2 cyclic 1..7, floor)
    let shapes: &[(u64, u64, usize, f64, u32, f64)] = &[
        (1000, 1_000, 100, 1.5, 0, 0.94),
        (1000, 1_000, 100, 2.0, 2, 0.975),
        (1000, 1_000, 50, 1.5, 1, 0.985),
        (1000, 1_000, 100, 1.3, 0, 0.92),
        (1000, 1_000, 100, 1.0, 0, 0.88),
        (100, 1_000, 50, 1.2, 2, 0.71),
        (50, 1_000, 20, 2.0, 2, 0.82),
        (100, 1_000, 12, 13.0, 0, 0.975),
    ];
    let secs = 20;
    for (k, &(limit, window, n, load, weights, floor)) in shapes.iter().enumerate() {
        let f = fleet_with(&format!("adaptive-shape-{k}"), n, limit, window);
        let w: Vec<f64> = (0..n)
            .map(|i| match weights {
                0 => 1.0,
                1 => 1.0 / (1 + i) as f64,
                _ => 1.0 + (i % 7) as f64,
            })
            .collect();
        let r = run(&f, &w, load * limit as f64 / window as f64, secs, 11 + k as u64);
        let admitted: u64 = r.admitted.iter().sum();
        let allowed = r.allowance.min(r.offered);
        let share = admitted as f64 / allowed as f64;
        eprintln!(
            "{n} instances at {load}x a {limit} per {window} ms key (weights {weights}): {admitted} admitted of {allowed} \
             ({share:.3}), {:.4} calls per admitted",
            r.metrics.backend_calls as f64 / admitted.max(1) as f64
        );
        assert!(
            admitted <= r.allowance,
            "shape {k}: {admitted} admitted, one bucket allows {}",
            r.allowance
        );
        assert!(share >= floor, "shape {k}: {share:.3} of the allowance");
    }
}

/// Saturate a 100/s key from `n` holders (a request every 5 ms each), go
/// quiet `lull1` ms, one request each, quiet `lull2` ms, then burst. Returns
/// the most admitted over any interval ending at the burst's end, less the
/// refill over it: at most the capacity for one bucket.
fn carry_through_a_lull(url: &str, prefix: &str, n: usize, lull1: u64, lull2: u64) -> f64 {
    let (limit, window) = (100u64, 1_000u64);
    let f = fleet_at(url, prefix, n, limit, window);
    let mut per_ms: Vec<u64> = Vec::new();
    let tick = |f: &[Limiter], per_ms: &mut Vec<u64>, admitted: u64| {
        per_ms.push(admitted);
        for l in f {
            l.advance_clock(1).unwrap();
        }
    };
    for ms in 0..3_000u64 {
        let a = if ms % 5 == 0 {
            f.iter().filter(|l| l.acquire("k", 1).unwrap().allowed).count() as u64
        } else {
            0
        };
        tick(&f, &mut per_ms, a);
    }
    for _ in 0..lull1 {
        tick(&f, &mut per_ms, 0);
    }
    let a = f.iter().filter(|l| l.acquire("k", 1).unwrap().allowed).count() as u64;
    tick(&f, &mut per_ms, a);
    for _ in 0..lull2 {
        tick(&f, &mut per_ms, 0);
    }
    for _ in 0..50 {
        let a = (0..200)
            .map(|_| f.iter().filter(|l| l.acquire("k", 1).unwrap().allowed).count() as u64)
            .sum();
        tick(&f, &mut per_ms, a);
    }
    for l in &f {
        l.close().unwrap();
    }
    let (mut sum, mut worst) = (0u64, f64::MIN);
    for (len, a) in per_ms.iter().rev().enumerate() {
        sum += a;
        worst = worst.max(sum as f64 - (limit * (len as u64 + 1)) as f64 / window as f64);
    }
    worst
}

/// A rate's accrual is taken lazily, when the tokens held run out. It
/// fills what the commitment leaves beside what was held all along, so the
/// most held since the last accrual bounds it (`Accrual::peak`). Bounded by
/// what was held at the end (none), a holder that kept its carry through a
/// lull, then spent it, took a second carry at once: four holders admitted
/// the capacity and 20 over one bucket (and the refill) on both authorities.
#[test]
fn a_carry_kept_through_a_lull_is_one_carry() {
    let server = common::redis_or_none(common::RedisServer::start);
    for n in [4, 10] {
        for (lull1, lull2) in [(600, 1_000), (600, 2_000), (400, 2_000)] {
            let prefix = format!("lull-{n}-{lull1}-{lull2}");
            let mut urls = vec![format!("memory://{prefix}")];
            if let Some(s) = &server {
                urls.push(s.url());
            }
            for url in urls {
                let over = carry_through_a_lull(&url, &prefix, n, lull1, lull2) - 100.0;
                eprintln!("{n} holders, quiet {lull1} and {lull2} ms, {url}: capacity {over:+.1}");
                assert!(
                    over <= 0.0,
                    "{n} holders, {lull1}/{lull2} ms on {url}: {over:.1} over one bucket"
                );
            }
        }
    }
}

/// Six uneven holders offered 2x a 1000/s key (Poisson, seeded), one ms at a
/// time for `end` ms on manual clocks. `at(t)` runs at the start of each ms
/// (to cut the authority off or mute it) and gives that ms's part of the
/// load. Returns the fleet and what it admitted from `from` on.
fn six_uneven_at_2x(name: &str, seed: u64, end: u64, from: u64, mut at: impl FnMut(u64) -> f64) -> (Vec<Limiter>, u64) {
    let offered = [100.0, 300.0, 600.0, 150.0, 350.0, 500.0]; // per second: 2x
    let f = fleet(name, 6);
    let mut rng = Rng(seed);
    let mut admitted = 0u64;
    for t in 0..end {
        let load = at(t);
        for (l, rate) in f.iter().zip(offered) {
            for _ in 0..rng.poisson(load * rate / 1000.0) {
                let allowed = l.acquire("k", 1).unwrap().allowed;
                admitted += u64::from(allowed && t >= from);
            }
        }
        for l in &f {
            l.advance_clock(1).unwrap();
        }
    }
    (f, admitted)
}

/// A Redis starved of CPU answers late: calls run, their replies are lost to
/// the timeout (`memory_lose_replies`). Six uneven holders at 2x a 1000/s
/// key, muted for 2.7 s from 6.5 s: the fleet runs on its fallback shares,
/// then leases again. Each lost reply used to leave its debit of the
/// fallback admissions to be taken again by the next call, and each probe
/// while the circuit was open a rate counted until the next answered call:
/// a debt the fleet then paid at half the key's rate (0.930 of the
/// allowance; 0.964 without the probes' rule, 0.926 without the debit's).
#[test]
fn lost_replies_cost_no_debt_after_the_outage() {
    let name = "adaptive-lost-replies";
    let (mute_from, mute_to, end) = (6_500u64, 9_200u64, 20_000u64);
    let (f, admitted) = six_uneven_at_2x(name, 7, end, 0, |t| {
        if t == mute_from || t == mute_to {
            assert!(quotalease::testing::memory_lose_replies(name, t == mute_from));
        }
        1.0
    });
    let allowance = LIMIT + LIMIT * end / WINDOW;
    let share = admitted as f64 / allowance as f64;
    eprintln!("lost replies for 2.7 s: admitted {admitted} of {allowance} ({share:.3})");
    assert!(
        f.iter().all(|l| l.metrics().fallback_transitions >= 1),
        "the fleet degraded"
    );
    assert!(admitted <= allowance, "the bound");
    assert!(share >= 0.98, "{share:.3} of the allowance");
}

/// Redis restarted empty: down for 300 ms, then up with no state. A
/// renewal due while it is down fails before anything is written (no
/// connection can be opened; here the simulated outage), so the rate it
/// paused runs on to its end: the authority never saw the call, and the
/// next probe, once the server is back, renews it. Paused, the holder
/// reported no rate to the restarted authority, which grants such a holder
/// nothing while it learns (`learn_ms`). With `renew_lead_ms` 500, as the
/// lead of two round trips is on a loaded machine, six uneven holders at
/// 2x a 1000/s key admitted 0.721 of its rate in the second after the
/// restart's first with their renewals paused, 0.996 with them resumed.
#[test]
fn a_renewal_that_fails_unsent_keeps_its_rate() {
    let tuning = quotalease::internals::Tuning {
        renew_lead_ms: 500,
        ..quotalease::internals::TUNING
    };
    let share = restarted_fleet("adaptive-restart-unsent", tuning, 300);
    assert!(share >= 0.9, "{share:.3} of the key's rate");
}

/// Redis restarted empty and down for 700 ms, a fleet at 2x on default
/// leads (`renew_lead_ms` 10): a rate whose renewal failed while the
/// server was down runs out before the holder's next probe, which backs
/// off (50, 100, 200, 400 ms). Reported as none, it was re-granted nothing
/// while the restarted authority learned (`learn_ms`, 7 s): 0.772 of the
/// key's rate in the second after the restart's first. The ledger now
/// keeps a rate's room for its renewal grace after it runs out (`A`, its
/// tail), and the holder reports it until then (`Entry::pause_rate`).
#[test]
fn a_rate_that_ran_out_while_redis_restarted_is_granted_again() {
    let share = restarted_fleet("adaptive-restart-ran-out", quotalease::internals::TUNING, 700);
    assert!(share >= 0.9, "{share:.3} of the key's rate");
}

/// Six uneven holders at 2x a 1000/s key on `memory://` under `tuning`;
/// at 10 s the authority goes down and restarts empty, back after
/// `down_ms`. Returns what they admitted in the second after the
/// restart's first, a share of the key's rate.
fn restarted_fleet(name: &str, tuning: quotalease::internals::Tuning, down_ms: u64) -> f64 {
    let f: Vec<Limiter> = (0..6)
        .map(|_| {
            Limiter::builder()
                .url(format!("memory://{name}"))
                .key_prefix(name)
                .limit(LIMIT)
                .window_ms(WINDOW)
                .clock(ClockKind::Manual { start_ms: 1_000_000 })
                .tuning(tuning)
                .build()
                .unwrap()
        })
        .collect();
    let offered = [100.0, 300.0, 600.0, 150.0, 350.0, 500.0]; // per second: 2x
    let (down, up) = (10_000u64, 10_000 + down_ms);
    let (from, end) = (down + 1_000, down + 2_000);
    let mut rng = Rng(3);
    let mut admitted = 0u64;
    for t in 0..end {
        if t == down {
            assert!(quotalease::testing::memory_outage(name, true));
            assert!(quotalease::testing::memory_reset(name));
        }
        if t == up {
            assert!(quotalease::testing::memory_outage(name, false));
        }
        for (l, rate) in f.iter().zip(offered) {
            for _ in 0..rng.poisson(rate / 1000.0) {
                let allowed = l.acquire("k", 1).unwrap().allowed;
                admitted += u64::from(allowed && t >= from);
            }
        }
        for l in &f {
            l.advance_clock(1).unwrap();
        }
    }
    let share = admitted as f64 / (LIMIT * (end - from) / WINDOW) as f64;
    eprintln!("{name}: restarted empty, down {down_ms} ms: {admitted} admitted in the second after the restart's first ({share:.3} of the rate)");
    assert!(f.iter().any(|l| l.metrics().fallback_transitions >= 1), "a call failed");
    share
}

/// I4's overflow (refill the capacity clamp cut) pays fallback admissions
/// only when it was cut after the holder's last lease call. It was kept as
/// one amount `o` with the earliest instant `q` it covered, so overflow cut
/// while the key was idle stayed unpaid through the saturation after it and
/// held `q` at the idle spell: no holder's last call came before it, and
/// the refill cut during a later outage never paid for that outage. Six
/// uneven holders at 0.15x of a 1000/s key for 2 s, at 2x from then on, an
/// outage from 6.5 to 9.2 s: the outage's fallback admissions were paid
/// again from the refill after it. The ledger now sums the overflow (`O`)
/// and what it paid (`P`), and each holder keeps both at its last lease
/// call: what was cut since, less what paid since, pays.
#[test]
fn an_outage_is_paid_by_the_overflow_it_left() {
    let (busy_from, down_from, down_to, end) = (2_000u64, 6_500u64, 9_200u64, 20_000u64);
    let from = 5_000u64;
    for seed in 1..4u64 {
        let name = format!("adaptive-outage-overflow-{seed}");
        let (f, admitted) = six_uneven_at_2x(&name, seed, end, from, |t| {
            if t == down_from || t == down_to {
                assert!(quotalease::testing::memory_outage(&name, t == down_from));
            }
            if t < busy_from {
                0.15
            } else {
                1.0
            }
        });
        // from 5 s on: the key's rate, and at most the capacity on top
        let allowance = LIMIT * (end - from) / WINDOW;
        let share = admitted as f64 / allowance as f64;
        eprintln!("seed {seed}: admitted {admitted} from 5 s on, {share:.3} of the rate");
        assert!(
            f.iter().all(|l| l.metrics().fallback_transitions >= 1),
            "the fleet degraded"
        );
        assert!(admitted <= allowance + LIMIT, "the bound");
        assert!(share >= 0.98, "seed {seed}: {share:.3} of the key's rate");
    }
}

/// A silent outage cuts its whole refill: the overflow counted only three
/// windows of a silent span (the refill's own cap) and paid at most two
/// capacities, so a 10 s outage of six uneven holders at 2x left about a
/// capacity of its fallback admissions as a debt, paid at `debt_pay_pct`
/// after the heal: 0.946 of the allowance. Counted over the whole span and
/// paid in full, 0.999; the overflow is still only what was cut after each
/// holder's last call (`an_outage_is_paid_by_the_overflow_it_left`).
#[test]
fn a_long_outage_is_paid_by_its_whole_overflow() {
    let (down_from, down_to, end) = (6_000u64, 16_000u64, 20_000u64);
    for seed in 1..4u64 {
        let name = format!("adaptive-long-outage-{seed}");
        let (_, admitted) = six_uneven_at_2x(&name, seed, end, 0, |t| {
            if t == down_from || t == down_to {
                assert!(quotalease::testing::memory_outage(&name, t == down_from));
            }
            1.0
        });
        let allowance = LIMIT + LIMIT * end / WINDOW;
        let share = admitted as f64 / allowance as f64;
        eprintln!("seed {seed}: outage of 10 s, admitted {admitted} of {allowance} ({share:.3})");
        assert!(admitted <= allowance, "the bound");
        assert!(share >= 0.98, "seed {seed}: {share:.3} of the allowance");
    }
}

/// `overshoot_budget` `"auto"` (the default) lets the few holders of a key
/// lease further ahead than 2 % of its limit: a lone holder up to half the
/// capacity (`fleet_ahead_pct`). A percentage set by the user is a hard cap.
#[test]
fn the_auto_budget_leases_further_ahead_for_few_holders() {
    use quotalease::Budget;
    let held = |budget: Option<&str>| {
        let mut b = Limiter::builder()
            .limit(100)
            .window_ms(1000)
            .clock(ClockKind::Manual { start_ms: 1_000_000 });
        if let Some(v) = budget {
            b = b.overshoot_budget(v.parse().unwrap());
        }
        let l = b.build().unwrap();
        assert_eq!(
            l.config().overshoot_budget,
            budget.map_or(Budget::Auto, |b| b.parse().unwrap())
        );
        // 100 requests a second for a second: a second of that demand is
        // 100 tokens, which each lease call asks for ahead, within the budget
        let mut most = 0;
        for _ in 0..100 {
            assert!(l.acquire("k", 1).unwrap().allowed);
            most = most.max(l.metrics().overshoot_bound);
            l.advance_clock(10).unwrap();
        }
        most
    };
    assert_eq!(held(Some("2%")), 2, "a set budget caps");
    assert_eq!(held(Some("5%")), 5, "a set budget caps");
    let auto = held(None);
    assert!(
        auto > 5 && auto <= 50,
        "auto: {auto} held, up to half a second's refill"
    );
    assert_eq!(held(Some("auto")), auto);
}

/// A fleet that keeps changing: 50 holders at 1.5x a 1000/s key, one
/// replaced by a new limiter every second for 30 s. `join_pct` keeps such
/// churn from making renewals short: 0.0347 calls per admitted here; the
/// same fleet (its holders replaced in another order) made 0.0343 at the
/// parent and 0.0548 when every join made renewals short (docs/design.md,
/// `join_pct`). Asserted: the bound, the allowance used, and the calls
/// with a margin over what was measured.
#[test]
fn a_churning_fleet_keeps_its_rates_long() {
    let name = "adaptive-churn";
    let mut f = fleet_with(name, 50, 1000, 1000);
    let mut rng = Rng(7);
    let (mut admitted, mut calls_closed) = (0u64, 0u64);
    let secs = 30u64;
    for ms in 0..secs * 1000 {
        for l in f.iter() {
            if rng.unit() < 1.5 / 50.0 {
                admitted += l.acquire("k", 1).unwrap().allowed as u64;
            }
        }
        if ms > 0 && ms % 1000 == 0 {
            let new = fleet_with(name, 1, 1000, 1000).pop().unwrap();
            new.advance_clock(ms).unwrap();
            let old = std::mem::replace(&mut f[(ms / 1000) as usize % 50], new);
            calls_closed += old.metrics().backend_calls;
            old.close().unwrap();
        }
        for l in &f {
            l.advance_clock(1).unwrap();
        }
    }
    let calls = calls_closed + f.iter().map(|l| l.metrics().backend_calls).sum::<u64>();
    let allowance = 1000 * (secs + 1);
    let per = calls as f64 / admitted as f64;
    eprintln!("churn: admitted {admitted} of {allowance}, {per:.4} calls per admitted");
    assert!(admitted <= allowance, "{admitted} > {allowance}");
    assert!(admitted as f64 >= 0.97 * allowance as f64, "{admitted} of {allowance}");
    assert!(per <= 0.04, "{per:.4} calls per admitted");
}
