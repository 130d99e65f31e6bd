//! Shared by the integration tests (the core's, and the CLI's through a
//! `#[path]` module): real redis-server processes, clusters and fault proxies
//! through the project's harness scripts in `tests/harness/`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// A command running one of the harness scripts (`redisctl`, `faultproxy`)
/// with this suite's own state directory, so no other suite's stop-all
/// touches its servers.
fn harness(script: &str) -> Command {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/harness")
        .join(script);
    let state = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(concat!("harness-", env!("CARGO_PKG_NAME")));
    let mut cmd = Command::new(path);
    cmd.env("QUOTALEASE_HARNESS_STATE", state);
    cmd
}

/// Run a harness script; its stdout, trimmed. Panics with its stderr on failure.
fn run_harness(script: &str, args: &[&str]) -> String {
    let out = harness(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run tests/harness/{script}: {e}"));
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}\n(is redis-server installed? `make test` installs it; or `apt-get install redis-server`)",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn redisctl(args: &[&str]) -> String {
    run_harness("redisctl", args)
}

/// Best effort, for Drop: never panics.
fn quietly(script: &str, args: &[&str]) {
    let _ = harness(script).args(args).output();
}

/// The Redis tests' switch. With `QUOTALEASE_REQUIRE_REDIS=1` (what `make test`
/// and CI set) every Redis test runs, and one without a redis-server fails. Without
/// it, a Redis test on a machine with no `redis-server` on PATH (or none at
/// `QUOTALEASE_REDIS_SERVER`, redisctl's override) is skipped, saying so on stderr,
/// so `cargo test` on a fresh clone runs every test that needs no Redis and passes.
/// True when the calling test must skip.
pub fn skip_without_redis() -> bool {
    redis_skipped("skipped")
}

/// [`skip_without_redis`], saying `what` was skipped.
fn redis_skipped(what: &str) -> bool {
    let required = std::env::var("QUOTALEASE_REQUIRE_REDIS").is_ok_and(|v| !v.is_empty() && v != "0");
    if required || redis_server_installed() {
        return false;
    }
    // Straight to stderr: the test harness captures eprintln! of a passing test,
    // and a skip must be seen.
    use std::io::Write as _;
    let test = std::thread::current().name().unwrap_or("a Redis test").to_string();
    let _ = writeln!(
        std::io::stderr(),
        "{test}: {what}: no redis-server (set QUOTALEASE_REQUIRE_REDIS=1 to fail instead)"
    );
    true
}

/// Whether the redis-server redisctl would run exists.
fn redis_server_installed() -> bool {
    let program = std::env::var_os("QUOTALEASE_REDIS_SERVER").unwrap_or_else(|| "redis-server".into());
    let program = std::path::Path::new(&program);
    let runnable = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt as _;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return runnable(program);
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| runnable(&dir.join(program))))
}

/// [`skip_without_redis`] for a test that has more to check without Redis:
/// it says "its Redis part skipped: ...".
pub fn redis_part_skipped() -> bool {
    redis_skipped("its Redis part skipped")
}

/// `start()` of a harness server (`RedisServer::start`, `RedisCluster::start`,
/// ...), or None when [`redis_part_skipped`].
pub fn redis_or_none<T>(start: impl FnOnce() -> T) -> Option<T> {
    (!redis_part_skipped()).then(start)
}

/// `let server = common::redis_or_skip!(RedisServer::start());`: the server,
/// or a return from the calling test when [`skip_without_redis`] says to skip.
/// Every test that needs a redis-server obtains it this way (or through
/// [`redis_or_none`]).
#[allow(unused_macros)] // in a suite with no Redis test
macro_rules! redis_or_skip {
    ($start:expr) => {
        match $crate::common::skip_without_redis() {
            true => return,
            false => $start,
        }
    };
}
#[allow(unused_imports)]
pub(crate) use redis_or_skip;

/// A real redis-server on a free loopback port, stopped on drop.
pub struct RedisServer {
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> Self {
        let port = redisctl(&["start"]).parse().expect("redisctl start prints a port");
        RedisServer { port }
    }
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
    fn ctl(&self, cmd: &str) {
        redisctl(&[cmd, &self.port.to_string()]);
    }
    pub fn kill(&self) {
        self.ctl("kill")
    }
    pub fn pause(&self) {
        self.ctl("pause")
    }
    pub fn resume(&self) {
        self.ctl("resume")
    }
    /// Kill and start again on the same port with empty data.
    pub fn restart(&self) {
        self.ctl("restart")
    }
    /// Run a redis-cli command against this server.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        quietly("redisctl", &["stop", &self.port.to_string()]);
    }
}

/// A real redis-server that also serves TLS with a self-signed certificate.
pub struct TlsRedisServer {
    pub plain: RedisServer,
    pub tls_port: u16,
    pub ca_file: String,
}

impl TlsRedisServer {
    pub fn start() -> Self {
        let out = redisctl(&["start-tls"]);
        let parts: Vec<&str> = out.split_whitespace().collect();
        TlsRedisServer {
            plain: RedisServer {
                port: parts[0].parse().unwrap(),
            },
            tls_port: parts[1].parse().unwrap(),
            ca_file: parts[2].to_string(),
        }
    }
}

/// The whole tokens a stored bucket value (`GET {prefix}:{key}` from
/// redis-cli: "credit refilled_at window epoch version", credit in 1/window
/// token units) holds, read with the core's codec; panics on anything else.
pub fn stored_tokens(value: &str) -> u64 {
    assert_eq!(value.split(' ').count(), 5, "not a stored bucket: {value:?}");
    quotalease::internals::stored::Bucket::parse(value)
        .tokens()
        .unwrap_or_else(|| panic!("not a stored bucket: {value:?}"))
}

/// Runs `test` with a builder on a manual clock starting at `start_ms`
/// (a prefix of its own set), once on a `memory://NAME` authority and once
/// on a redis-server when one is there (`QUOTALEASE_REQUIRE_REDIS=1` makes
/// it required); the first argument names the authority.
pub fn each_authority(start_ms: u64, test: impl Fn(&str, quotalease::Builder)) {
    let base = || {
        quotalease::Limiter::builder()
            .clock(quotalease::ClockKind::Manual { start_ms })
            .key_prefix(unique("auth"))
    };
    test("memory", base().url(format!("memory://{}", unique("auth"))));
    if let Some(server) = redis_or_none(RedisServer::start) {
        test("redis", base().url(server.url()));
    }
}

/// A prefix no other test uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}{}x{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Poll `cond` until it holds (bounded at 30 s, a hang guard, not a timing assertion).
pub fn await_cond(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A real local Redis Cluster (3 masters, 1 replica each), stopped on drop.
pub struct RedisCluster {
    pub ports: Vec<u16>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let ports = redisctl(&["cluster-start", "3", "1"])
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        RedisCluster { ports }
    }
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports[..3].iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
    pub fn masters(&self) -> &[u16] {
        &self.ports[..3]
    }
    /// Promote a replica of `master` (a graceful CLUSTER FAILOVER); returns the new master.
    pub fn failover(&self, master: u16) -> u16 {
        let replica: u16 = redisctl(&["cluster-replica-of", &master.to_string()]).parse().unwrap();
        redisctl(&["failover", &replica.to_string()]);
        replica
    }
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        quietly("redisctl", &["cluster-stop", &self.ports[0].to_string()]);
    }
}

/// tests/harness/faultproxy in front of a server: latency, black hole, resets.
pub struct FaultProxy {
    pub port: u16,
}

fn faultproxy(args: &[&str]) -> String {
    run_harness("faultproxy", args)
}

impl FaultProxy {
    pub fn start(target: u16) -> Self {
        let port = faultproxy(&["start", &target.to_string()]).parse().unwrap();
        FaultProxy { port }
    }
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
    /// `pass`, `latency MS`, `drop` or `reset`.
    pub fn set(&self, mode: &str) {
        let mut args = vec!["set".to_string(), self.port.to_string()];
        args.extend(mode.split_whitespace().map(str::to_string));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        faultproxy(&args);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        quietly("faultproxy", &["stop", &self.port.to_string()]);
    }
}

/// A primary, one replica and three sentinels monitoring it as `mymaster`
/// (tests/harness/redisctl sentinel-start), stopped on drop.
pub struct SentinelGroup {
    /// Primary and replica as started, then the three sentinels.
    pub ports: Vec<u16>,
}

impl SentinelGroup {
    pub const SERVICE: &'static str = "mymaster";

    pub fn start() -> Self {
        let ports: Vec<u16> = redisctl(&["sentinel-start", Self::SERVICE])
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(ports.len(), 5, "sentinel-start prints 5 ports: {ports:?}");
        SentinelGroup { ports }
    }
    pub fn sentinels(&self) -> &[u16] {
        &self.ports[2..]
    }
    /// `redis+sentinel://` with every sentinel, then `tail` (`/db`, `?options`).
    pub fn url_with(&self, userinfo: &str, tail: &str) -> String {
        let hosts: Vec<String> = self.sentinels().iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+sentinel://{userinfo}{}/{}{tail}", hosts.join(","), Self::SERVICE)
    }
    pub fn url(&self) -> String {
        self.url_with("", "")
    }
    /// The port every live sentinel names as the primary, once it is not `not`.
    pub fn primary(&self, not: Option<u16>) -> u16 {
        let first = self.ports[0].to_string();
        let not = not.map(|p| p.to_string());
        let mut args = vec!["sentinel-primary", first.as_str()];
        args.extend(not.as_deref());
        redisctl(&args).parse().unwrap()
    }
    /// SENTINEL FAILOVER, waiting until the old primary replicates the new one.
    pub fn failover(&self) -> u16 {
        redisctl(&["sentinel-failover", &self.ports[0].to_string()])
            .parse()
            .unwrap()
    }
    /// SIGKILL one of the group's servers.
    pub fn kill(&self, port: u16) {
        redisctl(&["kill", &port.to_string()]);
    }
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        quietly("redisctl", &["sentinel-stop", &self.ports[0].to_string()]);
    }
}

/// A real redis-server whose TLS port asks every client for a certificate
/// signed by the harness' CA (tests/harness/redisctl start-mtls).
pub struct MtlsRedisServer {
    pub plain: RedisServer,
    pub tls_port: u16,
    pub ca_file: String,
    pub client_cert: String,
    pub client_key: String,
}

impl MtlsRedisServer {
    pub fn start() -> Self {
        let out = redisctl(&["start-mtls"]);
        let parts: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(parts.len(), 5, "start-mtls prints 5 fields: {out}");
        MtlsRedisServer {
            plain: RedisServer {
                port: parts[0].parse().unwrap(),
            },
            tls_port: parts[1].parse().unwrap(),
            ca_file: parts[2].to_string(),
            client_cert: parts[3].to_string(),
            client_key: parts[4].to_string(),
        }
    }
}
