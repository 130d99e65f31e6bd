//! `redis+sentinel://` against real processes (tests/harness/redisctl
//! sentinel-start: a primary, one replica, three sentinels): leases go to
//! the primary the sentinels name, with the URL's credentials and database;
//! a fleet saturating one key survives the primary being killed and recovers
//! by itself on the promoted replica, within the bound; after a failover that
//! leaves the old primary running, the limiter moves to the new one; and a
//! server turned replica under a connection is left at once (READONLY).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{await_cond, stored_tokens, unique, RedisServer, SentinelGroup};
use quotalease::{EventKind, Limiter, Reason};

/// Calls of the lease scripts a server has seen (answered, failed or
/// rejected), from `INFO commandstats`.
fn script_calls(group: &SentinelGroup, port: u16) -> u64 {
    group
        .cli(port, &["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .flat_map(|l| l.split([':', ',']))
        .filter_map(|f| f.split_once('='))
        .filter(|(k, _)| matches!(*k, "calls" | "failed_calls" | "rejected_calls"))
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum()
}

/// Poll `cond` with a generous hang guard (a failover takes seconds).
fn await_long(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn leases_from_the_primary_with_the_urls_user_and_database() {
    let group = common::redis_or_skip!(SentinelGroup::start());
    let primary = group.primary(None);
    assert_eq!(primary, group.ports[0]);
    // docs/redis.md's least-privilege rule plus what Sentinel and a database need
    // (ROLE, SELECT), on the primary only (ACLs are per server); and a user
    // on every sentinel allowed only what the limiter asks them.
    let p = unique("sn");
    let user = "ql-sentinel-user";
    let pw = "pw-S3ntinel";
    let rule = format!(
        "ACL SETUSER {user} on >{pw} resetkeys ~{p}:* resetchannels -@all \
         +evalsha +eval +time +get +set +pttl +hgetall +hset +hdel +pexpire +role +select \
         +type +del +hget +hmget +zadd +zrange +zrangebyscore +zremrangebyscore +zscore +zrem"
    );
    assert_eq!(group.cli(primary, &rule.split(' ').collect::<Vec<_>>()), "OK");
    for &s in group.sentinels() {
        let rule = "ACL SETUSER ql-watch on >pw-watch -@all +sentinel|masters +sentinel|get-master-addr-by-name +role";
        assert_eq!(group.cli(s, &rule.split(' ').collect::<Vec<_>>()), "OK");
    }
    let l = Limiter::builder()
        .url(group.url_with(
            &format!("{user}:{pw}@"),
            "/3?sentinel_username=ql-watch&sentinel_password=pw-watch",
        ))
        .key_prefix(&p)
        .limit(100)
        .window_ms(60_000)
        .lease_size(10)
        .backend_timeout_ms(1_000)
        .build()
        .unwrap();
    let d = l.acquire("k", 1).unwrap();
    assert!(d.allowed && d.reason == Reason::Lease, "{d:?}");
    // The bucket is in database 3 of the primary, written as that user.
    let key = format!("{p}:{{k}}");
    assert_eq!(stored_tokens(&group.cli(primary, &["-n", "3", "GET", &key])), 90);
    assert_eq!(group.cli(primary, &["-n", "0", "EXISTS", &key]), "0");
    let clients = group.cli(primary, &["CLIENT", "LIST"]);
    assert!(
        clients
            .lines()
            .any(|c| c.contains(&format!("user={user}")) && c.contains("db=3")),
        "{clients}"
    );
    // The sentinels were asked as their user.
    let asked: usize = group
        .sentinels()
        .iter()
        .map(|&s| group.cli(s, &["CLIENT", "LIST"]).matches("user=ql-watch").count())
        .sum();
    assert!(asked > 0, "no sentinel saw the limiter's sentinel user");
    let i = l.inspect("k").unwrap();
    assert_eq!((i.local_tokens, i.authority_tokens), (9, Some(90)));
    l.close().unwrap();
    assert_eq!(stored_tokens(&group.cli(primary, &["-n", "3", "GET", &key])), 99);
    assert_eq!(l.metrics().backend_errors, 0);
    // A wrong password for the primary, or for the sentinels, is a
    // configuration error (no failure policy hides it), and no replica is
    // used instead.
    for (i, tail) in [
        "/3?sentinel_username=ql-watch&sentinel_password=pw-watch",
        "/3?sentinel_password=wrong",
    ]
    .iter()
    .enumerate()
    {
        let userinfo = if i == 0 {
            format!("{user}:wrong@")
        } else {
            format!("{user}:{pw}@")
        };
        let bad = Limiter::builder()
            .url(group.url_with(&userinfo, tail))
            .key_prefix(&p)
            .limit(100)
            .backend_timeout_ms(1_001 + i as u64)
            .build()
            .unwrap();
        // (a configuration error, not an outage: see core/tests/misconfig.rs)
        let e = bad.acquire("k2", 1).unwrap_err();
        assert_eq!(e.kind(), quotalease::ErrorKind::Misconfigured, "{tail}: {e}");
        assert!(e.to_string().contains("authentication failed"), "{tail}: {e}");
    }
    assert_eq!(script_calls(&group, group.ports[1]), 0, "a replica got script calls");
}

/// Four limiters saturate one key at about 12x its rate while the primary is
/// SIGKILLed: the sentinels promote the replica and every limiter comes back
/// to leasing on it by itself. What the fleet admitted stays within the bound
/// the system test uses:
///
/// - from leases: the token-bucket allowance over the run (the key starts
///   full) plus the overshoot budget (`allowance + O`). Writes the promoted
///   replica missed (replication is asynchronous) add nothing: the failover
///   guard (core/src/guard.rs) re-debits what each instance was granted in
///   the last window when the bucket it finds is older than what it saw.
/// - under the failure policy (static-share, adaptive fallback rates that sum
///   to the key's rate): `limit + limit × span / window` for the fleet
///   together, `span` the outage as the test saw it plus a round-trip bound.
#[test]
fn fleet_recovers_from_a_killed_primary_within_the_bound() {
    const INSTANCES: usize = 4;
    const LIMIT: u64 = 1_000;
    const WINDOW_MS: u64 = 1_000;
    const BUDGET: u64 = LIMIT * 2 / 100; // the default overshoot_budget, 2 %
    const TIMEOUT_MS: u64 = 500;
    let group = common::redis_or_skip!(SentinelGroup::start());
    let old = group.primary(None);
    let replica = group.ports[1];
    let p = unique("sf");
    let limiters: Vec<Arc<Limiter>> = (0..INSTANCES)
        .map(|_| {
            Arc::new(
                Limiter::builder()
                    .url(group.url())
                    .key_prefix(&p)
                    .limit(LIMIT)
                    .window_ms(WINDOW_MS)
                    .backend_timeout_ms(TIMEOUT_MS)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let events: Vec<Arc<Mutex<Vec<EventKind>>>> = limiters
        .iter()
        .map(|l| {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s = seen.clone();
            l.on_event(move |e| s.lock().unwrap().push(e.kind));
            seen
        })
        .collect();
    // Per limiter: admitted by reason (lease, fallback), and denials.
    let counts: Arc<Vec<[AtomicU64; 3]>> = Arc::new((0..INSTANCES).map(|_| Default::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = limiters
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let (l, stop, counts) = (l.clone(), stop.clone(), counts.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let d = l.acquire("hot", 1).unwrap_or_else(|e| panic!("{e}"));
                    let slot = match (d.allowed, d.reason) {
                        (true, Reason::Lease) => 0,
                        (true, Reason::Fallback) => 1,
                        (true, other) => panic!("admitted with reason {other:?}"),
                        (false, _) => 2,
                    };
                    counts[i][slot].fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        })
        .collect();
    let leases = |i: usize| counts[i][0].load(Ordering::Relaxed);
    await_long("the fleet leasing on the first primary", || {
        (0..INSTANCES).all(|i| leases(i) > 100)
    });
    std::thread::sleep(Duration::from_secs(1));
    // Nothing was ever sent to the replica.
    assert_eq!(script_calls(&group, replica), 0, "the replica got script calls");
    let killed_at = Instant::now();
    group.kill(old);
    let promoted = group.primary(Some(old));
    assert_eq!(promoted, replica, "the sentinels promoted another server");
    let seen: Vec<u64> = (0..INSTANCES).map(leases).collect();
    await_long("every limiter leasing again on the promoted replica", || {
        (0..INSTANCES).all(|i| limiters[i].metrics().fallback_active == 0 && leases(i) > seen[i])
    });
    let recovered_at = Instant::now();
    assert!(script_calls(&group, promoted) > 0);
    // Some more of the saturated run on the new primary.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let elapsed_ms = start.elapsed().as_millis() as u64 + 1;
    for (i, l) in limiters.iter().enumerate() {
        let m = l.metrics();
        // Degraded when the primary died, recovered on the new one.
        assert!(
            m.fallback_transitions >= 2 && m.fallback_active == 0,
            "limiter {i}: {m:?}"
        );
        let ev = events[i].lock().unwrap().clone();
        assert_eq!(ev.last(), Some(&EventKind::Recovered), "limiter {i}: {ev:?}");
        l.close().unwrap();
    }
    let sum = |slot: usize| -> u64 { counts.iter().map(|c| c[slot].load(Ordering::Relaxed)).sum() };
    let (by_lease, by_fallback, denied) = (sum(0), sum(1), sum(2));
    let allowance = LIMIT + elapsed_ms * LIMIT / WINDOW_MS;
    let lease_bound = allowance + BUDGET;
    let span_ms = (recovered_at - killed_at).as_millis() as u64 + TIMEOUT_MS + 100;
    let fallback_bound = LIMIT + (LIMIT * span_ms).div_ceil(WINDOW_MS);
    eprintln!(
        "admitted {by_lease} from leases (allowance {allowance} + budget {BUDGET} = {lease_bound}; \
         {:.3}x of it), {by_fallback} under the failure policy \
         (bound {fallback_bound} over {span_ms} ms), denied {denied}; primary killed at +{} ms, \
         fleet recovered {} ms later",
        by_lease as f64 / lease_bound as f64,
        (killed_at - start).as_millis(),
        (recovered_at - killed_at).as_millis()
    );
    assert!(by_fallback > 0, "the fleet never applied the failure policy");
    assert!(
        by_fallback <= fallback_bound,
        "{by_fallback} fallback admissions > {fallback_bound}"
    );
    assert!(
        by_lease <= lease_bound,
        "{by_lease} admitted from leases > {lease_bound}"
    );
    // Saturated: most requests were denied, so the bound was under pressure.
    assert!(denied > by_lease, "denied {denied}, admitted {by_lease}: not saturated");
}

/// `SENTINEL FAILOVER` while the old primary refuses to be demoted (its
/// default user, which the sentinels use, may not run REPLICAOF/SLAVEOF):
/// the old primary stays a writable master, so only asking the sentinels
/// moves the limiter. Without that check it would keep writing there.
#[test]
fn leaves_the_old_primary_once_the_sentinels_name_a_new_one() {
    let group = common::redis_or_skip!(SentinelGroup::start());
    let old = group.primary(None);
    let l = Limiter::builder()
        .url(group.url())
        .key_prefix(unique("sm"))
        .limit(1_000)
        .window_ms(60_000)
        .lease_size(1)
        .backend_timeout_ms(1_000)
        .build()
        .unwrap();
    // lease_size 1: every acquire is one lease call.
    assert_eq!(l.acquire("k", 1).unwrap().reason, Reason::Lease);
    assert!(script_calls(&group, old) > 0);
    assert_eq!(
        group.cli(old, &["ACL", "SETUSER", "default", "-replicaof", "-slaveof"]),
        "OK"
    );
    let sentinel = group.sentinels()[0];
    await_long("SENTINEL FAILOVER accepted", || {
        group.cli(sentinel, &["SENTINEL", "FAILOVER", SentinelGroup::SERVICE]) == "OK"
    });
    let new = group.primary(Some(old));
    let mut i = 0;
    await_long("the limiter's lease calls reaching the new primary", || {
        i += 1;
        l.acquire(&format!("k{i}"), 1).unwrap();
        script_calls(&group, new) > 0
    });
    // From now on every call goes to the new primary, while the old one is
    // still a master (nothing demoted it).
    assert!(group.cli(old, &["ROLE"]).starts_with("master"));
    let on_old = script_calls(&group, old);
    let on_new = script_calls(&group, new);
    for j in 0..20 {
        let d = l.acquire(&format!("after{j}"), 1).unwrap();
        assert_eq!(d.reason, Reason::Lease, "{d:?}");
    }
    assert_eq!(script_calls(&group, old), on_old, "calls still reach the old primary");
    assert!(script_calls(&group, new) >= on_new + 20);
    // Let the sentinels finish their job when the group stops.
    group.cli(old, &["ACL", "SETUSER", "default", "+@all"]);
}

/// A server turned replica under an open connection keeps the connection
/// but refuses writes (READONLY): the connection is dropped on that answer,
/// so the next call connects again (through Sentinel: to the new primary).
#[test]
fn a_server_turned_replica_is_left_at_once() {
    let server = common::redis_or_skip!(RedisServer::start());
    let other = RedisServer::start();
    let l = Limiter::builder()
        .url(server.url())
        .key_prefix(unique("ro"))
        .limit(1_000)
        .window_ms(60_000)
        .lease_size(1)
        .backend_timeout_ms(1_000)
        // only the lease connection (the policy store has one of its own)
        .policy_refresh_ms(0)
        .build()
        .unwrap();
    let messages = Arc::new(Mutex::new(Vec::new()));
    let m2 = messages.clone();
    l.on_event(move |e| m2.lock().unwrap().push(e.message.clone()));
    assert_eq!(l.acquire("k", 1).unwrap().reason, Reason::Lease);
    // The limiter's connection: the one whose last command was a script
    // (each redis-cli call is a connection of its own).
    let ids = |script_only: bool| -> Vec<String> {
        server
            .cli(&["CLIENT", "LIST"])
            .lines()
            .filter(|c| !script_only || c.contains(" cmd=evalsha ") || c.contains(" cmd=eval "))
            .filter_map(|c| c.split(' ').find_map(|f| f.strip_prefix("id=")).map(str::to_string))
            .collect()
    };
    let before = ids(true);
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(server.cli(&["REPLICAOF", "127.0.0.1", &other.port.to_string()]), "OK");
    assert_eq!(l.acquire("k2", 1).unwrap().reason, Reason::Fallback);
    await_cond("a degraded event saying the server is a replica", || {
        messages.lock().unwrap().iter().any(|m| m.contains("read only replica"))
    });
    // The connection that got READONLY is closed (without the reset it
    // stays open and gets READONLY for every call)...
    await_cond("the connection that got READONLY closed", || {
        !ids(false).contains(&before[0])
    });
    // ...and the circuit's probes connect again: connections the server
    // accepted beyond this test's own redis-cli calls (one each).
    let accepted = || -> u64 {
        server
            .cli(&["INFO", "stats"])
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let start = accepted();
    let mut own = 0;
    await_cond("the limiter connecting again", || {
        l.acquire("k3", 1).unwrap();
        own += 1;
        accepted() > start + own
    });
    assert_eq!(server.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    await_cond("leasing again once it is a primary", || {
        l.acquire("k4", 1).unwrap().reason == Reason::Lease
    });
}
