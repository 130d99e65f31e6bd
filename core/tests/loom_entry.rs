//! A loom model of one key's local lease: the token / in-flight / retired
//! protocol of `Entry` (issue 13, item 7). Run it with `make loom`
//! (`RUSTFLAGS="--cfg loom" cargo test --release --test loom_entry`): loom
//! runs each scenario under every interleaving of its threads, and every
//! value each atomic load may return under the C11 memory model.
//!
//! The engine uses std's atomics, so this is a model that mirrors the
//! protocol with loom's types, statement for statement, with the real
//! memory orderings; each function names the code it mirrors:
//!
//! - [`Model::try_take`]: `Entry::try_take` (core/src/engine/entry.rs), the
//!   admit path's compare-and-swap loop;
//! - [`Model::claim`]: the `in_flight.swap(true, AcqRel)` that opens
//!   `Engine::start_lease` (core/src/engine/grants.rs). Its stale-request
//!   escape (a call in flight for `backend_timeout_ms` x 4 + 1 s is taken
//!   for lost, with the system clock only) is left out: it trades the
//!   property below for liveness, by design;
//! - [`Model::answer`]: `Engine::lease_done` then `Engine::apply_grant`
//!   (grants.rs): tokens added, the retired check that gives them back, then
//!   `in_flight.store(false, Release)`;
//! - [`Model::retire`]: `Engine::retire` (core/src/engine/table.rs), what
//!   eviction and the idle sweep do to an entry that leaves the table;
//! - [`Model::expire`]: `Engine::expire_if_idle` (table.rs), the lease TTL;
//! - a waiter's `lease_landed` (core/src/engine/cold.rs): `in_flight`
//!   read with Acquire.
//!
//! The properties, checked in every execution: tokens are conserved (the
//! authority's bucket + what the entry holds + what callers spent is what
//! there was: none spent twice, none created, none lost, and a u64 that
//! went "negative" would break it), a retired entry ends with no tokens (a
//! grant that landed on it went back), a give-back never happens twice
//! (conservation again), never two lease calls in flight for one key, and a
//! caller that saw its lease land sees its tokens. Each property is shown
//! to fail when the protocol is weakened where it matters (the
//! `should_panic` tests): the model can fail.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::*};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// The protocol's choices that the properties rest on; [`REAL`] is the engine's.
#[derive(Clone, Copy, Debug)]
struct Protocol {
    /// How `start_lease` claims the key: one swap, or (weakened) a load then a store.
    claim_by_swap: bool,
    /// Ordering of `tokens.swap(0)` in `retire`.
    retire_swap: Ordering,
    /// Ordering of `tokens.fetch_add(granted)` in `apply_grant`.
    grant_add: Ordering,
    /// Ordering of `in_flight.store(false)` at the end of `lease_done`.
    landed: Ordering,
}

const REAL: Protocol = Protocol {
    claim_by_swap: true,
    retire_swap: AcqRel,
    grant_add: AcqRel,
    landed: Release,
};

/// One key: its entry, the authority's bucket for it, and the books.
struct Model {
    p: Protocol,
    // Entry's fields the protocol touches.
    tokens: AtomicU64,
    in_flight: AtomicBool,
    retired: AtomicBool,
    /// The authoritative bucket: each call on it is atomic (one Lua script
    /// in Redis, a lock in the memory authority).
    bucket: Mutex<u64>,
    /// Tokens callers spent.
    spent: AtomicU64,
    /// Lease calls between their claim and their answer's end.
    calls: AtomicU64,
}

impl Model {
    fn new(p: Protocol, bucket: u64, held: u64) -> Arc<Model> {
        Arc::new(Model {
            p,
            tokens: AtomicU64::new(held),
            in_flight: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            bucket: Mutex::new(bucket),
            spent: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        })
    }

    /// `Entry::try_take`.
    fn try_take(&self, cost: u64) -> Option<u64> {
        let mut cur = self.tokens.load(Relaxed);
        loop {
            if cur < cost {
                return None;
            }
            match self.tokens.compare_exchange_weak(cur, cur - cost, AcqRel, Relaxed) {
                Ok(_) => {
                    self.spent.fetch_add(cost, Relaxed);
                    return Some(cur - cost);
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// The claim that opens `start_lease`: true when this caller sends the call.
    fn claim(&self) -> bool {
        let won = if self.p.claim_by_swap {
            !self.in_flight.swap(true, AcqRel)
        } else {
            !self.in_flight.load(Acquire) && {
                self.in_flight.store(true, Release);
                true
            }
        };
        if won {
            let before = self.calls.fetch_add(1, AcqRel);
            assert_eq!(before, 0, "two lease calls in flight for one key");
        }
        won
    }

    /// The authority grants up to `want`; `lease_done` applies the grant
    /// (`apply_grant`) and clears `in_flight`.
    fn answer(&self, want: u64) {
        let granted = {
            let mut b = self.bucket.lock().unwrap();
            let g = want.min(*b);
            *b -= g;
            g
        };
        if granted > 0 {
            self.tokens.fetch_add(granted, self.p.grant_add);
            if self.retired.load(Acquire) {
                let back = self.tokens.swap(0, AcqRel);
                self.give_back(back);
            }
        }
        self.calls.fetch_sub(1, AcqRel);
        self.in_flight.store(false, self.p.landed);
    }

    /// `Engine::retire`.
    fn retire(&self) {
        self.retired.store(true, Release);
        let t = self.tokens.swap(0, self.p.retire_swap);
        self.give_back(t);
    }

    /// `Engine::expire_if_idle` (the idle test passed).
    fn expire(&self) {
        let t = self.tokens.swap(0, AcqRel);
        self.give_back(t);
    }

    /// `Engine::give_back`: the authority takes the tokens back.
    fn give_back(&self, t: u64) {
        if t > 0 {
            *self.bucket.lock().unwrap() += t;
        }
    }

    /// A waiter's `lease_landed`, read once (the model's waiters do not
    /// spin: a waiter that finds the call still out gives up, as one whose
    /// deadline passed does; loom explores every value the read may return).
    fn landed(&self) -> bool {
        !self.in_flight.load(Acquire)
    }

    /// What every execution ends with: nothing created, lost or spent twice.
    fn check_books(&self, total: u64) {
        let bucket = *self.bucket.lock().unwrap();
        let held = self.tokens.load(Acquire);
        let spent = self.spent.load(Acquire);
        assert_eq!(
            bucket + held + spent,
            total,
            "tokens not conserved: bucket {bucket} + held {held} + spent {spent} != {total}"
        );
        if self.retired.load(Acquire) {
            assert_eq!(held, 0, "{held} tokens stranded on a retired entry");
        }
        assert_eq!(self.calls.load(Acquire), 0);
    }
}

/// Two callers on a key with no local tokens: each spends a token, or
/// claims the lease call and answers it inline (the memory authority), or
/// finds the other's call out and tries again once it has landed (else
/// gives up). Never two calls in flight; tokens conserved.
fn callers_share_one_lease_call(p: Protocol) {
    loom::model(move || {
        let m = Model::new(p, 3, 0);
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || {
                    for _ in 0..2 {
                        if m.try_take(1).is_some() {
                            return;
                        }
                        if m.claim() {
                            m.answer(2);
                        } else if !m.landed() {
                            return;
                        }
                    }
                })
            })
            .collect();
        for t in callers {
            t.join().unwrap();
        }
        m.check_books(3);
    });
}

#[test]
fn never_two_lease_calls_in_flight() {
    callers_share_one_lease_call(REAL);
}

#[test]
#[should_panic(expected = "two lease calls in flight")]
fn a_claim_by_load_then_store_sends_two_calls() {
    callers_share_one_lease_call(Protocol {
        claim_by_swap: false,
        ..REAL
    });
}

/// A lease call is in flight (its answer comes from the broker thread)
/// when the entry is evicted; a caller holding the entry keeps spending.
/// Whatever the order, the grant that lands on the retired entry goes back
/// exactly once and nothing is stranded or spent twice.
fn grant_lands_on_a_retired_entry(p: Protocol) {
    loom::model(move || {
        let m = Model::new(p, 4, 1);
        assert!(m.claim());
        let broker = {
            let m = m.clone();
            thread::spawn(move || m.answer(3))
        };
        let evictor = {
            let m = m.clone();
            thread::spawn(move || m.retire())
        };
        let caller = {
            let m = m.clone();
            thread::spawn(move || {
                m.try_take(2);
            })
        };
        broker.join().unwrap();
        evictor.join().unwrap();
        caller.join().unwrap();
        m.check_books(5);
    });
}

#[test]
fn a_grant_on_a_retired_entry_goes_back_once() {
    grant_lands_on_a_retired_entry(REAL);
}

#[test]
#[should_panic(expected = "stranded on a retired entry")]
fn a_relaxed_retire_strands_a_grant() {
    grant_lands_on_a_retired_entry(Protocol {
        retire_swap: Relaxed,
        ..REAL
    });
}

#[test]
#[should_panic(expected = "stranded on a retired entry")]
fn a_relaxed_grant_is_stranded() {
    grant_lands_on_a_retired_entry(Protocol {
        grant_add: Relaxed,
        ..REAL
    });
}

/// The lease TTL gives a key's tokens back while a grant lands from the
/// broker and a caller spends: what the sweep takes goes back once, what
/// lands after it stays for the caller, nothing is spent twice.
#[test]
fn the_lease_ttl_races_a_landing_grant() {
    loom::model(|| {
        let m = Model::new(REAL, 3, 1);
        assert!(m.claim());
        let broker = {
            let m = m.clone();
            thread::spawn(move || m.answer(2))
        };
        let sweeper = {
            let m = m.clone();
            thread::spawn(move || m.expire())
        };
        m.try_take(2);
        broker.join().unwrap();
        sweeper.join().unwrap();
        m.check_books(4);
    });
}

/// Three callers spend from one lease at once with different costs: each
/// take succeeds only with tokens there, none is spent twice, and what is
/// left is what was not spent.
#[test]
fn the_admit_path_never_spends_a_token_twice() {
    loom::model(|| {
        let m = Model::new(REAL, 0, 4);
        let got: Vec<_> = [1u64, 2, 3]
            .into_iter()
            .map(|cost| {
                let m = m.clone();
                thread::spawn(move || m.try_take(cost).map(|left| (cost, left)))
            })
            .collect();
        let taken: Vec<(u64, u64)> = got.into_iter().filter_map(|t| t.join().unwrap()).collect();
        let spent: u64 = taken.iter().map(|(c, _)| c).sum();
        assert!(spent <= 4, "{taken:?}");
        assert!(!taken.is_empty(), "4 tokens and no take succeeded");
        assert_eq!(m.tokens.load(Acquire), 4 - spent);
        m.check_books(4);
    });
}

/// A caller claims the call, the broker answers it on its own thread, and
/// the caller looks whether `in_flight` has cleared: when it has, the
/// granted tokens are there for it (the answer's add happens before the
/// clear it saw).
fn waiter_sees_its_lease(p: Protocol) {
    loom::model(move || {
        let m = Model::new(p, 2, 0);
        assert!(m.try_take(1).is_none());
        assert!(m.claim());
        let broker = {
            let m = m.clone();
            thread::spawn(move || m.answer(2))
        };
        if m.landed() {
            assert!(m.try_take(1).is_some(), "the lease landed but its tokens are not seen");
        }
        broker.join().unwrap();
        m.check_books(2);
    });
}

#[test]
fn a_waiter_sees_the_tokens_of_the_lease_that_landed() {
    waiter_sees_its_lease(REAL);
}

#[test]
#[should_panic(expected = "its tokens are not seen")]
fn a_relaxed_clear_hides_the_tokens() {
    waiter_sees_its_lease(Protocol {
        landed: Relaxed,
        ..REAL
    });
}
