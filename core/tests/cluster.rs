//! `redis+cluster://` end to end on a real local 3-master Redis Cluster:
//! keys spread over slots, hash tags keep each key's scripts on one slot,
//! and a master's failover (a replica promoted) is survived.

mod common;

use common::{await_cond, unique, RedisCluster};
use quotalease::{Limiter, Reason};

#[test]
fn cluster_spreads_keys_and_survives_failover() {
    let cluster = RedisCluster::start();
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
