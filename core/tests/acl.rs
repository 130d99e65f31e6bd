//! Least privilege: the Redis ACL docs/redis.md ("Redis permissions") documents
//! is all a limiter needs. A user restricted to it (`ACL SETUSER` on a real
//! redis-server and Redis Cluster) leases, gives back, inspects, gets
//! adaptive rates, has stale holders forgotten, flushes and closes with no
//! backend error, over RESP2 and RESP3; a user lacking one of those commands
//! (or the key pattern) gets a typed `Error::Misconfigured` from `inspect`,
//! `check` and `acquire` (a configuration error, not an outage the failure
//! policy would hide), with a message naming what was refused.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::{await_cond, stored_tokens, unique, RedisCluster, RedisServer};
use quotalease::{Error, ErrorKind, Limiter, Reason};

/// The commands of docs/redis.md's rule, in its order: every script call
/// (EVALSHA, EVAL when a server does not have the script yet), what the
/// scripts run, `inspect`'s TYPE and PTTL, and the policy store's commands.
const COMMANDS: [&str; 24] = [
    "evalsha",
    "eval",
    "time",
    "get",
    "set",
    "pttl",
    "hgetall",
    "hset",
    "hdel",
    "pexpire",
    "hlen",
    "hmget",
    "lrange",
    "lpush",
    "ltrim",
    "type",
    "del",
    "hget",
    "zadd",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
    "zscore",
    "zrem",
];
/// Redis Cluster adds these (the redis crate's topology discovery and redirections).
const CLUSTER_COMMANDS: [&str; 3] = ["ping", "cluster|slots", "asking"];

/// docs/redis.md's rule, for the default key prefix `ql`.
fn documented_rule() -> String {
    let cmds: Vec<String> = COMMANDS.iter().map(|c| format!("+{c}")).collect();
    format!(
        "ACL SETUSER quotalease on >CHANGE-ME resetkeys ~ql:* resetchannels -@all {}",
        cmds.join(" ")
    )
}

const PW: &str = "acl-pw-91x";

/// `ACL SETUSER name` on `port`: password [`PW`], keys `~{prefix}:*`, `rules`.
fn set_user(port: u16, name: &str, prefix: &str, rules: &[String]) {
    let mut args: Vec<String> = ["ACL", "SETUSER", name, "reset", "on", &format!(">{PW}")]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(format!("~{prefix}:*"));
    args.push("resetchannels".into());
    args.push("-@all".into());
    args.extend(rules.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "OK",
        "ACL SETUSER on {port}"
    );
}

fn plus(cmds: &[&str]) -> Vec<String> {
    cmds.iter().map(|c| format!("+{c}")).collect()
}

fn messages(l: &Limiter) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    l.on_event(move |e| s.lock().unwrap().push(e.message.clone()));
    seen
}

#[test]
fn the_documented_rule_covers_every_command_the_scripts_run() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../docs/redis.md")).unwrap();
    assert!(
        readme.contains(&documented_rule()),
        "docs/redis.md does not give the tested rule:\n{}",
        documented_rule()
    );
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(root.join("src/authority/lua")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for call in ["redis.call(", "redis.pcall("] {
            for rest in text.split(call).skip(1) {
                let name = rest
                    .trim_start()
                    .trim_start_matches(['\'', '"'])
                    .split(['\'', '"'])
                    .next()
                    .unwrap()
                    .to_ascii_lowercase();
                assert!(
                    COMMANDS.contains(&name.as_str()),
                    "a script runs {name}, which docs/redis.md's ACL rule does not allow"
                );
                if !seen.contains(&name) {
                    seen.push(name);
                }
            }
        }
    }
    // The parse found the scripts' commands (it cannot pass on nothing).
    for c in ["time", "get", "set", "hset", "hdel", "pexpire", "zadd", "zrangebyscore"] {
        assert!(seen.iter().any(|s| s == c), "no script runs {c}? seen {seen:?}");
    }
}

#[test]
fn a_restricted_user_runs_limiters() {
    let server = common::redis_or_skip!(RedisServer::start());
    for protocol in ["", "/?protocol=resp3"] {
        let p = unique("acl");
        set_user(server.port, "ql-limiter", &p, &plus(&COMMANDS));
        let url = format!("redis://ql-limiter:{PW}@127.0.0.1:{}{protocol}", server.port);
        let build = || Limiter::builder().url(&url).key_prefix(&p).backend_timeout_ms(1_000);

        // Fixed leases: lease, inspect, give back (flush), close.
        let l = build().limit(100).window_ms(60_000).lease_size(10).build().unwrap();
        let ev = messages(&l);
        let d = l.acquire("k", 1).unwrap();
        assert!(
            d.allowed && d.reason == Reason::Lease,
            "{protocol}: {d:?} {:?}",
            ev.lock().unwrap()
        );
        let i = l.inspect("k").unwrap();
        assert_eq!((i.local_tokens, i.authority_tokens), (9, Some(90)), "{protocol}");
        assert!(i.authority_ttl_ms.is_some());
        l.flush().unwrap();
        assert_eq!(stored_tokens(&server.cli(&["GET", &format!("{p}:{{k}}")])), 99);
        l.close().unwrap();
        assert_eq!(l.metrics().backend_errors, 0, "{protocol}: {:?}", ev.lock().unwrap());

        // Adaptive leasing: three holders saturating a key get rates (the
        // ledger's hash and sorted set are read and written), then the two
        // that stop are forgotten when their commitments expire (reaped from
        // the sorted set) while the third goes on.
        let fleet: Vec<Limiter> = (0..3)
            .map(|_| build().limit(200).window_ms(1_000).build().unwrap())
            .collect();
        let evs: Vec<_> = fleet.iter().map(messages).collect();
        await_cond("a rate grant", || {
            for l in &fleet {
                for _ in 0..50 {
                    l.acquire("hot", 1).unwrap();
                }
            }
            fleet.iter().any(|l| l.inspect("hot").unwrap().rate_per_window > 0)
        });
        let holders = || -> u64 {
            server
                .cli(&["HGET", &format!("{p}:{{hot}}"), "n"])
                .trim()
                .parse()
                .unwrap()
        };
        assert_eq!(holders(), 3, "{protocol}");
        for l in &fleet[1..] {
            l.close().unwrap();
        }
        await_cond("stopped holders forgotten", || {
            for _ in 0..50 {
                fleet[0].acquire("hot", 1).unwrap();
            }
            holders() == 1
        });
        fleet[0].close().unwrap();
        for (l, ev) in fleet.iter().zip(&evs) {
            let m = l.metrics();
            assert_eq!(m.backend_errors, 0, "{protocol}: {m:?} {:?}", ev.lock().unwrap());
            assert_eq!(m.fallback_transitions, 0, "{protocol}: {m:?}");
        }
    }
}

#[test]
fn a_user_lacking_a_command_gets_a_clear_configuration_error() {
    let server = common::redis_or_skip!(RedisServer::start());
    let url = |user: &str| format!("redis://{user}:{PW}@127.0.0.1:{}", server.port);
    let p = unique("acl");
    let limiter = |user: &str| {
        Limiter::builder()
            .url(url(user))
            .key_prefix(&p)
            .limit(100)
            .lease_size(10)
            .backend_timeout_ms(1_000)
            .build()
            .unwrap()
    };
    // Without PTTL: leases work, inspect fails with a typed backend error.
    let no_pttl: Vec<&str> = COMMANDS.iter().copied().filter(|c| *c != "pttl").collect();
    set_user(server.port, "ql-no-pttl", &p, &plus(&no_pttl));
    let l = limiter("ql-no-pttl");
    assert_eq!(l.acquire("k", 1).unwrap().reason, Reason::Lease);
    match l.inspect("k") {
        Err(e @ Error::Misconfigured { .. }) => {
            assert_eq!(e.kind(), ErrorKind::Misconfigured);
            let text = e.to_string();
            assert!(text.contains("pttl") && text.contains("permission"), "{text}");
            assert!(!text.contains(PW), "{text}");
        }
        other => panic!("inspect without PTTL: {other:?}"),
    }
    // Without EVALSHA, or without the keys: every lease call is refused, so
    // acquire and check() fail typed (no failure policy: nothing is down)
    // and the degraded event says why; inspect fails typed.
    let no_evalsha: Vec<&str> = COMMANDS.iter().copied().filter(|c| *c != "evalsha").collect();
    set_user(server.port, "ql-no-evalsha", &p, &plus(&no_evalsha));
    set_user(server.port, "ql-other-keys", &format!("{p}-other"), &plus(&COMMANDS));
    for (user, why) in [("ql-no-evalsha", "evalsha"), ("ql-other-keys", "key")] {
        let l = limiter(user);
        let ev = messages(&l);
        for r in [l.check().map(|_| ()), l.acquire("k2", 1).map(|_| ())] {
            match r {
                Err(e @ Error::Misconfigured { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains(why) && text.contains("permission"), "{user}: {text}");
                    assert!(!text.contains(PW), "{text}");
                }
                other => panic!("{user}: expected Error::Misconfigured, got {other:?}"),
            }
        }
        await_cond("a degraded event", || !ev.lock().unwrap().is_empty());
        let m = ev.lock().unwrap()[0].clone();
        assert!(m.contains(why) && m.contains("permission"), "{user}: {m}");
        assert!(!m.contains(PW), "{m}");
        if user == "ql-other-keys" {
            assert_eq!(l.inspect("k2").unwrap_err().kind(), ErrorKind::Misconfigured);
        }
        assert_eq!(l.metrics().admitted, 0, "{user}: no failure-policy admission");
        l.close().unwrap();
    }
}

#[test]
fn a_restricted_user_runs_a_limiter_on_a_cluster() {
    let cluster = common::redis_or_skip!(RedisCluster::start());
    let p = unique("aclc");
    let rules: Vec<String> = plus(&COMMANDS).into_iter().chain(plus(&CLUSTER_COMMANDS)).collect();
    for &port in &cluster.ports {
        set_user(port, "ql-limiter", &p, &rules);
    }
    let nodes: Vec<String> = cluster.masters().iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let l = Limiter::builder()
        .url(format!("redis+cluster://ql-limiter:{PW}@{}", nodes.join(",")))
        .key_prefix(&p)
        .limit(100)
        .lease_size(10)
        .backend_timeout_ms(1_000)
        .build()
        .unwrap();
    let ev = messages(&l);
    // Keys on every master.
    let keys: Vec<String> = (0..30).map(|i| format!("tenant-{i}")).collect();
    for k in &keys {
        let d = l.acquire(k, 1).unwrap();
        assert!(
            d.allowed && d.reason == Reason::Lease,
            "{k}: {d:?} {:?}",
            ev.lock().unwrap()
        );
    }
    for &m in cluster.masters() {
        let n: u64 = cluster.cli(m, &["DBSIZE"]).parse().unwrap();
        assert!(n > 0, "master {m} holds no bucket");
    }
    assert_eq!(l.inspect(&keys[0]).unwrap().authority_tokens, Some(90));
    l.close().unwrap();
    assert_eq!(l.metrics().backend_errors, 0, "{:?}", ev.lock().unwrap());
}
