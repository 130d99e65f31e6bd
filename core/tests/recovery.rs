//! Busy limiters recover by themselves after Redis is killed and restarted
//! empty (the system test's scenario, in one process).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{await_cond, unique, RedisServer};
use quotalease::Limiter;

#[test]
fn busy_limiters_recover_after_kill_and_restart() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("rc");
    let limiters: Vec<Arc<Limiter>> = (0..3)
        .map(|_| {
            Arc::new(
                Limiter::builder()
                    .url(server.url())
                    .key_prefix(&p)
                    .limit(2000)
                    .window_ms(1000)
                    .lease_size(20)
                    .expected_replicas(3)
                    .backend_timeout_ms(200)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = limiters
        .iter()
        .map(|l| {
            let (l, stop) = (l.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = if i % 2 == 0 { "hot" } else { "warm" };
                    l.acquire(key, 1).unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    server.kill();
    await_cond("every limiter degraded", || {
        limiters.iter().all(|l| l.metrics().fallback_active == 1)
    });
    std::thread::sleep(Duration::from_millis(1500));
    server.restart();
    await_cond("every limiter recovered", || {
        limiters.iter().all(|l| l.metrics().fallback_active == 0)
    });
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
}

/// A connection the server closed between two calls (a restart here;
/// Redis' `timeout` on an idle client, a proxy or `CLIENT KILL` close it
/// the same way) costs no failed call: the next batch finds it closed
/// before writing anything and goes out on a new one. Before, that batch
/// failed unwritten ("broken pipe"): the circuit opened, the request was
/// denied by the failure policy, and a rate that had run on was paused
/// (after a restart empty, the learning authority then gave its holder
/// nothing for `learn_ms`). (A restart rather than `CLIENT KILL`: the
/// connection task sees the close while the server starts again, not
/// within a millisecond of it.)
#[test]
fn a_connection_closed_between_calls_costs_no_failed_call() {
    let server = common::redis_or_skip!(RedisServer::start());
    let l = Limiter::builder()
        .url(server.url())
        .key_prefix(unique("closed"))
        .limit(100)
        .window_ms(1000)
        .build()
        .unwrap();
    assert!(l.acquire("before", 1).unwrap().allowed);
    server.restart();
    // a key not seen yet: its first request waits for a lease call
    let d = l.acquire("after", 1).unwrap();
    let m = l.metrics();
    assert!(d.allowed, "{d:?}");
    assert_eq!(
        (m.backend_errors, m.fallback_active),
        (0, 0),
        "the call after the restart failed"
    );
}
