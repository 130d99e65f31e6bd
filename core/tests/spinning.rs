//! Callers spinning `acquire()` with no pause on every core cannot keep the
//! limiter from recovering (issue 13, item 4): as many caller threads as the
//! machine has cores spin on a Redis-backed limiter while the path to a real
//! redis-server is black-holed, reset, or the server is killed and restarted
//! empty. After each fault heals, the circuit must close again
//! (`fallback_active == 0`) and callers must get `lease` decisions again, and
//! `inspect()` must answer throughout (a result or a typed error, never a
//! hang).
//!
//! Recovery is awaited as a condition under a 30 s hang guard, never a timing
//! threshold; the measured time from the heal to recovery is printed (run
//! with `--nocapture`; the record is in docs/reliability.md).
//!
//! What it catches: with the broker's one worker thread made to stall after
//! a failed batch (an experiment, not kept), `inspect()` during the black
//! hole times out after 5 s and the test fails with "gave up waiting for:
//! black hole: every circuit closes and leases again". On the code as it is,
//! no stall was found: spinning callers do not starve the broker.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{unique, FaultProxy, RedisServer};
use quotalease::{Error, Limiter, Reason};

/// Decisions the spinning callers saw, by reason (`Reason as usize`).
struct Seen {
    by_reason: [AtomicU64; Reason::ALL.len()],
    errors: AtomicU64,
}

impl Seen {
    fn lease(&self) -> u64 {
        self.by_reason[Reason::Lease as usize].load(Relaxed)
    }
    fn fallback(&self) -> u64 {
        self.by_reason[Reason::Fallback as usize].load(Relaxed)
    }
}

/// Wait for `cond` under a 30 s hang guard; how long it took.
fn awaited(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(30), "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    t.elapsed()
}

/// `inspect()` answers: a result, or a typed backend error while the fault
/// lasts (its own bound is 5 x max(backend_timeout_ms, 1 s)).
fn inspect_answers(l: &Limiter, healthy: bool, when: &str) -> Duration {
    let t = Instant::now();
    let r = l.inspect("hot");
    let took = t.elapsed();
    match r {
        Ok(i) => assert_eq!(i.limit, 1_000, "{when}: {i:?}"),
        Err(Error::Backend(e)) if !healthy => eprintln!("  inspect {when}: backend error ({e}) after {took:?}"),
        Err(e) => panic!("inspect {when}: {e}"),
    }
    // A hang guard: the bound inspect sets itself, plus slack for a starved
    // caller; not a timing assertion.
    assert!(took < Duration::from_secs(30), "inspect {when} took {took:?}");
    took
}

#[test]
fn spinning_callers_on_every_core_do_not_stop_recovery() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server = common::redis_or_skip!(RedisServer::start());
    let proxy = FaultProxy::start(server.port);
    let prefix = unique("spin");
    let build = |lease_size: Option<u64>| {
        // one prefix each: every limiter of a key must agree on lease_size
        let b = Limiter::builder()
            .url(proxy.url())
            .key_prefix(format!("{prefix}{}", lease_size.is_some() as u8))
            .limit(1_000)
            .window_ms(1_000)
            .backend_timeout_ms(100);
        Arc::new(
            match lease_size {
                Some(n) => b.lease_size(n),
                None => b,
            }
            .build()
            .unwrap(),
        )
    };
    // Adaptive leasing (the default) and fixed leases, on one broker.
    let limiters = [("adaptive", build(None)), ("fixed lease 20", build(Some(20)))];
    let seen: Arc<Vec<Seen>> = Arc::new(
        (0..limiters.len())
            .map(|_| Seen {
                by_reason: Default::default(),
                errors: AtomicU64::new(0),
            })
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    // Each caller spins over both limiters: one hot key shared by all and a
    // rotating set of its own keys, so some keys always need the authority
    // (and the circuit's probe).
    let callers: Vec<_> = (0..cores)
        .map(|c| {
            let ls: Vec<Arc<Limiter>> = limiters.iter().map(|(_, l)| l.clone()).collect();
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let own: Vec<String> = (0..64).map(|k| format!("c{c}-{k}")).collect();
                let mut i = 0usize;
                while !stop.load(Relaxed) {
                    let n = i % ls.len();
                    let j = i / ls.len();
                    let key = if j % 2 == 0 {
                        "hot"
                    } else {
                        own[(j / 2) % own.len()].as_str()
                    };
                    i += 1;
                    match ls[n].acquire(key, 1) {
                        Ok(d) => seen[n].by_reason[d.reason as usize].fetch_add(1, Relaxed),
                        Err(_) => seen[n].errors.fetch_add(1, Relaxed),
                    };
                }
            })
        })
        .collect();
    eprintln!("{cores} callers spinning acquire() with no pause");

    let all = |f: &dyn Fn(usize, &Limiter) -> bool| limiters.iter().enumerate().all(|(n, (_, l))| f(n, l));
    awaited("lease decisions before any fault", || {
        all(&|n, _| seen[n].lease() > 1_000)
    });
    for (name, l) in &limiters {
        let took = inspect_answers(l, true, "before the faults");
        eprintln!("  {name}: inspect answered in {took:?} with every core spinning");
    }

    type Fault<'a> = (&'a str, Box<dyn Fn() + 'a>, Box<dyn Fn() + 'a>);
    let faults: Vec<Fault> = vec![
        (
            "black hole",
            Box::new(|| proxy.set("drop")),
            Box::new(|| proxy.set("pass")),
        ),
        (
            "connection resets",
            Box::new(|| proxy.set("reset")),
            Box::new(|| proxy.set("pass")),
        ),
        (
            "redis killed, restarted empty",
            Box::new(|| server.kill()),
            Box::new(|| server.restart()),
        ),
    ];
    for (fault, break_it, heal) in &faults {
        let fallback_before: Vec<u64> = seen.iter().map(Seen::fallback).collect();
        let t = Instant::now();
        break_it();
        awaited(&format!("{fault}: every circuit opens"), || {
            all(&|_, l| l.metrics().fallback_active == 1)
        });
        let degraded = t.elapsed();
        awaited(&format!("{fault}: fallback decisions"), || {
            all(&|n, _| seen[n].fallback() > fallback_before[n])
        });
        for (_, l) in &limiters {
            inspect_answers(l, false, &format!("during {fault}"));
        }
        heal();
        // From the moment the heal command has returned (the server answers).
        let healed = Instant::now();
        let lease_at_heal: Vec<u64> = seen.iter().map(Seen::lease).collect();
        let mut closed = vec![None; limiters.len()];
        let mut leasing = vec![None; limiters.len()];
        awaited(&format!("{fault}: every circuit closes and leases again"), || {
            for (n, (_, l)) in limiters.iter().enumerate() {
                if closed[n].is_none() && l.metrics().fallback_active == 0 {
                    closed[n] = Some(healed.elapsed());
                }
                if closed[n].is_some() && leasing[n].is_none() && seen[n].lease() > lease_at_heal[n] {
                    leasing[n] = Some(healed.elapsed());
                }
            }
            leasing.iter().all(Option::is_some)
        });
        for (n, (name, l)) in limiters.iter().enumerate() {
            let took = inspect_answers(l, true, &format!("after {fault}"));
            eprintln!(
                "  {fault}, {name}: every circuit open {} ms after the fault; after the heal, \
                 circuit closed in {} ms, lease decisions in {} ms; inspect answered in {} ms",
                degraded.as_millis(),
                closed[n].unwrap().as_millis(),
                leasing[n].unwrap().as_millis(),
                took.as_millis()
            );
        }
    }

    stop.store(true, Relaxed);
    for c in callers {
        c.join().unwrap();
    }
    for (n, (name, l)) in limiters.iter().enumerate() {
        let m = l.metrics();
        let counts: Vec<String> = Reason::ALL
            .iter()
            .map(|r| format!("{} {}", r.as_str(), seen[n].by_reason[*r as usize].load(Relaxed)))
            .collect();
        eprintln!("{name}: decisions {}; {m:?}", counts.join(", "));
        assert_eq!(
            seen[n].errors.load(Relaxed),
            0,
            "{name}: acquire never errors under faults"
        );
        assert_eq!(m.fallback_active, 0, "{name}");
        assert!(m.fallback_transitions >= 2 * faults.len() as u64, "{name}: {m:?}");
        l.close().unwrap();
    }
}
