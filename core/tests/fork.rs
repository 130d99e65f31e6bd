//! A limiter used in a process forked after it was created: the child drops
//! the parent's leased tokens and builds its own runtime and connection.

mod common;

use common::{stored_tokens, unique, RedisServer};
use quotalease::Limiter;

#[test]
fn forked_child_drops_inherited_leases_and_works() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("fk");
    let l = Limiter::builder()
        .url(server.url())
        .key_prefix(&p)
        .limit(100)
        .window_ms(3_600_000)
        .lease_size(10)
        .refill_threshold(0) // no prefetch: every backend call below is counted
        .build()
        .unwrap();
    assert!(l.acquire("k", 1).unwrap().allowed); // parent holds 9, Redis 90
    let stored = |s: &RedisServer| -> u64 { stored_tokens(&s.cli(&["GET", &format!("{p}:{{k}}")])) };
    assert_eq!(stored(&server), 90);
    // SAFETY: the child only runs the limiter and exits with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let expired_before = l.metrics().tokens_expired;
            let d = l.acquire("k", 1).unwrap();
            let m = l.metrics();
            // The parent's 9 tokens were dropped, a fresh lease of 10 was taken.
            let ok = d.allowed && m.tokens_expired == expired_before + 9 && m.overshoot_bound == 9;
            l.close().unwrap();
            ok
        }));
        unsafe { libc::_exit(if matches!(code, Ok(true)) { 0 } else { 1 }) };
    }
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status}"
    );
    // The child leased 10 and gave 9 back at close: 90 - 10 + 9 = 89.
    assert_eq!(stored(&server), 89);
    // The parent still holds and spends its own lease.
    for _ in 0..9 {
        let d = l.acquire("k", 1).unwrap();
        assert!(d.allowed && d.reason == quotalease::Reason::Lease);
    }
    assert_eq!(
        l.metrics().backend_calls,
        1,
        "the parent spent its lease without new calls"
    );
}
