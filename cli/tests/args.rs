//! Bad command lines get a clear message and a non-zero exit, never a panic.

mod common;

use common::{quotalease, quotalease_with_env};

/// Runs the command, expects `code`, and that stderr mentions every needle.
fn fails(args: &[&str], code: i32, needles: &[&str]) {
    let (got, stdout, stderr) = quotalease(args);
    assert_eq!(
        got, code,
        "quotalease {args:?}: exit code\nstdout: {stdout}\nstderr: {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "quotalease {args:?}: stderr lacks {n:?}:\n{stderr}");
    }
}

#[test]
fn usage_errors_exit_2_and_name_the_flag() {
    fails(&[], 2, &["Usage: quotalease <COMMAND>", "simulate", "inspect", "bench"]);
    fails(&["frobnicate"], 2, &["unrecognized subcommand 'frobnicate'"]);
    fails(
        &["simulate", "--instances", "0"],
        2,
        &["invalid value '0' for '--instances <INSTANCES>'", "1..=200"],
    );
    fails(
        &["simulate", "--instances", "many"],
        2,
        &["invalid value 'many' for '--instances <INSTANCES>'"],
    );
    fails(&["simulate", "--instances", "201"], 2, &["--instances"]);
    fails(
        &["simulate", "--limit", "0"],
        2,
        &["invalid value '0' for '--limit <LIMIT>'"],
    );
    fails(&["simulate", "--window-ms", "-5"], 2, &["unexpected argument '-5'"]);
    fails(
        &["simulate", "--rate", "10/fortnight"],
        2,
        &["--rate", "must look like \"600/min\""],
    );
    fails(
        &["simulate", "--rate", "600/min", "--limit", "5"],
        2,
        &["'--rate <RATE>' cannot be used with '--limit <LIMIT>'"],
    );
    fails(
        &["simulate", "--skew=-1"],
        2,
        &["--skew", "must be between 0 (even spread) and 10"],
    );
    fails(
        &["simulate", "--skew", "lots"],
        2,
        &["--skew", "\"lots\" is not a number"],
    );
    fails(
        &["simulate", "--rtt-ms=-3"],
        2,
        &["--rtt-ms", "must be between 0 and 10000 ms"],
    );
    fails(
        &["simulate", "--duration", "5fortnights"],
        2,
        &["--duration", "is not a duration; use 300s, 5m"],
    );
    fails(
        &["simulate", "--duration", "0s"],
        2,
        &["--duration", "must be between 1ms and 7 days"],
    );
    fails(&["simulate", "--seed", "-1"], 2, &["unexpected argument '-1'"]);
    fails(&["simulate", "--lease-ttl-ms", "0"], 2, &["--lease-ttl-ms"]);
    fails(&["simulate", "--bogus"], 2, &["unexpected argument '--bogus'"]);
    fails(&["inspect", "k"], 2, &["--redis URL", "QUOTALEASE_REDIS_URL"]);
    fails(&["inspect", "--redis", "redis://127.0.0.1:1"], 2, &["<KEY>"]);
    fails(&["bench"], 2, &["--redis URL", "QUOTALEASE_REDIS_URL"]);
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--threads", "0"],
        2,
        &["--threads"],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--keys", "0"],
        2,
        &["--keys"],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--duration", "soon"],
        2,
        &["--duration"],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--dist", "bogus"],
        2,
        &[
            "invalid value 'bogus' for '--dist <DIST>'",
            "[possible values: round-robin, hot, zipf]",
        ],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--dist", "hot,"],
        2,
        &["a value is required for '--dist <DIST>'"],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--seed", "-1"],
        2,
        &["unexpected argument '-1'"],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--seed", "x"],
        2,
        &["invalid value 'x' for '--seed <SEED>'"],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--chart"],
        2,
        &["a value is required for '--chart <CHART>'"],
    );
}

#[test]
fn invalid_values_exit_1_with_the_flag_and_the_fix() {
    fails(
        &["simulate", "--lease-size", "700"],
        1,
        &["error: --lease-size must be between 1 and limit (600) (got 700)"],
    );
    fails(
        &["simulate", "--lease-size", "10", "--refill-threshold", "11"],
        1,
        &["error: --refill-threshold must be at most lease_size (10) (got 11)"],
    );
    fails(
        &["simulate", "--limit", "5", "--window-ms", "18446744073709551615"],
        1,
        &["error: --limit", "2^52"],
    );
    fails(
        &[
            "simulate",
            "--limit",
            "1000000",
            "--window-ms",
            "1000",
            "--duration",
            "1h",
        ],
        1,
        &["error: this would simulate about", "lower --limit"],
    );
    fails(
        &["simulate", "--redis", "http://example.com"],
        1,
        &["error: --redis", "unknown scheme"],
    );
    fails(
        &[
            "simulate",
            "--redis",
            "redis://127.0.0.1:1",
            "--limit",
            "100000",
            "--window-ms",
            "1000",
        ],
        1,
        &["error: with --redis the scenario runs in real time", "requests/s"],
    );
    fails(
        &["simulate", "--redis", "redis://127.0.0.1:1", "--duration", "1s"],
        1,
        &["error: cannot reach Redis at redis://127.0.0.1:1"],
    );
    fails(
        &["inspect", "--redis", "redis://127.0.0.1:1", ""],
        1,
        &["error: invalid key: the key is empty"],
    );
    fails(
        &["inspect", "--redis", "redis://127.0.0.1:1", "k"],
        1,
        &["error: cannot reach Redis at redis://127.0.0.1:1"],
    );
    fails(
        &["inspect", "--redis", "redis://127.0.0.1:1", "k", "--window-ms", "1000"],
        1,
        &["error: --window-ms needs --limit"],
    );
    fails(
        &["inspect", "--redis", "redis://127.0.0.1:1", "k", "--key-prefix", "a{b"],
        1,
        &["error: --key-prefix must be at most 64 bytes"],
    );
    fails(
        &["inspect", "--redis", "bogus://x", "k"],
        1,
        &["error: --redis \"bogus://x\" has an unknown scheme"],
    );
    fails(
        &["bench", "--redis", "redis+cluster://127.0.0.1:1"],
        1,
        &["error: --redis", "needs one Redis server"],
    );
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--duration", "100ms"],
        1,
        &["error: cannot reach Redis"],
    );
    fails(
        &[
            "bench",
            "--redis",
            "redis://127.0.0.1:1",
            "--lease-size",
            "5",
            "--limit",
            "2",
        ],
        1,
        &["error: --lease-size"],
    );
    // Checked before any connection is made (port 1 answers nothing).
    fails(
        &["bench", "--redis", "redis://127.0.0.1:1", "--dist", "hot,zipf,hot"],
        1,
        &["error: --dist lists hot twice"],
    );
    fails(
        &[
            "bench",
            "--redis",
            "redis://127.0.0.1:1",
            "--dist",
            "zipf",
            "--keys",
            "1",
        ],
        1,
        &["error: --dist zipf needs --keys of at least 2 (one key is --dist hot)"],
    );
    fails(
        &[
            "bench",
            "--redis",
            "redis://127.0.0.1:1",
            "--lease-size",
            "20",
            "--refill-threshold",
            "21",
        ],
        1,
        &["error: --refill-threshold must be at most lease_size (20) (got 21)"],
    );
    fails(
        &[
            "bench",
            "--redis",
            "redis://127.0.0.1:1",
            "--dist",
            "hot,zipf",
            "--duration",
            "10ms",
        ],
        1,
        &["error: cannot reach Redis at redis://127.0.0.1:1"],
    );
}

#[test]
fn an_unwritable_chart_path_is_an_error_after_the_table() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("args-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let chart = file.join("chart.svg");
    let (code, stdout, stderr) = quotalease(&["simulate", "--duration", "20s", "--chart", chart.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.contains("adaptive (quotalease)"), "{stdout}");
    assert!(
        stderr.contains("error: cannot create") && stderr.contains("for the chart"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_and_version() {
    let (code, out, _) = quotalease(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("simulate") && out.contains("inspect") && out.contains("bench"));
    let (code, out, _) = quotalease(&["simulate", "--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--instances",
        "--limit",
        "--window-ms",
        "--rate",
        "--lease-size",
        "--refill-threshold",
        "--lease-ttl-ms",
        "--skew",
        "--duration",
        "--seed",
        "--rtt-ms",
        "--chart",
        "--redis",
    ] {
        assert!(out.contains(flag), "simulate --help lacks {flag}");
    }
    let (code, out, _) = quotalease(&["bench", "--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--redis",
        "--threads",
        "--duration",
        "--keys",
        "--dist",
        "--seed",
        "--rate",
        "--lease-size",
        "--refill-threshold",
        "--chart",
        "--markdown",
    ] {
        assert!(out.contains(flag), "bench --help lacks {flag}");
    }
    assert!(out.contains("zipf = Zipf s=1.1"), "{out}");
    let (code, out, _) = quotalease(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("quotalease {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn a_redis_command_without_a_url_names_the_flag_and_the_variable() {
    for args in [
        &["inspect", "user:1"][..],
        &["top", "--frames", "1"],
        &["bench", "--duration", "1s"],
        &["policy", "list"],
    ] {
        fails(args, 2, &["no Redis URL", "--redis", "QUOTALEASE_REDIS_URL"]);
        // An empty variable is no URL either.
        let (code, _, stderr) = quotalease_with_env(args, Some(""));
        assert_eq!(code, 2, "quotalease {args:?} with an empty variable:\n{stderr}");
        assert!(stderr.contains("QUOTALEASE_REDIS_URL"), "{stderr}");
    }
}

#[test]
fn help_names_the_variable_but_never_prints_its_value() {
    let secret = "redis://:s3cret-Pw@127.0.0.1:1/0";
    for args in [
        &["top", "--help"][..],
        &["policy", "list", "--help"],
        &["inspect", "--help"],
    ] {
        let (code, out, err) = quotalease_with_env(args, Some(secret));
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("[env: QUOTALEASE_REDIS_URL]"),
            "quotalease {args:?}:\n{out}"
        );
        assert!(
            !out.contains("s3cret") && !err.contains("s3cret"),
            "quotalease {args:?} printed the URL:\n{out}"
        );
    }
}
