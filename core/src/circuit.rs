//! The backend circuit: closed while the authority answers, open after an
//! error, or after silence that lasts two timeouts; while open, callers
//! apply the failure policy and one probe at a time is let through with
//! exponential backoff.
//!
//! An error (refused, reset, a broken reply) says the authority cannot
//! answer: the circuit opens at once. Silence (no reply within
//! `backend_timeout_ms`) may say only that one machine is starved: on a
//! loaded host a healthy Redis's reply, or the client's own timer, comes
//! late now and then. Opening the circuit on that admits by the failure
//! policy on top of what the authority grants (issue 22: 1.02x to 1.07x
//! under a CPU hog). So a timeout opens it only when the authority is still
//! silent a timeout later, with no answer between; the call that timed out
//! is failed all the same (its caller gets a `pending` denial).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// First probe delay after the circuit opens, and the cap of the backoff.
const BACKOFF_MIN_MS: u64 = 50;
const BACKOFF_MAX_MS: u64 = 1_000;
/// A probe outstanding this long is presumed lost and another may go out.
const PROBE_STALE_MS: u64 = 2_000;

pub(crate) struct Circuit {
    open: AtomicBool,
    probing: AtomicBool,
    probe_since: AtomicU64,
    next_probe: AtomicU64,
    backoff: AtomicU64,
    /// Clock reading of the last failure: the answers of one failed round
    /// trip arrive at one instant and count as one failure.
    last_failure: AtomicU64,
    /// Clock reading when the circuit last opened.
    opened_at: AtomicU64,
    /// Clock reading of the first timeout since the last answer (`NONE`: none).
    silent_since: AtomicU64,
    /// How long silence must last, from that first timeout, to open the
    /// circuit: `backend_timeout_ms`, so a second round trip went unanswered.
    silence_ms: u64,
}

const NONE: u64 = u64::MAX;

/// A change of state the caller must report (log, metric, event).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    Opened,
    Closed,
}

impl Circuit {
    /// A closed circuit; `silence_ms`: see [`Circuit::on_failure`].
    pub fn new(silence_ms: u64) -> Self {
        Circuit {
            open: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            probe_since: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            backoff: AtomicU64::new(BACKOFF_MIN_MS),
            last_failure: AtomicU64::new(u64::MAX),
            opened_at: AtomicU64::new(0),
            silent_since: AtomicU64::new(NONE),
            silence_ms,
        }
    }

    #[inline]
    pub fn is_open(&self) -> bool {
        self.open.load(Relaxed)
    }

    /// Milliseconds until the next probe may go out (0 when closed or due).
    pub fn ms_to_probe(&self, now: u64) -> u64 {
        if !self.is_open() {
            return 0;
        }
        self.next_probe.load(Relaxed).saturating_sub(now)
    }

    /// While open: true for exactly one caller once the backoff has passed.
    pub fn take_probe(&self, now: u64) -> bool {
        if !self.is_open() || now < self.next_probe.load(Relaxed) {
            return false;
        }
        if !self.probing.swap(true, AcqRel) {
            self.probe_since.store(now, Relaxed);
            return true;
        }
        // A probe that never reported back (its key already had a request in
        // flight, or the request was lost) must not stop probing for good.
        if now.saturating_sub(self.probe_since.load(Relaxed)) >= PROBE_STALE_MS {
            self.probe_since.store(now, Relaxed);
            return true;
        }
        false
    }

    /// Clock reading when the circuit last opened.
    pub fn opened_at(&self) -> u64 {
        self.opened_at.load(Relaxed)
    }

    pub fn on_success(&self) -> Option<Transition> {
        self.silent_since.store(NONE, Relaxed);
        self.probing.store(false, Release);
        self.backoff.store(BACKOFF_MIN_MS, Relaxed);
        self.open.swap(false, AcqRel).then_some(Transition::Closed)
    }

    /// A call failed: by an error (`silent` false), or by no reply within
    /// the timeout. A closed circuit opens on an error, or on a timeout
    /// `silence_ms` or more after the first timeout since the last answer;
    /// earlier timeouts (the other calls of the same round trip among them)
    /// leave it closed.
    pub fn on_failure(&self, now: u64, silent: bool) -> Option<Transition> {
        if silent && !self.is_open() {
            let first = match self.silent_since.compare_exchange(NONE, now, AcqRel, Acquire) {
                Ok(_) => now,
                Err(first) => first,
            };
            if now < first.saturating_add(self.silence_ms) {
                return None;
            }
        }
        if self.last_failure.swap(now, AcqRel) == now && self.is_open() {
            return None;
        }
        let backoff = self.backoff.load(Relaxed);
        self.next_probe.store(now + backoff, Relaxed);
        self.backoff.store((backoff * 2).min(BACKOFF_MAX_MS), Relaxed);
        self.probing.store(false, Release);
        if self.is_open() {
            return None;
        }
        self.opened_at.store(now, Relaxed);
        (!self.open.swap(true, AcqRel)).then_some(Transition::Opened)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_probes_with_backoff_and_closes() {
        let c = Circuit::new(250);
        assert!(!c.take_probe(0));
        assert_eq!(c.on_failure(100, false), Some(Transition::Opened));
        // the other answers of the same failed round trip change nothing
        assert_eq!(c.on_failure(100, false), None);
        assert_eq!(c.ms_to_probe(100), 50);
        // a later failure doubles the backoff: next probe at 101 + 100
        assert_eq!(c.on_failure(101, true), None);
        assert!(!c.take_probe(200));
        assert!(c.take_probe(201));
        assert!(!c.take_probe(200), "only one probe at a time");
        assert_eq!(c.on_failure(201, false), None);
        assert_eq!(c.ms_to_probe(201), 200);
        assert!(c.take_probe(401));
        assert_eq!(c.on_success(), Some(Transition::Closed));
        assert!(!c.is_open());
        assert_eq!(c.on_success(), None);
    }

    #[test]
    fn silence_opens_only_when_it_lasts_a_timeout_more() {
        let c = Circuit::new(250);
        // a round trip's timeouts, spread over a few ms: still closed
        for now in [1_000, 1_000, 1_003, 1_249] {
            assert_eq!(c.on_failure(now, true), None, "at {now}");
        }
        // an answer in between starts the count again
        assert_eq!(c.on_success(), None);
        assert_eq!(c.on_failure(1_260, true), None);
        assert_eq!(c.on_failure(1_500, true), None);
        // the next round trip, a timeout after the first, also unanswered
        assert_eq!(c.on_failure(1_510, true), Some(Transition::Opened));
        assert_eq!(c.opened_at(), 1_510);
        assert_eq!(c.on_success(), Some(Transition::Closed));
        // an error opens at once, silence or not before it
        assert_eq!(c.on_failure(2_000, true), None);
        assert_eq!(c.on_failure(2_001, false), Some(Transition::Opened));
    }
}
