//! The `quotalease` command: `simulate` (the multi-instance problem and the
//! leasing fix, side by side), `inspect` (a key's bucket in Redis) and
//! `bench` (quotalease's lease and exact modes against a per-request GCRA
//! script, on one Redis) and `top` (the busiest keys in a Redis, live).
#![warn(missing_docs)]

#[cfg(feature = "redis")]
pub mod bench;
pub mod chart;
pub mod dist;
#[cfg(feature = "redis")]
pub mod gcra;
pub mod histogram;
#[cfg(feature = "redis")]
pub mod inspect;
#[cfg(feature = "redis")]
pub mod peers_chart;
#[cfg(feature = "redis")]
pub mod policy;
mod progress;
#[cfg(feature = "redis")]
pub mod redis_util;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod sim;
#[cfg(feature = "redis")]
pub mod stored;
#[cfg(feature = "redis")]
pub mod top;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The environment variable `inspect`, `top`, `bench` and `policy` read the
/// Redis URL from when `--redis` is not given (`simulate` does not: it would
/// turn the demo into a real-time run against that Redis).
pub const REDIS_URL_ENV: &str = "QUOTALEASE_REDIS_URL";

/// The Redis URL a subcommand was given (`--redis`, else [`REDIS_URL_ENV`],
/// which clap reads), or the error naming both.
pub fn redis_url(given: &Option<String>) -> Result<&str, String> {
    match given.as_deref() {
        Some(url) if !url.trim().is_empty() => Ok(url),
        _ => Err(format!(
            "no Redis URL: give --redis URL (e.g. --redis redis://127.0.0.1:6379) or set {REDIS_URL_ENV}"
        )),
    }
}

impl Cli {
    /// A usage error the parser cannot see: a Redis subcommand without a URL
    /// (neither `--redis` nor [`REDIS_URL_ENV`]).
    pub fn missing_redis(&self) -> Option<String> {
        let given = match &self.command {
            Command::Simulate(_) => return None,
            Command::Inspect(a) => &a.redis,
            Command::Bench(a) => &a.redis,
            Command::Top(a) => &a.redis,
            Command::Policy(a) => &a.redis,
        };
        redis_url(given).err()
    }
}

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "quotalease",
    version,
    about = "Distributed rate limiting by quota leasing: simulate, inspect, bench",
    long_about = "Distributed rate limiting by quota leasing.\n\n\
        `quotalease simulate` shows, with no Redis, why a per-instance limit lets N times the\n\
        limit through, why limit/N denies early, and what leasing does instead."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a fleet scenario (instances scaling out and in, an idle instance, three keys)
    /// through five strategies and print the table and a chart.
    Simulate(SimulateArgs),
    /// Show a key's authoritative bucket in Redis (tokens, last refill, TTL).
    Inspect(InspectArgs),
    /// Load generator: threads deciding requests against one Redis with quotalease's lease
    /// and exact modes and a per-request GCRA Lua script, on the same key sequences.
    Bench(BenchArgs),
    /// Live view of the busiest keys in one Redis (granted/offered/denied per second,
    /// holders, stored tokens, fallback rates), refreshed every second.
    Top(TopArgs),
    /// The shared policy store in Redis: plan tiers and per-key entries
    /// (set, get, delete, list), validated as every limiter validates them.
    Policy(PolicyCmdArgs),
}

/// `quotalease policy`.
#[derive(Args, Debug, Clone)]
pub struct PolicyCmdArgs {
    /// Redis URL (redis://host:port or rediss://).
    #[arg(long, global = true, env = REDIS_URL_ENV, hide_env_values = true)]
    pub redis: Option<String>,
    /// The limiters' key_prefix.
    #[arg(long, global = true, default_value = "ql")]
    pub key_prefix: String,
    /// What to do.
    #[command(subcommand)]
    pub action: PolicyAction,
}

/// A tier (`--tier NAME`) or a key (`--key KEY`).
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct PolicyTarget {
    /// A plan tier's name.
    #[arg(long)]
    pub tier: Option<String>,
    /// A key, as the application passes it to acquire.
    #[arg(long)]
    pub key: Option<String>,
}

#[cfg(feature = "redis")]
impl PolicyTarget {
    fn split(&self) -> (bool, String) {
        match (&self.tier, &self.key) {
            (Some(t), _) => (true, t.clone()),
            (None, Some(k)) => (false, k.clone()),
            (None, None) => (true, String::new()),
        }
    }
}

/// `quotalease policy` actions.
#[derive(Subcommand, Debug, Clone)]
pub enum PolicyAction {
    /// Define a tier (`--tier pro "6000/min, 1000000/day"`) or give a key its own
    /// entry (`--key user:42 tier:pro`, rules `--key user:7 "10/s, 100/day"`, or
    /// `unlimited` / `blocked`). Rules that begin with `shadow` are in shadow mode.
    Set {
        #[command(flatten)]
        #[allow(missing_docs)]
        target: PolicyTarget,
        /// Rules ("10/s, 10000/day", "shadow 50/min"), or for a key also
        /// tier:NAME, unlimited or blocked.
        value: String,
    },
    /// A tier's definition, or a key's entry and the rules it gets.
    Get {
        #[command(flatten)]
        #[allow(missing_docs)]
        target: PolicyTarget,
    },
    /// Remove a tier or a key's entry.
    Delete {
        #[command(flatten)]
        #[allow(missing_docs)]
        target: PolicyTarget,
    },
    /// Every tier and key entry in the store.
    List,
}

/// `limit` and `window_ms`, or a rate.
#[derive(Args, Debug, Clone)]
pub struct PolicyArgs {
    /// Tokens per window for every key.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Window in milliseconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub window_ms: Option<u64>,
    /// Limit and window as a rate: 600/min, 10/s, 100/30s, 5000/hour.
    #[arg(long, value_parser = parse_rate, conflicts_with_all = ["limit", "window_ms"])]
    pub rate: Option<(u64, u64)>,
}

impl PolicyArgs {
    /// The policy, with defaults for what was not given; `None` if nothing was.
    pub fn resolve(&self, default_limit: Option<u64>, default_window: u64) -> Result<Option<(u64, u64)>, String> {
        if let Some(r) = self.rate {
            return Ok(Some(r));
        }
        let limit = match (self.limit, default_limit) {
            (Some(l), _) | (None, Some(l)) => l,
            (None, None) if self.window_ms.is_some() => {
                return Err("--window-ms needs --limit (or use --rate, such as 600/min)".into())
            }
            (None, None) => return Ok(None),
        };
        let window = self.window_ms.unwrap_or(default_window);
        quotalease::validate_policy(limit, window).map_err(explain)?;
        Ok(Some((limit, window)))
    }
}

/// `quotalease simulate`.
#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Most instances running at once (the fleet scales between about half and this).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=200))]
    pub instances: u64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub policy: PolicyArgs,
    /// Tokens per lease [default: 2 % of the limit, between 1 and 20].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_size: Option<u64>,
    /// Prefetch when local tokens drop below this [default: lease size / 4, at least 1].
    #[arg(long, alias = "threshold")]
    pub refill_threshold: Option<u64>,
    /// Give back leased tokens unused this long (ms).
    #[arg(long, alias = "ttl-ms", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_ttl_ms: u64,
    /// Load-balancer skew: the instance of rank r gets a share of 1/(r+1)^skew of a key's traffic (0 = even).
    #[arg(long, default_value_t = 1.0, value_parser = parse_skew)]
    pub skew: f64,
    /// How much traffic to simulate: 300s, 5m, 90s, 1500ms [default: 5m; 30s with --redis, in real time].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<u64>,
    /// Seed of the traffic (same seed, same run).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Round-trip time to the authority used to price its calls (ms; virtual time only).
    #[arg(long, default_value_t = 1.0, value_parser = parse_rtt)]
    pub rtt_ms: f64,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "target/quotalease-demo.svg")]
    pub chart: PathBuf,
    /// Do not write a chart.
    #[arg(long)]
    pub no_chart: bool,
    /// Run the exact, fixed-lease and adaptive strategies against this Redis in real time (redis://host:port).
    #[arg(long)]
    pub redis: Option<String>,
    /// No progress bar (real time only).
    #[arg(long)]
    pub no_progress: bool,
}

/// `quotalease inspect`.
#[derive(Args, Debug, Clone)]
pub struct InspectArgs {
    /// Redis URL (redis://host:port).
    #[arg(long, env = REDIS_URL_ENV, hide_env_values = true)]
    pub redis: Option<String>,
    /// The key, as the application passes it to acquire.
    pub key: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub policy: PolicyArgs,
    /// The limiter's key_prefix.
    #[arg(long, default_value = "ql")]
    pub key_prefix: String,
}

/// `quotalease top`.
#[derive(Args, Debug, Clone)]
pub struct TopArgs {
    /// Redis URL (redis://host:port or rediss://).
    #[arg(long, env = REDIS_URL_ENV, hide_env_values = true)]
    pub redis: Option<String>,
    /// The keys' policy: granted/s and denied/s of fixed-lease keys (adaptive keys store their limit).
    #[command(flatten)]
    #[allow(missing_docs)]
    pub policy: PolicyArgs,
    /// The limiters' key_prefix.
    #[arg(long, default_value = "ql")]
    pub key_prefix: String,
    /// Keys shown.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub rows: u64,
    /// Keys read per frame at most (one pipelined round trip).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub budget: u64,
    /// SCAN steps per frame at most (each SCAN ... COUNT --scan-count).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub scan_calls: u64,
    /// COUNT of each SCAN step.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub scan_count: u64,
    /// Milliseconds between frames.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
    pub interval_ms: u64,
    /// Stop after this many frames (0: run until interrupted).
    #[arg(long, default_value_t = 0)]
    pub frames: u64,
}

/// `quotalease bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Redis URL (redis://host:port).
    #[arg(long, env = REDIS_URL_ENV, hide_env_values = true)]
    pub redis: Option<String>,
    /// Threads deciding requests (each GCRA thread has its own Redis connection).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=512))]
    pub threads: u64,
    /// Run time per strategy and distribution: 5s, 500ms, 1m.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: u64,
    /// Distinct keys (round-robin and zipf; hot uses one).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub keys: u64,
    /// Key distributions to run, each with all three strategies: hot = every request on one key,
    /// zipf = Zipf s=1.1 over --keys, round-robin = each thread walks all keys. Comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "round-robin")]
    pub dist: Vec<dist::Dist>,
    /// Seed of the Zipf key sequences (same seed, same sequences).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub policy: PolicyArgs,
    /// Tokens per lease [default: 2 % of the limit, between 1 and 20].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_size: Option<u64>,
    /// Prefetch when local tokens drop below this [default: lease size / 4, at least 1].
    #[arg(long)]
    pub refill_threshold: Option<u64>,
    /// Also write an SVG bar chart of the run here.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Print Markdown tables instead of aligned text.
    #[arg(long)]
    pub markdown: bool,
}

/// A library error in the CLI's words: configuration fields become flags.
pub fn explain(e: quotalease::Error) -> String {
    match e {
        quotalease::Error::Config { field, reason } => {
            let flag = match field {
                "limit" => "--limit",
                "window_ms" => "--window-ms",
                "rate" => "--rate",
                "lease_size" => "--lease-size",
                "refill_threshold" => "--refill-threshold",
                "lease_ttl_ms" => "--lease-ttl-ms",
                "url" => "--redis",
                "key_prefix" => "--key-prefix",
                "expected_replicas" => "--instances",
                other => other,
            };
            format!("{flag} {reason}")
        }
        other => other.to_string(),
    }
}

/// Parse `600/min` into (limit, window_ms).
pub fn parse_rate(s: &str) -> Result<(u64, u64), String> {
    quotalease::parse_rate(s).map_err(|e| match e {
        quotalease::Error::Config { reason, .. } => reason,
        e => e.to_string(),
    })
}

/// Parse `300s`, `5m`, `1500ms`, `1h` or a bare number of seconds into ms.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a duration; use 300s, 5m, 1500ms or 1h");
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n.parse().map_err(|_| bad())?;
    let ms = match unit.trim() {
        "" | "s" | "sec" => n * 1000.0,
        "ms" => n,
        "m" | "min" => n * 60_000.0,
        "h" => n * 3_600_000.0,
        _ => return Err(bad()),
    };
    if !(1.0..=7.0 * 86_400_000.0).contains(&ms) {
        return Err(format!("{s:?} must be between 1ms and 7 days"));
    }
    Ok(ms.round() as u64)
}

fn parse_skew(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=10.0).contains(&v) {
        return Err(format!("{v} must be between 0 (even spread) and 10"));
    }
    Ok(v)
}

fn parse_rtt(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of milliseconds"))?;
    if !(0.0..=10_000.0).contains(&v) {
        return Err(format!("{v} must be between 0 and 10000 ms"));
    }
    Ok(v)
}

/// Most requests a virtual run may generate (memory and time stay small).
pub const MAX_VIRTUAL_REQUESTS: f64 = 20_000_000.0;
/// Most requests per second a real-time run may ask for (one thread paces them).
pub const MAX_REAL_RATE: f64 = 5_000.0;

/// Turn `simulate`'s arguments into options, checking every value.
pub fn simulate_options(a: &SimulateArgs) -> Result<sim::Options, String> {
    let (limit, window_ms) = a.policy.resolve(Some(600), 60_000)?.unwrap_or((600, 60_000));
    let duration_ms = a.duration.unwrap_or(if a.redis.is_some() { 30_000 } else { 300_000 });
    let shape = scenario::Shape {
        instances: a.instances,
        limit,
        window_ms,
        skew: a.skew,
        duration_ms,
        seed: a.seed,
    };
    let per_s: f64 = scenario::keys()
        .iter()
        .map(|k| k.base * limit as f64 * 1000.0 / window_ms as f64)
        .sum();
    let total = per_s * duration_ms as f64 / 1000.0;
    if a.redis.is_some() && per_s > MAX_REAL_RATE {
        return Err(format!(
            "with --redis the scenario runs in real time and would send {per_s:.0} requests/s \
             (the whale key asks for 10x its limit); keep it under {MAX_REAL_RATE:.0}/s with a lower --limit or a longer --window-ms"
        ));
    }
    if total > MAX_VIRTUAL_REQUESTS {
        return Err(format!(
            "this would simulate about {total:.0} requests (the whale key asks for 10x its limit); \
             keep it under {MAX_VIRTUAL_REQUESTS:.0} with a lower --limit, a longer --window-ms or a shorter --duration"
        ));
    }
    let opts = sim::Options {
        shape,
        lease_size: a.lease_size,
        refill_threshold: a.refill_threshold,
        lease_ttl_ms: a.lease_ttl_ms,
        rtt_ms: a.rtt_ms,
        redis: a.redis.clone(),
        progress: !a.no_progress,
    };
    sim::base_config(&opts)?;
    Ok(opts)
}

fn simulate(a: &SimulateArgs) -> Result<(), String> {
    let opts = simulate_options(a)?;
    let report = sim::run(&opts)?;
    print!("{}", report::render(&report));
    if !a.no_chart {
        let svg = chart::svg(&report);
        write_chart(&a.chart, &svg)?;
        println!("\nchart: {} (open it in a browser)", a.chart.display());
    }
    Ok(())
}

/// Write `svg` to `path`, creating its directory.
fn write_chart(path: &std::path::Path, svg: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {} for the chart: {e}", dir.display()))?;
    }
    std::fs::write(path, svg).map_err(|e| format!("cannot write the chart to {}: {e}", path.display()))
}

#[cfg(not(feature = "redis"))]
const NO_REDIS: &str = "this quotalease was built without Redis support (make demo builds it so); \
     build it with `cargo build --release -p quotalease-cli` to use inspect, policy, top, bench and simulate --redis";

#[cfg(not(feature = "redis"))]
fn inspect(_a: &InspectArgs) -> Result<(), String> {
    Err(NO_REDIS.into())
}

#[cfg(not(feature = "redis"))]
fn bench(_a: &BenchArgs) -> Result<(), String> {
    Err(NO_REDIS.into())
}

#[cfg(not(feature = "redis"))]
fn top(_a: &TopArgs) -> Result<(), String> {
    Err(NO_REDIS.into())
}

#[cfg(not(feature = "redis"))]
fn policy_cmd(_a: &PolicyCmdArgs) -> Result<(), String> {
    Err(NO_REDIS.into())
}

#[cfg(feature = "redis")]
fn policy_cmd(a: &PolicyCmdArgs) -> Result<(), String> {
    let action = match &a.action {
        PolicyAction::Set { target, value } => {
            let (tier, name) = target.split();
            policy::Action::Set {
                tier,
                name,
                value: value.clone(),
            }
        }
        PolicyAction::Get { target } => {
            let (tier, name) = target.split();
            policy::Action::Get { tier, name }
        }
        PolicyAction::Delete { target } => {
            let (tier, name) = target.split();
            policy::Action::Delete { tier, name }
        }
        PolicyAction::List => policy::Action::List,
    };
    print!("{}", policy::run(redis_url(&a.redis)?, &a.key_prefix, &action)?);
    Ok(())
}

#[cfg(feature = "redis")]
fn top(a: &TopArgs) -> Result<(), String> {
    use std::io::{IsTerminal, Write};
    let o = top::Options {
        redis: redis_url(&a.redis)?.to_string(),
        key_prefix: a.key_prefix.clone(),
        policy: a.policy.resolve(None, 60_000)?,
        rows: a.rows as usize,
        scan_count: a.scan_count,
        scan_calls: a.scan_calls as usize,
        budget: a.budget as usize,
        max_tracked: 100_000,
    };
    let mut sampler = top::Sampler::new(o.clone())?;
    let tty = std::io::stdout().is_terminal();
    // $COLUMNS when the shell exports it; the table needs about 100 columns.
    let width = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100);
    let mut n = 0;
    loop {
        let started = std::time::Instant::now();
        let frame = sampler.frame(None);
        let text = top::render(&o, &frame, width);
        let mut out = std::io::stdout().lock();
        // A terminal gets the frame in place; a pipe gets frames one after another.
        let _ = write!(out, "{}{text}", if tty { "\x1b[H\x1b[2J" } else { "" });
        if !tty {
            let _ = writeln!(out);
        }
        let _ = out.flush();
        n += 1;
        if a.frames != 0 && n >= a.frames {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(a.interval_ms).saturating_sub(started.elapsed()));
    }
}

#[cfg(feature = "redis")]
fn inspect(a: &InspectArgs) -> Result<(), String> {
    let policy = a.policy.resolve(None, 60_000)?;
    let out = inspect::run(&inspect::Options {
        redis: redis_url(&a.redis)?.to_string(),
        key: a.key.clone(),
        policy,
        key_prefix: a.key_prefix.clone(),
    })?;
    print!("{out}");
    Ok(())
}

#[cfg(feature = "redis")]
fn bench(a: &BenchArgs) -> Result<(), String> {
    let (limit, window_ms) = a
        .policy
        .resolve(Some(1_000_000_000), 1_000)?
        .unwrap_or((1_000_000_000, 1_000));
    let (result, out) = bench::run(
        &bench::Options {
            redis: redis_url(&a.redis)?.to_string(),
            threads: a.threads as usize,
            duration_ms: a.duration,
            keys: a.keys,
            limit,
            window_ms,
            lease_size: a.lease_size,
            refill_threshold: a.refill_threshold,
            dists: a.dist.clone(),
            seed: a.seed,
        },
        a.markdown,
    )?;
    print!("{out}");
    if let Some(path) = &a.chart {
        write_chart(path, &peers_chart::svg(&result))?;
        eprintln!("chart: {}", path.display());
    }
    Ok(())
}

/// Run a parsed command line.
pub fn run(cli: &Cli) -> Result<(), String> {
    match &cli.command {
        Command::Simulate(a) => simulate(a),
        Command::Inspect(a) => inspect(a),
        Command::Bench(a) => bench(a),
        Command::Top(a) => top(a),
        Command::Policy(a) => policy_cmd(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300s"), Ok(300_000));
        assert_eq!(parse_duration("5m"), Ok(300_000));
        assert_eq!(parse_duration("1500ms"), Ok(1500));
        assert_eq!(parse_duration("2"), Ok(2000));
        assert_eq!(parse_duration("0.5s"), Ok(500));
        for bad in ["", "s", "5 fortnights", "-1s", "0s", "9999h", "1e400s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn config_errors_name_flags() {
        let e = quotalease::Limiter::builder().limit(10).lease_size(11).build();
        let msg = explain(e.unwrap_err());
        assert!(
            msg.starts_with("--lease-size must be between 1 and limit (10)"),
            "{msg}"
        );
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
