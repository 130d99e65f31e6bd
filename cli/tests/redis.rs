//! `inspect`, `bench` and `simulate --redis` against a real redis-server
//! started by the project's harness.

mod common;

use common::{quotalease, RedisServer};
use quotalease::{Config, Limiter, Mode};

/// A limiter in exact mode: every admitted request takes one token from Redis now.
fn exact(url: &str, prefix: &str, limit: u64, window_ms: u64) -> Limiter {
    Limiter::new(Config {
        url: url.to_string(),
        limit,
        window_ms,
        key_prefix: prefix.to_string(),
        mode: Mode::Exact,
        ..Config::default()
    })
    .unwrap()
}

fn line<'a>(out: &'a str, head: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(head))
        .unwrap_or_else(|| panic!("no line starting with {head:?} in:\n{out}"))
}

#[test]
fn inspect_shows_the_stored_bucket_and_its_ttl() {
    let redis = RedisServer::start();
    let url = redis.url();
    // 10 per hour: no whole token refills while the test runs.
    let l = exact(&url, "t1", 10, 3_600_000);
    for _ in 0..4 {
        assert!(l.acquire("user:1", 1).unwrap().allowed);
    }
    let (code, out, err) = quotalease(&[
        "inspect",
        "--redis",
        &url,
        "user:1",
        "--limit",
        "10",
        "--window-ms",
        "3600000",
        "--key-prefix",
        "t1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(line(&out, "redis key").contains("t1:{user:1}"), "{out}");
    assert!(line(&out, "stored").starts_with("stored     6 tokens, as of"), "{out}");
    assert!(line(&out, "stored").contains("window 3600.0 s"), "{out}");
    assert!(line(&out, "expires").starts_with("expires    in "), "{out}");
    assert!(line(&out, "now").starts_with("now        6 of 10 tokens"), "{out}");
    assert!(
        line(&out, "verdict").contains("would get tokens from the authority now"),
        "{out}"
    );
    assert!(
        out.contains("fallback_active"),
        "the metrics to look at are named: {out}"
    );

    // Inspecting changes nothing.
    let (_, again, _) = quotalease(&[
        "inspect",
        "--redis",
        &url,
        "user:1",
        "--limit",
        "10",
        "--window-ms",
        "3600000",
        "--key-prefix",
        "t1",
    ]);
    assert!(line(&again, "stored").starts_with("stored     6 tokens"), "{again}");

    // Empty bucket: the verdict says so.
    for _ in 0..6 {
        assert!(l.acquire("user:1", 1).unwrap().allowed);
    }
    assert!(!l.acquire("user:1", 1).unwrap().allowed);
    let (code, out, err) = quotalease(&[
        "inspect",
        "--redis",
        &url,
        "user:1",
        "--rate",
        "10/hour",
        "--key-prefix",
        "t1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(line(&out, "stored").starts_with("stored     0 tokens"), "{out}");
    assert!(line(&out, "verdict").contains("the bucket is empty"), "{out}");

    // Without the policy: the stored state only, and how to get more.
    let (code, out, _) = quotalease(&["inspect", "--redis", &url, "user:1", "--key-prefix", "t1"]);
    assert_eq!(code, 0);
    assert!(line(&out, "policy").contains("pass --limit and --window-ms"), "{out}");
    assert!(!out.contains("verdict"), "{out}");

    // Wrong prefix: nothing stored there, and where the key does live.
    let (code, out, _) = quotalease(&["inspect", "--redis", &url, "user:1", "--limit", "10"]);
    assert_eq!(code, 0);
    assert!(
        line(&out, "bucket").contains("none stored: the key reads as a full bucket (10 tokens)"),
        "{out}"
    );
    assert!(line(&out, "elsewhere").contains("t1:{user:1}"), "{out}");
    l.close().unwrap();
}

#[test]
fn bench_runs_both_modes_and_counts_redis_commands() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (code, out, err) = quotalease(&[
        "bench",
        "--redis",
        &url,
        "--threads",
        "2",
        "--duration",
        "300ms",
        "--keys",
        "4",
    ]);
    assert_eq!(code, 0, "{err}");
    let cols = |mode: &str| -> Vec<String> { line(&out, mode).split_whitespace().map(str::to_string).collect() };
    for mode in ["lease", "exact"] {
        let c = cols(&format!("{mode} "));
        let admitted_per_s: f64 = c[1].parse().unwrap();
        assert!(admitted_per_s > 0.0, "{out}");
        assert_eq!(c[2], "0", "nothing denied under a limit of 1e9/s: {out}");
    }
    // Script calls per admitted request: exact makes one per request (the
    // first may also load the script); lease one per lease of up to 20.
    let per = |mode: &str| -> f64 {
        let c = cols(&format!("{mode} "));
        c[c.len() - 2].parse().unwrap()
    };
    assert!((1.0..1.01).contains(&per("exact")), "{out}");
    assert!(per("lease") < 0.2, "{out}");
    assert!(line(&out, "  lease commands:").contains("evalsha"), "{out}");
    assert!(out.contains("lease vs exact:"), "{out}");
}

#[test]
fn simulate_against_redis_runs_leased_and_exact_in_real_time() {
    let redis = RedisServer::start();
    let url = redis.url();
    let chart = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("redis-sim-{}", std::process::id()))
        .join("chart.svg");
    let (code, out, err) = quotalease(&[
        "simulate",
        "--redis",
        &url,
        "--duration",
        "3s",
        "--limit",
        "1200",
        "--chart",
        chart.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("in real time against {url}")), "{out}");
    assert!(out.contains("acquire latency (measured)"), "{out}");
    assert!(
        !out.contains("per-instance limit"),
        "only leased and exact run on Redis: {out}"
    );
    let leased = line(&out, "leased (quotalease) ");
    // "overshoot / bound" column: leased stays within 6 x 20.
    let cells: Vec<&str> = leased.split_whitespace().collect();
    let slash = cells.iter().position(|c| *c == "/").unwrap();
    let (over, bound): (u64, u64) = (cells[slash - 1].parse().unwrap(), cells[slash + 1].parse().unwrap());
    assert_eq!(bound, 6 * 20, "{leased}");
    assert!(over <= bound, "{leased}");
    assert!(err.contains("100% of 3.0 s"), "progress reaches the end: {err}");
    assert!(std::fs::read_to_string(&chart).unwrap().contains("</svg>"));
    std::fs::remove_dir_all(chart.parent().unwrap()).unwrap();
}
