//! `quotalease simulate`: the same traffic through five strategies, each a
//! fleet of real `quotalease::Limiter`s (one per simulated instance), in
//! virtual time on the embedded `memory://` authority or in real time on Redis.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quotalease::internals::BucketState;
use quotalease::Quota;
use quotalease::{default_lease_size, ClockKind, Config, Limiter, Mode};

use crate::histogram::Histogram;
use crate::progress::Progress;
use crate::scenario::{Kind, Scenario, Shape};

/// Virtual clocks start here (any value works; a large one reads like a timestamp).
const START_MS: u64 = 1_000_000;

/// One way to enforce a per-key limit across a fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// Each instance enforces the full limit on its own (the naive one).
    PerInstance,
    /// Each instance enforces limit / instances.
    StaticShare,
    /// One authority call per request.
    Exact,
    /// Fixed-size leases borrowed from the authority (`lease_size` set).
    Leased,
    /// Adaptive leasing: leases sized by demand under one overshoot budget,
    /// rates at saturation (quotalease's default).
    Adaptive,
}

impl Strategy {
    /// Every strategy, in report order.
    pub const ALL: [Strategy; 5] = [
        Strategy::PerInstance,
        Strategy::StaticShare,
        Strategy::Exact,
        Strategy::Leased,
        Strategy::Adaptive,
    ];

    /// Short name (chart legend, table rows).
    pub fn name(self) -> &'static str {
        match self {
            Strategy::PerInstance => "per-instance limit",
            Strategy::StaticShare => "static share",
            Strategy::Exact => "exact",
            Strategy::Leased => "fixed leases",
            Strategy::Adaptive => "adaptive (quotalease)",
        }
    }

    /// True for the strategies that never leave the process.
    pub fn is_local(self) -> bool {
        matches!(self, Strategy::PerInstance | Strategy::StaticShare)
    }

    /// Chart colour.
    pub fn colour(self) -> &'static str {
        match self {
            Strategy::PerInstance => "#d62728",
            Strategy::StaticShare => "#ff7f0e",
            Strategy::Exact => "#1f77b4",
            Strategy::Leased => "#2ca02c",
            Strategy::Adaptive => "#9467bd",
        }
    }
}

/// Everything `simulate` takes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Traffic and fleet.
    pub shape: Shape,
    /// Tokens per lease (`None`: the library default).
    pub lease_size: Option<u64>,
    /// Prefetch threshold (`None`: the library default).
    pub refill_threshold: Option<u64>,
    /// Lease TTL (ms).
    pub lease_ttl_ms: u64,
    /// Round-trip time used to price authority calls in virtual time (ms).
    pub rtt_ms: f64,
    /// Run exact, fixed and adaptive leases against this Redis in real time.
    pub redis: Option<String>,
    /// Draw a progress bar on stderr (real time only).
    pub progress: bool,
}

/// Per key, per strategy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Denials while the global budget (a reference bucket charged with this
    /// strategy's admissions) still had a token.
    pub false_denials: u64,
    /// Most tokens admitted beyond the global budget at any moment.
    pub overshoot: u64,
    /// Authority calls made inside this key's `acquire` calls (virtual time
    /// only; lease-TTL give-backs happen outside them and count only in
    /// [`StrategyResult::authority_calls`]).
    pub calls: u64,
}

/// The outcome of one strategy.
#[derive(Clone, Debug)]
pub struct StrategyResult {
    /// Which.
    pub strategy: Strategy,
    /// Per key (same order as the scenario's keys).
    pub keys: Vec<KeyStats>,
    /// Authority calls (lease, give-back and exact scripts).
    pub authority_calls: u64,
    /// Latency added to each request (ns): modelled from the RTT in virtual
    /// time, measured around `acquire` in real time.
    pub latency: Histogram,
    /// The theoretical overshoot bound per key, when the strategy has one.
    pub bound: Option<u64>,
    /// Admitted requests per chart bin, per key.
    pub bins: Vec<Vec<u64>>,
}

impl StrategyResult {
    /// Requests admitted, all keys.
    pub fn admitted(&self) -> u64 {
        self.keys.iter().map(|k| k.admitted).sum()
    }
    /// False denials, all keys.
    pub fn false_denials(&self) -> u64 {
        self.keys.iter().map(|k| k.false_denials).sum()
    }
    /// Worst overshoot over keys.
    pub fn overshoot(&self) -> u64 {
        self.keys.iter().map(|k| k.overshoot).max().unwrap_or(0)
    }
}

/// Everything `simulate` found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The traffic.
    pub scenario: Scenario,
    /// Resolved lease size.
    pub lease_size: u64,
    /// Resolved refill threshold.
    pub refill_threshold: u64,
    /// Lease TTL (ms).
    pub lease_ttl_ms: u64,
    /// RTT used in virtual time (ms).
    pub rtt_ms: f64,
    /// Redis URL when run in real time.
    pub redis: Option<String>,
    /// Per key: what one exact global bucket with zero latency admits.
    pub allowance: Vec<u64>,
    /// Requests per chart bin, per key.
    pub demand_bins: Vec<Vec<u64>>,
    /// Chart bin width (ms).
    pub bin_ms: u64,
    /// One per strategy run.
    pub results: Vec<StrategyResult>,
    /// Wall-clock time the run took.
    pub elapsed: Duration,
}

impl Report {
    /// The result of `s`, if it ran.
    pub fn result(&self, s: Strategy) -> Option<&StrategyResult> {
        self.results.iter().find(|r| r.strategy == s)
    }
}

/// The global budget of one key, as token buckets of the key's policy that may
/// go into debt, refilled at the limit's rate.
///
/// `credit` is charged with every admission of a strategy: its deepest debt is
/// the overshoot. `shadow` is also charged with every false denial (a denial
/// while it still had a token): each token of unused budget turns at most one
/// denial into a false one, so false denials count the requests a perfect
/// global limiter would have admitted on top.
#[derive(Clone, Debug)]
struct Ledger {
    credit: i128,
    shadow: i128,
    ts: u64,
    limit: i128,
    window: i128,
    min_credit: i128,
}

impl Ledger {
    fn new(limit: u64, window_ms: u64) -> Self {
        let cap = limit as i128 * window_ms as i128;
        Ledger {
            credit: cap,
            shadow: cap,
            ts: 0,
            limit: limit as i128,
            window: window_ms as i128,
            min_credit: cap,
        }
    }
    fn at(&mut self, now: u64) {
        if now > self.ts {
            let cap = self.limit * self.window;
            let refill = (now - self.ts) as i128 * self.limit;
            self.credit = (self.credit + refill).min(cap);
            self.shadow = (self.shadow + refill).min(cap);
            self.ts = now;
        }
    }
    fn admit(&mut self) {
        self.credit -= self.window;
        self.shadow -= self.window;
        self.min_credit = self.min_credit.min(self.credit);
    }
    /// A denial: true if the budget could have paid for it (a false denial).
    fn deny(&mut self) -> bool {
        if self.shadow >= self.window {
            self.shadow -= self.window;
            true
        } else {
            false
        }
    }
    fn overshoot(&self) -> u64 {
        if self.min_credit >= 0 {
            0
        } else {
            ((-self.min_credit + self.window - 1) / self.window) as u64
        }
    }
}

/// How a fleet keeps time.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Time {
    Virtual,
    Real,
}

/// One strategy's fleet: a limiter per running instance.
struct Fleet {
    strategy: Strategy,
    base: Config,
    time: Time,
    rtt_ns: u64,
    limiters: BTreeMap<u32, Limiter>,
    retired_calls: u64,
    ledgers: Vec<Ledger>,
    result: StrategyResult,
}

fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

impl Fleet {
    fn new(strategy: Strategy, common: &Config, opts: &Options, time: Time, keys: usize, bins: usize) -> Self {
        let shape = &opts.shape;
        let run = format!("{}x{}", std::process::id(), unique());
        let mut base = common.clone();
        match strategy {
            Strategy::PerInstance => {
                base.mode = Mode::Local;
                base.expected_replicas = 1;
            }
            Strategy::StaticShare => {
                base.mode = Mode::Local;
                base.expected_replicas = shape.instances;
            }
            Strategy::Exact => base.mode = Mode::Exact,
            Strategy::Leased => {
                base.mode = Mode::Lease;
                base.lease_size = Some(base.lease_size.unwrap_or(default_lease_size(shape.limit)));
            }
            Strategy::Adaptive => {
                base.mode = Mode::Lease;
                base.lease_size = None;
                base.refill_threshold = None;
            }
        }
        match &opts.redis {
            Some(url) if time == Time::Real => {
                base.url = url.clone();
                base.key_prefix = format!("qlsim{run}{strategy:?}").to_lowercase();
            }
            _ => base.url = format!("memory://quotalease-sim-{run}-{strategy:?}"),
        }
        Fleet {
            strategy,
            base,
            time,
            rtt_ns: (opts.rtt_ms * 1e6) as u64,
            limiters: BTreeMap::new(),
            retired_calls: 0,
            ledgers: vec![Ledger::new(shape.limit, shape.window_ms); keys],
            result: StrategyResult {
                strategy,
                keys: vec![KeyStats::default(); keys],
                authority_calls: 0,
                latency: Histogram::default(),
                bound: None,
                bins: vec![vec![0; bins]; keys],
            },
        }
    }

    fn start(&mut self, id: u32, now: u64) -> Result<(), String> {
        let mut cfg = self.base.clone();
        if self.time == Time::Virtual {
            cfg.clock = ClockKind::Manual {
                start_ms: START_MS + now,
            };
        }
        let l = Limiter::new(cfg).map_err(crate::explain)?;
        self.limiters.insert(id, l);
        Ok(())
    }

    fn stop(&mut self, id: u32, graceful: bool) {
        if let Some(l) = self.limiters.remove(&id) {
            if graceful {
                let _ = l.close();
            }
            self.retired_calls += l.metrics().backend_calls;
        }
    }

    fn advance(&self, ms: u64) -> Result<(), String> {
        for l in self.limiters.values() {
            l.advance_clock(ms).map_err(crate::explain)?;
        }
        Ok(())
    }

    fn sweep(&self) -> Result<(), String> {
        for l in self.limiters.values() {
            l.settle().map_err(crate::explain)?;
        }
        Ok(())
    }

    fn request(&mut self, key: usize, name: &str, instance: u32, now: u64, bin: usize) -> Result<(), String> {
        let l = self
            .limiters
            .get(&instance)
            .ok_or_else(|| format!("internal error: request for instance {instance}, which is not running"))?;
        let (allowed, added_ns) = match self.time {
            Time::Virtual => {
                // Price the network: exact waits one round trip per request;
                // leased only when a request found no local token and had to
                // wait for a lease (prefetches run in the background).
                let local = match self.strategy {
                    Strategy::Leased | Strategy::Adaptive => l.inspect(name).map_err(crate::explain)?.local_tokens,
                    _ => 0,
                };
                let calls_before = l.metrics().backend_calls;
                let d = l.acquire(name, 1).map_err(crate::explain)?;
                let calls = l.metrics().backend_calls - calls_before;
                if !self.strategy.is_local() {
                    self.result.keys[key].calls += calls;
                }
                let added = match self.strategy {
                    Strategy::Exact => self.rtt_ns,
                    Strategy::Leased | Strategy::Adaptive if local == 0 && calls > 0 => self.rtt_ns,
                    _ => 0,
                };
                (d.allowed, added)
            }
            Time::Real => {
                let t0 = Instant::now();
                let d = l.acquire(name, 1).map_err(crate::explain)?;
                (d.allowed, t0.elapsed().as_nanos() as u64)
            }
        };
        self.result.latency.record(added_ns);
        let ledger = &mut self.ledgers[key];
        ledger.at(now);
        let stats = &mut self.result.keys[key];
        if allowed {
            ledger.admit();
            stats.admitted += 1;
            self.result.bins[key][bin] += 1;
        } else {
            stats.denied += 1;
            if ledger.deny() {
                stats.false_denials += 1;
            }
        }
        Ok(())
    }

    fn finish(mut self, lease_size: u64, max_running: u64) -> StrategyResult {
        let live: u64 = self.limiters.values().map(|l| l.metrics().backend_calls).sum();
        // Local strategies only ever call their own in-process bucket.
        if !self.strategy.is_local() {
            self.result.authority_calls = self.retired_calls + live;
        }
        for (k, l) in self.result.keys.iter_mut().zip(&self.ledgers) {
            k.overshoot = l.overshoot();
        }
        self.result.bound = match self.strategy {
            Strategy::Leased => Some(max_running * lease_size),
            // The ledger's bound: one exact token bucket (docs/design.md,
            // "The bound"), whatever the budget, the chunks or the rates.
            Strategy::Adaptive => Some(0),
            Strategy::Exact => Some(0),
            _ => None,
        };
        for l in self.limiters.values() {
            let _ = l.close();
        }
        self.result
    }
}

/// The common configuration, validated (its errors name the CLI's flags).
pub fn base_config(opts: &Options) -> Result<Config, String> {
    let shape = &opts.shape;
    let mut b = Limiter::builder()
        .limit(shape.limit)
        .window_ms(shape.window_ms)
        .lease_ttl_ms(opts.lease_ttl_ms)
        .expected_replicas(shape.instances.max(1));
    if let Some(n) = opts.lease_size {
        b = b.lease_size(n);
    }
    if let Some(n) = opts.refill_threshold {
        b = b.refill_threshold(n);
    }
    let probe = b.clone().build().map_err(crate::explain)?;
    if let Some(url) = &opts.redis {
        b.url(url.clone()).build().map_err(crate::explain)?;
    }
    // The validated result, which the strategies then vary field by field.
    Ok(probe.config().clone())
}

/// Chart bin width for a run: about 60 bins, at least one second.
pub fn bin_ms(duration_ms: u64) -> u64 {
    (duration_ms / 60).max(1000).div_ceil(1000) * 1000
}

/// Run the scenario through every strategy.
pub fn run(opts: &Options) -> Result<Report, String> {
    let wall = Instant::now();
    let common = base_config(opts)?;
    let probe = Limiter::new(common.clone()).map_err(crate::explain)?;
    let (lease_size, refill_threshold) = (
        probe.lease_size(),
        opts.refill_threshold.unwrap_or((probe.lease_size() / 4).max(1)),
    );
    drop(probe);
    let shape = &opts.shape;
    let scenario = Scenario::build(shape);
    let nkeys = scenario.keys.len();
    let bin_ms = bin_ms(shape.duration_ms);
    let nbins = shape.duration_ms.div_ceil(bin_ms).max(1) as usize;

    // The allowance: one exact global bucket with no latency, per key.
    let policy = Quota::new(shape.limit, shape.window_ms);
    let mut ideal = vec![BucketState::full(policy, 0); nkeys];
    let mut allowance = vec![0u64; nkeys];
    let mut demand_bins = vec![vec![0u64; nbins]; nkeys];
    for e in &scenario.events {
        if let Kind::Request { key, .. } = e.kind {
            if ideal[key].take(policy, 1, 1, e.t).granted > 0 {
                allowance[key] += 1;
            }
            demand_bins[key][(e.t / bin_ms) as usize] += 1;
        }
    }

    let (time, strategies): (Time, &[Strategy]) = match opts.redis {
        Some(_) => (Time::Real, &[Strategy::Exact, Strategy::Leased, Strategy::Adaptive]),
        None => (Time::Virtual, &Strategy::ALL),
    };
    #[cfg(feature = "redis")]
    if let Some(url) = &opts.redis {
        crate::redis_util::ping(url)?;
    }
    let mut fleets: Vec<Fleet> = strategies
        .iter()
        .map(|s| Fleet::new(*s, &common, opts, time, nkeys, nbins))
        .collect();
    let sweep_ms = quotalease::internals::TUNING.sweep_ms(opts.lease_ttl_ms);
    let mut now = 0u64;
    let mut next_sweep = sweep_ms;
    let start = Instant::now();
    let mut progress = (time == Time::Real && opts.progress).then(|| Progress::new(shape.duration_ms));
    let names: Vec<&str> = scenario.keys.iter().map(|k| k.name).collect();
    for e in &scenario.events {
        match time {
            Time::Virtual => {
                while next_sweep <= e.t {
                    for f in &fleets {
                        f.advance(next_sweep - now)?;
                        f.sweep()?;
                    }
                    now = next_sweep;
                    next_sweep += sweep_ms;
                }
                if e.t > now {
                    for f in &fleets {
                        f.advance(e.t - now)?;
                    }
                    now = e.t;
                }
            }
            Time::Real => {
                let due = start + Duration::from_millis(e.t);
                let wait = due.saturating_duration_since(Instant::now());
                if let Some(p) = progress.as_mut() {
                    p.wait_until(due, start, &fleets_summary(&fleets));
                } else if !wait.is_zero() {
                    // Pacing the traffic to its schedule.
                    std::thread::sleep(wait);
                }
                now = start.elapsed().as_millis() as u64;
            }
        }
        let ledger_now = match time {
            Time::Virtual => e.t,
            Time::Real => now,
        };
        for f in fleets.iter_mut() {
            match e.kind {
                Kind::Start(id) => f.start(id, e.t)?,
                Kind::Stop { id, graceful } => f.stop(id, graceful),
                Kind::Idle(_) | Kind::Busy(_) => {}
                Kind::Request { key, instance } => {
                    let bin = ((e.t / bin_ms) as usize).min(nbins - 1);
                    f.request(key, names[key], instance, ledger_now, bin)?;
                }
            }
        }
    }
    if let Some(p) = progress.as_mut() {
        p.finish(&fleets_summary(&fleets));
    }
    let results = fleets
        .into_iter()
        .map(|f| f.finish(lease_size, scenario.max_running))
        .collect();
    Ok(Report {
        scenario,
        lease_size,
        refill_threshold,
        lease_ttl_ms: opts.lease_ttl_ms,
        rtt_ms: opts.rtt_ms,
        redis: opts.redis.clone(),
        allowance,
        demand_bins,
        bin_ms,
        results,
        elapsed: wall.elapsed(),
    })
}

fn fleets_summary(fleets: &[Fleet]) -> String {
    fleets
        .iter()
        .map(|f| {
            let a: u64 = f.result.keys.iter().map(|k| k.admitted).sum();
            format!("{} {a}", f.strategy.name().split(' ').next().unwrap_or(""))
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_tracks_debt_and_refill() {
        let mut l = Ledger::new(2, 1000);
        l.admit();
        l.admit();
        l.admit();
        assert_eq!(l.overshoot(), 1);
        l.at(500); // +1 token: back to 0
        assert!(!l.deny());
        l.at(1000); // +1 token
        assert!(l.deny(), "a token was there: a false denial");
        assert!(!l.deny(), "that token is counted once");
        l.at(10_000);
        assert_eq!(l.credit, 2000, "capped at capacity");
        assert_eq!(l.overshoot(), 1, "the worst debt is remembered");
    }

    #[test]
    fn bins() {
        assert_eq!(bin_ms(300_000), 5_000);
        assert_eq!(bin_ms(10_000), 1_000);
        assert_eq!(bin_ms(100_000), 2_000);
    }
}
