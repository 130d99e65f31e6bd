//! `redis+cluster://` end to end on a real local 3-master Redis Cluster:
//! keys spread over slots, hash tags keep each key's scripts on one slot,
//! and a master's failover (a replica promoted) is survived.

mod common;

use common::{await_cond, stored_tokens, unique, RedisCluster};
use quotalease::{Limiter, Reason};

#[test]
fn cluster_spreads_keys_and_survives_failover() {
    let cluster = common::redis_or_skip!(RedisCluster::start());
    let p = unique("c");
    let l = Limiter::builder()
        .url(cluster.url())
        .key_prefix(&p)
        .limit(1000)
        .window_ms(60_000)
        .lease_size(10)
        .lease_ttl_ms(60_000)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..60).map(|i| format!("tenant-{i}")).collect();
    for k in &keys {
        let d = l.acquire(k, 1).unwrap();
        assert!(d.allowed && d.reason == Reason::Lease, "{k}: {d:?}");
    }
    // Every master holds some of the buckets, each key in its hash-tag slot.
    for &m in cluster.masters() {
        let n: u64 = cluster.cli(m, &["DBSIZE"]).parse().unwrap();
        assert!(n > 0, "master {m} holds no bucket");
    }
    for k in keys.iter().take(5) {
        let slot_of_key = cluster.cli(cluster.ports[0], &["CLUSTER", "KEYSLOT", &format!("{p}:{{{k}}}")]);
        let slot_of_tag = cluster.cli(cluster.ports[0], &["CLUSTER", "KEYSLOT", k]);
        assert_eq!(slot_of_key, slot_of_tag);
    }
    let before = l.metrics().backend_calls;
    // Promote a replica of the first master; the limiter follows the MOVED
    // redirections and keeps leasing on every key.
    cluster.failover(cluster.masters()[0]);
    await_cond("every key leasing again after the failover", || {
        keys.iter().all(|k| {
            // cost 10 forces a lease request for every key
            let d = l.acquire(k, 10).unwrap();
            d.reason == Reason::Lease
        })
    });
    assert!(l.metrics().backend_calls > before);
    l.close().unwrap();
}

/// Scripts load per node: a batch spanning nodes where some have the script
/// cached and some answer NOSCRIPT must run every call exactly once. With a
/// manual clock nothing refills, so Redis' books must match the limiter's.
#[test]
fn mixed_noscript_batches_run_every_call_once() {
    let cluster = common::redis_or_skip!(RedisCluster::start());
    let p = unique("ns");
    let l = Limiter::builder()
        .url(cluster.url())
        .key_prefix(&p)
        .limit(100)
        .window_ms(60_000)
        .lease_size(10)
        .clock(quotalease::ClockKind::Manual { start_ms: 1_000_000 })
        .build()
        .unwrap();
    // The lease script gets cached on k0's node only.
    assert_eq!(l.try_acquire("k0", 1).unwrap().reason, Reason::Pending);
    l.settle().unwrap();
    // One batch of lease requests over every node (try_acquire never waits).
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for k in &keys {
        l.try_acquire(k, 1).unwrap();
    }
    l.settle().unwrap();
    // Give-backs (a script no node has yet) in one batch with new leases.
    l.flush().unwrap();
    for k in &keys {
        l.try_acquire(k, 1).unwrap();
    }
    l.settle().unwrap();
    let m = l.metrics();
    assert_eq!(m.backend_errors, 0, "{m:?}");
    let mut stored = 0u64;
    for k in &keys {
        stored += stored_tokens(&cluster.cli(cluster.ports[0], &["-c", "GET", &format!("{p}:{{{k}}}")]));
    }
    assert_eq!(stored, 40 * 100 - (m.tokens_leased - m.tokens_returned), "{m:?}");
}
