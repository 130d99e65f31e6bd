//! `inspect`, `bench` and `simulate --redis` against a real redis-server
//! started by the project's harness.

mod common;

use common::{quotalease, quotalease_with_env, RedisServer};
use quotalease::{Limiter, Mode};

/// A limiter in exact mode: every admitted request takes one token from Redis now.
fn exact(url: &str, prefix: &str, limit: u64, window_ms: u64) -> Limiter {
    Limiter::builder()
        .url(url)
        .limit(limit)
        .window_ms(window_ms)
        .key_prefix(prefix)
        .mode(Mode::Exact)
        .build()
        .unwrap()
}

fn line<'a>(out: &'a str, head: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(head))
        .unwrap_or_else(|| panic!("no line starting with {head:?} in:\n{out}"))
}

#[test]
fn inspect_shows_the_stored_bucket_and_its_ttl() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let url = redis.url();
    // 10 per hour: no whole token refills while the test runs.
    let l = exact(&url, "t1", 10, 3_600_000);
    for _ in 0..4 {
        assert!(l.acquire("user:1", 1).unwrap().allowed);
    }
    let inspect_args = [
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
    ];
    let (code, out, err) = quotalease(&inspect_args);
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
    let (_, again, _) = quotalease(&inspect_args);
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

/// The rows of one distribution's table in `bench`'s text output, by strategy:
/// strategy, admitted, admitted/s, denied, p50 (2 words), p99 (2 words),
/// overshoot bound, script calls, all commands, 2 ratios vs gcra.
fn bench_rows(out: &str, dist_head: &str) -> Vec<Vec<String>> {
    let start = out
        .find(&format!("\n{dist_head}"))
        .unwrap_or_else(|| panic!("no section {dist_head:?} in:\n{out}"));
    let rows: Vec<Vec<String>> = out[start..]
        .lines()
        .skip(4)
        .take(3)
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(names, ["lease", "exact", "gcra"], "{out}");
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?} in:\n{out}");
    }
    rows
}

fn num(cell: &str) -> f64 {
    cell.trim_end_matches('x')
        .parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a number"))
}

#[test]
fn bench_runs_three_strategies_and_counts_redis_commands() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let url = redis.url();
    let (code, out, err) = quotalease(&[
        "bench",
        "--redis",
        &url,
        "--threads",
        "2",
        "--duration",
        "200ms",
        "--keys",
        "4",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("lease_size 20 (refill_threshold 5)"), "{out}");
    let rows = bench_rows(&out, "round-robin: round-robin over 4 keys");
    for r in &rows {
        assert!(num(&r[1]) > 0.0 && num(&r[2]) > 0.0, "{out}");
        assert_eq!(r[3], "0", "nothing denied under a limit of 1e9/s: {out}");
    }
    // Overshoot bound: 1 instance x lease_size for lease, none for the others.
    assert_eq!([&rows[0][8], &rows[1][8], &rows[2][8]], ["20", "0", "0"], "{out}");
    // Script calls per admitted request: exact and gcra make one per request
    // (exact's first on each of the 2 threads may also load its script: an
    // EVALSHA refused with NOSCRIPT, then EVAL; gcra's is loaded beforehand);
    // lease one per lease of up to 20 tokens.
    let exact_admitted = num(&rows[1][1]);
    let exact_calls = num(&rows[1][9]) * exact_admitted;
    assert!(
        (exact_admitted - 0.5..=exact_admitted + 2.5).contains(&exact_calls),
        "{exact_calls} script calls for {exact_admitted} admitted: {out}"
    );
    assert_eq!(num(&rows[2][9]), 1.0, "{out}");
    assert!(num(&rows[0][9]) < 0.2, "{out}");
    // All commands: gcra's script runs TIME, GET and SET (4 with the EVALSHA).
    assert!((4.0..4.01).contains(&num(&rows[2][10])), "{out}");
    assert_eq!(rows[2][11], "1.0x", "gcra vs itself: {out}");
    let gcra = line(&out, "  gcra commands:");
    for c in ["evalsha", "get", "set", "time"] {
        assert!(gcra.contains(&format!(" {c} ")), "{gcra}");
    }
    assert!(line(&out, "  lease commands:").contains("evalsha"), "{out}");
    for pair in ["lease vs gcra:", "exact vs gcra:", "lease vs exact:"] {
        assert!(line(&out, pair).contains("the admitted/s"), "{out}");
    }
    assert!(
        line(&out, "goals for lease (lease_size 20)").contains(">= 10x the admitted/s"),
        "{out}"
    );
}

#[test]
fn bench_on_hot_and_zipf_keys_admits_no_more_than_the_allowance() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let url = redis.url();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-chart-{}", std::process::id()));
    let chart = dir.join("peers.svg");
    // 50 per hour: each key's allowance is its 50 tokens (one more takes 72 s).
    let args = |dist: &str, duration: &str, chart: &str| -> Vec<String> {
        let mut v: Vec<String> = [
            "bench",
            "--redis",
            &url,
            "--threads",
            "2",
            "--duration",
            duration,
            "--keys",
            "8",
            "--rate",
            "50/hour",
            "--lease-size",
            "5",
            "--dist",
            dist,
        ]
        .map(String::from)
        .to_vec();
        if !chart.is_empty() {
            v.extend(["--chart".to_string(), chart.to_string()]);
        }
        v
    };
    let run = |a: &[String]| quotalease(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let (code, out, err) = run(&args("hot,zipf", "150ms", chart.to_str().unwrap()));
    assert_eq!(code, 0, "{err}");
    for (head, keys) in [("hot: one hot key", 1.0), ("zipf: Zipf s=1.1 over 8 keys", 8.0)] {
        let rows = bench_rows(&out, head);
        for r in &rows {
            let admitted = num(&r[1]);
            assert!(admitted >= 1.0, "{head}: {r:?}");
            assert!(
                admitted <= 50.0 * keys,
                "{head}: {} admitted above the allowance:\n{out}",
                r[0]
            );
        }
        // The limit binds for the local leases, which make thousands of
        // requests in their time (a per-request strategy on a loaded machine
        // may make fewer than the allowance in its 150 ms).
        assert!(num(&rows[0][3]) > 0.0, "the limit binds: {out}");
        assert_eq!([&rows[0][8], &rows[1][8], &rows[2][8]], ["5", "0", "0"], "{out}");
    }
    // On the hot key, the per-request designs admit exactly its 50 tokens
    // once at least 50 requests were made.
    let rows = bench_rows(&out, "hot: one hot key");
    for r in &rows[1..] {
        let (admitted, denied) = (num(&r[1]), num(&r[3]));
        if admitted + denied >= 50.0 {
            assert_eq!(admitted, 50.0, "{out}");
        }
    }
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
    for s in [
        "admitted requests / s",
        "Redis commands / admitted",
        ">hot<",
        ">zipf<",
        "gcra (per-request GCRA Lua script)",
    ] {
        assert!(svg.contains(s), "the chart lacks {s:?}");
    }
    assert!(err.contains(&format!("chart: {}", chart.display())), "{err}");

    // Markdown tables.
    let (code, md, err) = quotalease(&[
        "bench",
        "--redis",
        &url,
        "--threads",
        "1",
        "--duration",
        "20ms",
        "--dist",
        "hot",
        "--markdown",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        md.contains("| strategy | admitted | admitted/s | denied | p50 | p99 |"),
        "{md}"
    );
    assert!(md.contains("| gcra (per-request GCRA Lua script) | "), "{md}");
    assert!(md.contains("Goals for lease"), "{md}");

    // A chart that cannot be written: an error after the table.
    let file = dir.join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let bad = file.join("c.svg");
    let (code, out, err) = run(&args("hot", "20ms", bad.to_str().unwrap()));
    assert_eq!(code, 1, "{err}");
    assert!(out.contains("hot: one hot key"), "{out}");
    assert!(
        err.contains("error: cannot create") && err.contains("for the chart"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn simulate_against_redis_runs_leased_and_exact_in_real_time() {
    let redis = common::redis_or_skip!(RedisServer::start());
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
    let leased = line(&out, "fixed leases ");
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

#[test]
fn inspect_lists_the_live_holders_of_an_adaptive_key() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let url = redis.url();
    // Three instances on one key with adaptive leasing (the default).
    let fleet: Vec<Limiter> = (0..3)
        .map(|_| {
            Limiter::builder()
                .url(url.clone())
                .limit(100)
                .window_ms(1_000)
                .key_prefix("ad")
                .build()
                .unwrap()
        })
        .collect();
    for l in &fleet {
        assert!(l.acquire("hot", 1).unwrap().allowed);
        l.settle().unwrap();
    }
    let (code, out, err) = quotalease(&[
        "inspect",
        "--redis",
        &url,
        "hot",
        "--limit",
        "100",
        "--window-ms",
        "1000",
        "--key-prefix",
        "ad",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(line(&out, "holders").starts_with("holders    3 live"), "{out}");
    let rows = out
        .lines()
        .filter(|l| l.contains(": demand ") && l.contains("forgotten in"));
    assert_eq!(rows.count(), 3, "{out}");
}

/// A password in `--redis` never reaches the output or an error, whatever
/// fails: the server is unreachable, the URL is malformed or names a
/// cluster, the password is wrong. The right password works and the report
/// names the server redacted.
#[test]
fn inspect_never_prints_the_password_of_its_url() {
    const USER: &str = "alice-user-QRS";
    const PW: &str = "s3cret-pw-XYZ";
    let clean = |what: &str, text: &str| {
        assert!(
            !text.contains(PW) && !text.contains(USER),
            "{what} shows a credential:\n{text}"
        );
    };
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let redis = common::redis_or_skip!(RedisServer::start());
    redis.cli(&["ACL", "SETUSER", USER, "on", ">right-password", "~*", "+@all"]);
    for (url, shown) in [
        (
            format!("redis://{USER}:{PW}@127.0.0.1:{closed}"),
            format!("redis://***@127.0.0.1:{closed}"),
        ),
        (
            format!("redis://{USER}:{PW}@127.0.0.1:{}", redis.port),
            format!("redis://***@127.0.0.1:{}", redis.port),
        ),
        (
            // the host shows, the bad port is masked (it may be a password)
            format!("redis://{USER}:{PW}@127.0.0.1:notaport"),
            "redis://***@127.0.0.1:***".to_string(),
        ),
        (
            format!("redis+cluster://{USER}:{PW}@127.0.0.1:{closed}"),
            format!("redis+cluster://***@127.0.0.1:{closed}"),
        ),
    ] {
        let (code, out, err) = quotalease(&["inspect", "--redis", &url, "user:1"]);
        assert_ne!(code, 0, "{url}: {out}");
        clean(&format!("inspect --redis {url}"), &format!("{out}{err}"));
        assert!(err.contains(&shown), "{url}: {err}");
    }
    let good = format!("redis://{USER}:right-password@127.0.0.1:{}", redis.port);
    let (code, out, err) = quotalease(&["inspect", "--redis", &good, "user:1"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("right-password"), "{out}");
    assert!(
        line(&out, "redis key").ends_with(&format!("on redis://***@127.0.0.1:{}", redis.port)),
        "{out}"
    );
}

#[test]
fn policy_sets_gets_lists_and_deletes_in_the_shared_store() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let url = redis.url();
    let run = |args: &[&str]| {
        let mut all = vec!["policy", "--redis", &url, "--key-prefix", "p1"];
        all.extend_from_slice(args);
        quotalease(&all)
    };
    let (code, out, err) = run(&["set", "--tier", "pro", "6000/min, 1000000/day"]);
    assert_eq!(code, 0, "{err}");
    // The store's version: the server's clock in ms at the write.
    let v: u64 = out
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("tier pro = 6000/min, 1000000/day (store version "))
        .and_then(|r| r.trim_end().strip_suffix(')'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let t = redis.cli(&["TIME"]);
    let now_ms = t.lines().next().unwrap().parse::<u64>().unwrap() * 1000;
    assert!(
        v <= now_ms + 1000 && v + 60_000 > now_ms,
        "version {v}, server time {now_ms} ms"
    );
    let (code, _, err) = run(&["set", "--key", "user:42", "tier:pro"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&["get", "--key", "user:42"]);
    assert_eq!(code, 0, "{err}");
    assert!(line(&out, "key").contains("store entry tier:pro"), "{out}");
    assert!(
        line(&out, "rules").contains("6000/min, 1000000/day: tier pro (assigned by store, defined in store)"),
        "{out}"
    );
    // a limiter on the same store follows it
    let l = Limiter::builder()
        .url(url.clone())
        .limit(1)
        .key_prefix("p1")
        .policy_refresh_ms(1_000)
        .build()
        .unwrap();
    let d = l.acquire("user:42", 1).unwrap();
    assert_eq!((d.allowed, d.limit, d.rules().len()), (true, 6000, 2));
    // inspect tells where the key's policy comes from
    let (code, out, err) = quotalease(&["inspect", "--redis", &url, "user:42", "--key-prefix", "p1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        line(&out, "store").contains("entry tier:pro: 6000/min, 1000000/day"),
        "{out}"
    );
    // a tier the store does not define: the command cannot show its rules
    // (its own placeholder limit is not the applications')
    let (code, _, err) = run(&["set", "--key", "user:43", "tier:gold"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&["get", "--key", "user:43"]);
    assert_eq!(code, 0, "{err}");
    assert!(line(&out, "rules").contains("not in the store"), "{out}");
    let (code, out, err) = quotalease(&["inspect", "--redis", &url, "user:43", "--key-prefix", "p1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        line(&out, "store").contains("entry tier:gold (its tier is not defined in the store"),
        "{out}"
    );
    let (code, _, _) = run(&["delete", "--key", "user:43"]);
    assert_eq!(code, 0);
    // shadow mode: the word before the rules, kept as written, followed by a limiter
    let (code, _, err) = run(&["set", "--key", "user:44", "shadow 1/hour"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&["get", "--key", "user:44"]);
    assert_eq!(code, 0, "{err}");
    assert!(line(&out, "key").contains("store entry shadow 1/hour"), "{out}");
    let shadow = (0..3).map(|_| l.acquire("user:44", 1).unwrap()).collect::<Vec<_>>();
    assert!(shadow.iter().all(|d| d.allowed), "{shadow:?}");
    assert_eq!(shadow[2].reason, quotalease::Reason::Shadow);
    // allow and deny entries
    for (key, word, reason) in [
        ("bot", "blocked", quotalease::Reason::Blocked),
        ("ops", "unlimited", quotalease::Reason::Unlimited),
    ] {
        let (code, _, err) = run(&["set", "--key", key, word]);
        assert_eq!(code, 0, "{err}");
        let (code, out, err) = run(&["get", "--key", key]);
        assert_eq!(code, 0, "{err}");
        assert!(line(&out, "key").contains(&format!("store entry {word}")), "{out}");
        assert_eq!(l.acquire(key, 1).unwrap().reason, reason);
        let (code, _, _) = run(&["delete", "--key", key]);
        assert_eq!(code, 0);
    }
    let (code, _, _) = run(&["delete", "--key", "user:44"]);
    assert_eq!(code, 0);
    let (code, out, _) = run(&["list"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("  pro = 6000/min, 1000000/day") && out.contains("  \"user:42\" = tier:pro"),
        "{out}"
    );
    // bad input: the library's validation, a clear message, nothing written
    for (args, says) in [
        (vec!["set", "--tier", "b@d", "1/s"], "tier"),
        (vec!["set", "--tier", "ok", "1/fortnight"], "rules"),
        (vec!["set", "--key", "k", "tier:"], "tier"),
        (vec!["get", "--tier", "nope"], "no tier \"nope\""),
    ] {
        let (code, _, err) = run(&args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (code, _, err) = run(&["set", "--tier", "x", "--key", "k", "1/s"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot be used with"), "{err}");
    let (code, out, _) = run(&["delete", "--key", "user:42"]);
    assert_eq!(code, 0);
    assert!(out.contains("entry removed"), "{out}");
    let (code, _, _) = run(&["delete", "--tier", "pro"]);
    assert_eq!(code, 0);
    let (_, out, _) = run(&["list"]);
    assert!(out.contains("tiers (0)") && out.contains("keys (0)"), "{out}");
}

#[test]
fn the_redis_url_comes_from_the_flag_anywhere_after_the_subcommand_or_the_environment() {
    let redis = RedisServer::start();
    let url = redis.url();
    let p = ["--key-prefix", "envp"];
    // --redis after the policy action (it used to be accepted only before it).
    let (code, out, err) = quotalease(&["policy", "set", "--tier", "pro", "10/s", "--redis", &url, p[0], p[1]]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("tier pro = 10/s"), "{out}");
    // ... and still before it.
    let (code, out, err) = quotalease(&["policy", "--redis", &url, p[0], p[1], "get", "--tier", "pro"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("10/s"), "{out}");
    // QUOTALEASE_REDIS_URL when no --redis is given, for every Redis subcommand.
    let (code, out, err) = quotalease_with_env(&["policy", "list", p[0], p[1]], Some(&url));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pro"), "{out}");
    let (code, out, err) = quotalease_with_env(&["inspect", "user:1", "--rate", "10/s", p[0], p[1]], Some(&url));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("redis key"), "{out}");
    let (code, _, err) = quotalease_with_env(
        &["top", "--frames", "1", "--interval-ms", "100", p[0], p[1]],
        Some(&url),
    );
    assert_eq!(code, 0, "{err}");
    // --redis wins over the variable (here a port nothing listens on).
    let (code, out, err) = quotalease_with_env(
        &["policy", "get", "--tier", "pro", "--redis", &url, p[0], p[1]],
        Some("redis://127.0.0.1:1"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("10/s"), "{out}");
    // ... and a URL from the variable is used, not ignored: a dead one fails.
    let (code, _, err) = quotalease_with_env(&["policy", "list", p[0], p[1]], Some("redis://127.0.0.1:1"));
    assert_eq!(code, 1, "{err}");
}
